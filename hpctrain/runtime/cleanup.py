"""The per-task reaper: nothing a task started outlives it, whatever Slurm tracks.

With ``ProctrackType=proctrack/cgroup`` Slurm kills every process of a job.
With ``proctrack/linuxproc`` it kills only the processes still descended from
the task; anything that called ``setsid``, double-forked or was re-parented to
PID 1 when its parent died (a leaked data-loader worker) survives, holds GPU
memory and the step's output pipes, and keeps the job COMPLETING.

So every task carries a token, ``HPCTRAIN_TASK_TOKEN=<uuid>``, in its
environment, which every child inherits whatever it does to its session or
parent. A small watcher process, started by the task and detached from it
(own session, re-parented to init, an environment without the token and the
SLURM_* variables, stdio on /dev/null, cwd ``/``), polls the task's PID; when
the task is gone it sends SIGTERM to every process of the same user whose
``/proc/PID/environ`` holds the token (whole process groups at once where a
group holds nothing else), SIGKILLs what is left after a grace period, and
exits. Processes are found by token, never by name.

A watcher started with ``--unmount`` releases a dataset image the task
mounted for its node (``hpctrain.dataset.mount``) instead: once the task and
every task registered in ``--users-dir`` have ended, it stops that squashfuse
(``--daemon-pid``) and unmounts, whatever way the tasks ended. It reaps
nothing (the task's own watcher does).

``/proc/PID/environ`` shows a process's environment *as it was at exec*.
Setting ``os.environ`` later reaches children that exec, but not children
that only fork (data-loader workers). Two answers, both used:

* the batch script starts each task as ``python -m hpctrain.runtime.cleanup
  exec PYTHON ...`` (:func:`python_command`, for submitit's ``python=``), which
  execs the real task with a fresh token already in its environment (and,
  with ``--hold-stop-signals``, Slurm's stop signals held until the task
  listens: ``stop_signals.py``);
* when the task lacks the token at exec (run without that wrapper), the
  watcher also records the task's descendants while it lives and reaps those.

This module imports neither torch nor the rest of hpctrain: the watcher must
start in well under a second.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import psutil

TOKEN_ENV = "HPCTRAIN_TASK_TOKEN"
# A local run's token (runtime/local_run.py): one per submitit local controller, inherited by
# its tasks and their workers. Owned here because the watcher must not carry it (see reaper_environ).
RUN_TOKEN_ENV = "HPCTRAIN_RUN_TOKEN"
POLL_S = 0.5
GRACE_S = 5.0
KILL_WAIT_S = 2.0
RESCAN_S = 0.5
TRACK_EVERY_S = 1.0
MODULE = "hpctrain.runtime.cleanup"
HOLD_OPTION = "--hold-stop-signals"


def new_token() -> str:
    return uuid.uuid4().hex


def python_command(python: str = sys.executable, *, hold_stop_signals: bool = False) -> str:
    """A shell command that runs ``python ARGS...`` with a fresh task token in its exec-time environment.

    Pass it as submitit's ``SlurmExecutor(python=...)``: submitit appends
    ``-u -m submitit.core._submit FOLDER``. ``hold_stop_signals``: the task starts
    with Slurm's stop signals held; only for a task that listens (``stop_signals.listen``).
    """
    hold = [HOLD_OPTION] if hold_stop_signals else []
    return " ".join(shlex.quote(part) for part in (python, "-m", MODULE, "exec", *hold, python))


def ensure_task_token(environ: MutableMapping[str, str] | None = None) -> str:
    """This task's token: the one it was started with, else a new one set in ``environ``."""
    environ = os.environ if environ is None else environ
    if not environ.get(TOKEN_ENV):
        environ[TOKEN_ENV] = new_token()
    return environ[TOKEN_ENV]


def reaper_environ(environ: Mapping[str, str], token: str) -> dict[str, str]:
    """The watcher's environment: never its own target, never taken for part of the job."""
    own = (TOKEN_ENV, RUN_TOKEN_ENV)
    return {k: v for k, v in environ.items() if k not in own and not k.startswith("SLURM_") and token not in v}


def start_reaper(
    token: str,
    watched_pid: int | None = None,
    *,
    grace_s: float = GRACE_S,
    poll_s: float = POLL_S,
    log_path: str | Path | None = None,
    python: str = sys.executable,
    timeout_s: float = 30.0,
    unmount: str | Path | None = None,
    daemon_pid: int | None = None,
    users_dir: str | Path | None = None,
) -> int:
    """Start the detached watcher for ``watched_pid`` (default: this process); return its PID.

    ``unmount``, ``daemon_pid``, ``users_dir``: release that mount afterwards, and reap nothing
    (see the module docstring).

    Raises ``RuntimeError`` if it did not start: the caller decides whether a
    missing safety net is worth failing the task for.
    """
    watched_pid = os.getpid() if watched_pid is None else watched_pid
    command = [python, "-m", MODULE, "watch", "--token", token, "--pid", str(watched_pid)]
    command += ["--grace-s", str(grace_s), "--poll-s", str(poll_s), "--detach"]
    if log_path is not None:
        command += ["--log", str(Path(log_path).absolute())]
    if unmount is not None:
        command += ["--unmount", str(Path(unmount).absolute())]
        command += ["--daemon-pid", str(daemon_pid)] if daemon_pid is not None else []
        command += ["--users-dir", str(Path(users_dir).absolute())] if users_dir is not None else []
    proc = subprocess.Popen(
        command,
        env=reaper_environ(os.environ, token),
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"the cleanup watcher did not start within {timeout_s:.0f} s") from None
    if proc.returncode != 0 or not out.strip().isdigit():
        raise RuntimeError(f"the cleanup watcher did not start (exit {proc.returncode}): {err.strip() or out.strip()}")
    return int(out.strip())


def find_token_processes(
    token: str,
    *,
    exclude_pids: Iterable[int] = (),
    forked_from: Mapping[str, str] | None = None,
    created_after: float = 0.0,
    env_var: str = TOKEN_ENV,
) -> list[psutil.Process]:
    """Live processes of this user whose exec-time environment holds ``token`` (in ``env_var``).

    With ``forked_from`` (the exec-time environment of a task started without
    the token), also those whose environment is exactly that one and that
    started after ``created_after``: children the task forked without exec.
    """
    import psutil

    excluded = set(exclude_pids) | _self_and_ancestors()
    uid = os.getuid()
    found = []
    for proc in psutil.process_iter(["uids", "create_time"]):
        try:
            if proc.pid in excluded or proc.info["uids"] is None or proc.info["uids"].real != uid:
                continue
            environ = proc.environ()
            forked = forked_from is not None and proc.info["create_time"] >= created_after and environ == forked_from
            if (forked or environ.get(env_var) == token) and _alive(proc):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_token_processes(
    token: str,
    grace_s: float = GRACE_S,
    *,
    extra: Iterable[psutil.Process] = (),
    exclude_pids: Iterable[int] = (),
    forked_from: Mapping[str, str] | None = None,
    created_after: float = 0.0,
    env_var: str = TOKEN_ENV,
    log: _Log | None = None,
) -> list[int]:
    """SIGTERM every process carrying ``token`` (and ``extra``), SIGKILL survivors after ``grace_s``.

    Re-scans while waiting, so a process forked during shutdown is caught too.
    Returns the PIDs it signalled. Never touches this process or its ancestors.
    ``forked_from``/``created_after``/``env_var``: see :func:`find_token_processes`.
    """
    log = log or _Log(None)
    excluded = set(exclude_pids)
    targets: dict[int, psutil.Process] = {}

    def rescan() -> list[psutil.Process]:
        found = find_token_processes(
            token, exclude_pids=excluded, forked_from=forked_from, created_after=created_after, env_var=env_var
        )
        new = [p for p in found if _key(p) not in _keys(targets)]
        new += [p for p in extra if p.pid not in excluded and _alive(p) and _key(p) not in _keys(targets)]
        for proc in new:
            targets[proc.pid] = proc
        return new

    _signal_all(rescan(), signal.SIGTERM, log)
    deadline = time.monotonic() + grace_s
    next_scan = time.monotonic() + RESCAN_S
    while any(_alive(p) for p in targets.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        if time.monotonic() >= next_scan:
            _signal_all(rescan(), signal.SIGTERM, log)
            next_scan = time.monotonic() + RESCAN_S
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        rescan()
        survivors = [p for p in targets.values() if _alive(p)]
        if not survivors:
            break
        _signal_all(survivors, signal.SIGKILL, log)
        time.sleep(0.1)
    left = [p.pid for p in targets.values() if _alive(p)]
    if left:
        log(f"could not end PIDs {left}")
    return sorted(targets)


def watch(token: str, watched_pid: int, *, poll_s: float = POLL_S, grace_s: float = GRACE_S, log: _Log) -> int:
    """Wait for ``watched_pid`` to end, then reap the token's processes. The watcher's main loop."""
    import psutil

    watched: psutil.Process | None
    try:
        watched = psutil.Process(watched_pid)
    except psutil.NoSuchProcess:
        watched = None
    # A task started without the token in its exec-time environment (no `exec`
    # wrapper) passes it only to children that exec. Children it only forks
    # show the task's own exec-time environment instead: look for that, and
    # also remember the task's descendants while it lives.
    forked_from: dict[str, str] | None = None
    created_after = 0.0
    if watched is not None:
        try:
            environ = watched.environ()
            if environ.get(TOKEN_ENV) != token:
                forked_from, created_after = environ, watched.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    descendants: dict[tuple[int, float], psutil.Process] = {}
    next_track = 0.0
    while watched is not None and _alive(watched):
        if forked_from is not None and time.monotonic() >= next_track:
            for child in _children(watched):
                descendants.setdefault(_key(child), child)
            next_track = time.monotonic() + TRACK_EVERY_S
        time.sleep(poll_s)
    log(f"task {watched_pid} ended")
    extra = [p for p in descendants.values() if _alive(p)]
    if not extra and not find_token_processes(token, forked_from=forked_from, created_after=created_after):
        log("nothing left to clean up")
        return 0
    pids = kill_token_processes(
        token, grace_s, extra=extra, forked_from=forked_from, created_after=created_after, log=log
    )
    log(f"ended {len(pids)} leftover process(es): {pids}")
    return 0


def release_mount(
    watched_pid: int, point: str, daemon_pid: int | None, users_dir: str | None, *, poll_s: float, log: _Log
) -> None:
    """Once the task and the mount's other users have ended (see hpctrain.dataset.mount), unmount."""
    import psutil

    from hpctrain.dataset.mount import live_users, release

    try:
        watched = psutil.Process(watched_pid)
        while _alive(watched):
            time.sleep(poll_s)
    except psutil.NoSuchProcess:
        pass
    log(f"task {watched_pid} ended")
    said = False
    while users_dir and (users := live_users(Path(users_dir))):
        if not said:
            log(f"waiting for {len(users)} task(s) still using {point}: {users[:8]}")
            said = True
        time.sleep(poll_s)
    release(Path(point), daemon_pid, log=log)


def exec_with_token(argv: Sequence[str]) -> NoReturn:
    """Replace this process with ``argv``, a fresh task token in its environment; with a leading
    ``--hold-stop-signals``, Slurm's stop signals held (pending) until ``argv`` listens."""
    if argv[:1] == [HOLD_OPTION]:
        from hpctrain.runtime import stop_signals  # standard library only

        stop_signals.hold()
        argv = argv[1:]
    if not argv:
        raise SystemExit(f"usage: python -m {MODULE} exec PROGRAM [ARGS...]")
    env = dict(os.environ)
    env[TOKEN_ENV] = new_token()
    os.execvpe(argv[0], list(argv), env)


class _Log:
    """Timestamped lines to the watcher's log file (stderr), or nowhere."""

    def __init__(self, stream: object | None) -> None:
        self.stream = stream

    def __call__(self, message: str) -> None:
        if self.stream is None:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{stamp} hpctrain-reaper[{os.getpid()}]: {message}", file=self.stream, flush=True)  # type: ignore[call-overload]


def _alive(proc: psutil.Process) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _key(proc: psutil.Process) -> tuple[int, float]:
    try:
        return (proc.pid, proc.create_time())
    except Exception:
        return (proc.pid, 0.0)


def _keys(procs: Mapping[int, psutil.Process]) -> set[tuple[int, float]]:
    return {_key(p) for p in procs.values()}


def _children(proc: psutil.Process) -> list[psutil.Process]:
    import psutil

    try:
        return proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _self_and_ancestors() -> set[int]:
    pids = {0, 1}
    pid = os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _signal_all(procs: Sequence[psutil.Process], signum: int, log: _Log) -> None:
    """Signal ``procs``: by process group where the group holds only ``procs``, else one by one."""
    import psutil

    if not procs:
        return
    wanted = {p.pid for p in procs}
    groups: dict[int, set[int]] = {}
    for pid in wanted:
        try:
            groups.setdefault(os.getpgid(pid), set()).add(pid)
        except OSError:
            continue
    own_group = os.getpgrp()
    done: set[int] = set()
    for pgid, members in groups.items():
        if pgid > 1 and pgid != own_group and _group_members(pgid, psutil) <= wanted:
            try:
                os.killpg(pgid, signum)
                if signum == signal.SIGTERM:
                    os.killpg(pgid, signal.SIGCONT)  # a stopped process must wake to see the SIGTERM
                done |= members
                log(f"{signal.Signals(signum).name} -> process group {pgid} {sorted(members)}")
            except OSError:
                pass
    for proc in procs:
        if proc.pid in done or not _alive(proc):
            continue
        try:
            proc.send_signal(signum)  # psutil checks the PID still names the same process
            if signum == signal.SIGTERM:
                proc.send_signal(signal.SIGCONT)
            log(f"{signal.Signals(signum).name} -> {proc.pid}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass


def _group_members(pgid: int, psutil_module: object) -> set[int]:
    members = set()
    for pid in psutil_module.pids():  # type: ignore[attr-defined]
        try:
            if os.getpgid(pid) == pgid:
                members.add(pid)
        except OSError:
            continue
    return members


def _detach() -> None:
    """Fork: the parent prints the child's PID and exits, so the child is re-parented away from the task."""
    pid = os.fork()
    if pid:
        os.write(1, f"{pid}\n".encode())
        os._exit(0)


def _redirect_stdio(log_path: str | None) -> object | None:
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    stream = None
    if log_path:
        try:
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 2)
            os.close(fd)
            stream = sys.stderr
        except OSError:
            os.dup2(devnull, 2)
    else:
        os.dup2(devnull, 2)
    os.close(devnull)
    return stream


def leave_dataset_mount(keep_copies: bool = True) -> None:
    """This task is done with its job's folder on the node, if it used one (``hpctrain.dataset.node_folder``:
    a packed dataset's mount, a ``data.stage: node`` copy).

    The node's last task unmounts before it exits (once a step's tasks are
    gone, Slurm kills squashfuse with the rest of the step) and, unless
    ``keep_copies`` (a requeue or a failure may come back for them), removes
    the copies: pass False only when the run has ended normally.
    """
    folder = sys.modules.get("hpctrain.dataset.node_folder")  # imported only by a task that staged or mounted
    if folder is not None:
        folder.leave(keep=keep_copies)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["exec"]:  # a task's first Python: nothing before this line
        rest = argv[1:]
        exec_with_token(rest[1:] if rest[:1] == ["--"] else rest)
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("exec", help="run PROGRAM with a fresh task token (exec, same PID)")
    watch_p = sub.add_parser("watch", help="reap the token's processes once PID has ended")
    watch_p.add_argument("--pid", type=int, required=True)
    kill_p = sub.add_parser("kill", help="reap the token's processes now")
    for p in (watch_p, kill_p):
        p.add_argument("--token", required=True)
        p.add_argument("--grace-s", type=float, default=GRACE_S)
        p.add_argument("--log", default=None, help="append what was done to this file")
    watch_p.add_argument("--poll-s", type=float, default=POLL_S)
    watch_p.add_argument("--detach", action="store_true", help="fork, print the watcher's PID, exit")
    watch_p.add_argument("--unmount", default=None, help="then unmount this dataset image mount point")
    watch_p.add_argument("--daemon-pid", type=int, default=None, help="the squashfuse serving --unmount")
    watch_p.add_argument("--users-dir", default=None, help="tasks registered here must end first")
    args = parser.parse_args(argv)
    if args.command == "kill":
        log = _Log(open(args.log, "a") if args.log else sys.stderr)  # noqa: SIM115
        kill_token_processes(args.token, args.grace_s, log=log)
        return 0
    if args.detach:
        _detach()
        log = _Log(_redirect_stdio(args.log))
    else:
        log = _Log(open(args.log, "a") if args.log else None)  # noqa: SIM115
    # Slurm's SIGTERM for the job must not stop the reaper before the task is gone.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    log(f"watching task {args.pid}")
    if args.unmount:
        release_mount(args.pid, args.unmount, args.daemon_pid, args.users_dir, poll_s=args.poll_s, log=log)
        return 0
    return watch(args.token, args.pid, poll_s=args.poll_s, grace_s=args.grace_s, log=log)


if __name__ == "__main__":
    sys.exit(main())

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
exits. Processes are found by token, never by name. Then it removes the
folders the task named when it started the watcher (``--remove-dir``: a torchrun
node task's state folder, :mod:`hpctrain.runtime.node_dirs`), each checked again first.

The same detached start (:func:`start_detached`) serves the watcher that
releases a node's dataset mount after its tasks (``hpctrain.dataset.mount_release``).
The tokens themselves, and finding or ending the processes that carry one, are
the contract's (:mod:`hpctrain.contract.process_tokens`): ``hpctrain cancel``
uses them too.

``/proc/PID/environ`` shows a process's environment *as it was at exec*.
Setting ``os.environ`` later reaches children that exec, but not children
that only fork (data-loader workers). Two answers, both used:

* the batch script starts each task as ``python -m hpctrain.runtime.cleanup
  exec PYTHON ...`` (``jobscript/sbatch_script.py``'s ``python_command``, for
  submitit's ``python=``), which execs the real task with a fresh token already
  in its environment (and, with ``--hold-stop-signals``, Slurm's stop signals
  held until the task listens: ``stop_signals.py``);
* when the task lacks the token at exec (run without that wrapper), the
  watcher also records the task's descendants while it lives and reaps those.

This module imports neither torch nor the rest of hpctrain but the contract's
tokens and node_dirs: the watcher must start in well under a second.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from hpctrain.contract.file_writes import open_append
from hpctrain.contract.process_tokens import (
    GRACE_S,
    HOLD_OPTION,
    REAPER_MODULE,
    TOKEN_ENV,
    alive,
    find_token_processes,
    kill_token_processes,
    owned_token,
    process_key,
    token_environ,
    without_tokens,
)
from hpctrain.runtime.node_dirs import remove_owned

if TYPE_CHECKING:
    import psutil

POLL_S = 0.5
TRACK_EVERY_S = 1.0
MODULE = REAPER_MODULE


def ensure_task_token(environ: MutableMapping[str, str] | None = None, pid: int | None = None) -> str:
    """This task's token: the one the exec wrapper made for this very process, else a new one set in
    ``environ`` (``os.environ``). A token inherited from elsewhere is never adopted: this task's clean-up
    would end every unrelated process that carries it."""
    environ = os.environ if environ is None else environ
    pid = os.getpid() if pid is None else pid
    token = owned_token(environ, pid)
    if token is None:
        environ.update(token_environ({}, pid))
        token = environ[TOKEN_ENV]
    return token


def reaper_environ(environ: Mapping[str, str], token: str) -> dict[str, str]:
    """The watcher's environment: never its own target, never taken for part of the job."""
    return {k: v for k, v in without_tokens(environ).items() if not k.startswith("SLURM_") and token not in v}


def start_reaper(
    token: str,
    watched_pid: int | None = None,
    *,
    grace_s: float = GRACE_S,
    poll_s: float = POLL_S,
    log_path: str | Path | None = None,
    python: str = sys.executable,
    timeout_s: float = 30.0,
    remove_dirs: Sequence[str | Path] = (),
) -> int:
    """Start the detached watcher for ``watched_pid`` (default: this process); return its PID.

    ``remove_dirs``: folders the watcher removes after the task (:func:`node_dirs.remove_owned`'s checks);
    they may not exist yet. Raises ``RuntimeError`` if it did not start: the caller decides whether a
    missing safety net is worth failing the task for.
    """
    watched_pid = os.getpid() if watched_pid is None else watched_pid
    args = ["watch", "--token", token, "--pid", str(watched_pid), "--grace-s", str(grace_s), "--poll-s", str(poll_s)]
    if log_path is not None:
        args += ["--log", str(Path(log_path).absolute())]
    for folder in remove_dirs:
        args += ["--remove-dir", str(folder)]
    return start_detached(MODULE, args, reaper_environ(os.environ, token), python=python, timeout_s=timeout_s)


def start_detached(
    module: str,
    args: Sequence[str],
    environ: Mapping[str, str],
    *,
    python: str = sys.executable,
    timeout_s: float = 30.0,
) -> int:
    """Start ``python -m MODULE ARGS --detach`` (own session, cwd ``/``, stdio closed): a watcher that
    forks away from the caller (:func:`detach`) and prints its PID, which this returns.

    Raises ``RuntimeError`` if it did not start.
    """
    proc = subprocess.Popen(
        [python, "-m", module, *args, "--detach"],
        env=dict(environ),
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


def watch(
    token: str,
    watched_pid: int,
    *,
    poll_s: float = POLL_S,
    grace_s: float = GRACE_S,
    log: WatcherLog,
    remove_dirs: Sequence[str] = (),
) -> int:
    """Wait for ``watched_pid`` to end, reap the token's processes, then remove ``remove_dirs``. The main loop."""
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
    while watched is not None and alive(watched):
        if forked_from is not None and time.monotonic() >= next_track:
            for child in _children(watched):
                descendants.setdefault(process_key(child), child)
            next_track = time.monotonic() + TRACK_EVERY_S
        time.sleep(poll_s)
    log(f"task {watched_pid} ended")
    extra = [p for p in descendants.values() if alive(p)]
    if not extra and not find_token_processes(token, forked_from=forked_from, created_after=created_after):
        log("no process left to clean up")
    else:
        pids = kill_token_processes(
            token, grace_s, extra=extra, forked_from=forked_from, created_after=created_after, log=log
        )
        log(f"ended {len(pids)} leftover process(es): {pids}")
    for folder in remove_dirs:  # after the processes: a worker may still have been writing in it
        log(f"{folder}: {remove_owned(folder)}")
    return 0


def exec_with_token(argv: Sequence[str]) -> NoReturn:
    """Replace this process with ``argv``, a fresh task token in its environment; with a leading
    ``--hold-stop-signals``, Slurm's stop signals held (pending) until ``argv`` listens."""
    if argv[:1] == [HOLD_OPTION]:
        from hpctrain.runtime import stop_signals  # standard library only

        stop_signals.hold()
        argv = argv[1:]
    if not argv:
        raise SystemExit(f"usage: python -m {MODULE} exec PROGRAM [ARGS...]")
    os.execvpe(argv[0], list(argv), token_environ(os.environ, os.getpid()))  # exec keeps the PID


class WatcherLog:
    """Timestamped lines to the watcher's log file (stderr), or nowhere."""

    def __init__(self, stream: object | None) -> None:
        self.stream = stream

    def __call__(self, message: str) -> None:
        if self.stream is None:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{stamp} hpctrain-reaper[{os.getpid()}]: {message}", file=self.stream, flush=True)  # type: ignore[call-overload]


def _children(proc: psutil.Process) -> list[psutil.Process]:
    import psutil

    try:
        return proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def detach() -> None:
    """Fork: the parent prints the child's PID and exits, so the child is re-parented away from the task."""
    pid = os.fork()
    if pid:
        os.write(1, f"{pid}\n".encode())
        os._exit(0)


def redirect_stdio(log_path: str | None) -> object | None:
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    stream = None
    if log_path:
        try:
            fd = open_append(log_path)
            os.dup2(fd, 2)
            os.close(fd)
            stream = sys.stderr
        except OSError:
            os.dup2(devnull, 2)
    else:
        os.dup2(devnull, 2)
    os.close(devnull)
    return stream


def begin_watching(log_path: str | None, *, detached: bool) -> WatcherLog:
    """A watcher's start: away from the task (``detached``: :func:`detach`, stdio closed), deaf to the
    job's signals (Slurm's SIGTERM must not stop it before the task is gone); its log."""
    if detached:
        detach()
        log = WatcherLog(redirect_stdio(log_path))
    else:
        log = WatcherLog(os.fdopen(open_append(log_path), "a") if log_path else None)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    return log


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
    watch_p.add_argument("--remove-dir", action="append", default=[], help="remove this folder after the task")
    watch_p.add_argument("--detach", action="store_true", help="fork, print the watcher's PID, exit")
    args = parser.parse_args(argv)
    if args.command == "kill":
        log = WatcherLog(os.fdopen(open_append(args.log), "a") if args.log else sys.stderr)
        kill_token_processes(args.token, args.grace_s, log=log)
        return 0
    log = begin_watching(args.log, detached=args.detach)
    log(f"watching task {args.pid}")
    return watch(args.token, args.pid, poll_s=args.poll_s, grace_s=args.grace_s, log=log, remove_dirs=args.remove_dir)


if __name__ == "__main__":
    sys.exit(main())

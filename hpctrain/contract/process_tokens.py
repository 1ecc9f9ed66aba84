"""The tokens that mark a run's processes, and finding or ending the processes that carry one.

A token is a fresh uuid in a process's exec-time environment, which every
child inherits whatever it does to its session or parent; ``/proc/PID/environ``
shows it to the process's owner only. Two tokens, both read on both sides:

* ``HPCTRAIN_TASK_TOKEN``: one per task, set by the reaper's exec wrapper
  (``python -m hpctrain.runtime.cleanup exec``, :data:`REAPER_MODULE`); the
  task's watcher ends whatever carries it once the task is gone. A token is
  its owner's only: the wrapper also sets ``HPCTRAIN_TASK_TOKEN_PID`` to the
  PID it execs into, and a task adopts the token it was started with only when
  that PID is its own (:func:`owned_token`). One inherited from elsewhere (a
  shell inside another job, a hostile environment) would make the task's
  clean-up end every unrelated process carrying it;
* ``HPCTRAIN_RUN_TOKEN``: one per local run's controller (``launch/local_run.py``),
  inherited by its tasks and their workers; ``hpctrain cancel`` ends whatever
  carries it after the controller. The controller also carries its run
  directory (``HPCTRAIN_LOCAL_RUN_DIR``), so a copy of ``run.json`` in another
  folder proves nothing about the run.

Processes are found by token, never by name, and only this user's. Both the
login side and the tasks import this, so it imports nothing of the project;
psutil is imported where a process is looked at.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

TOKEN_ENV = "HPCTRAIN_TASK_TOKEN"
TOKEN_PID_ENV = "HPCTRAIN_TASK_TOKEN_PID"  # the PID the task token was made for
RUN_TOKEN_ENV = "HPCTRAIN_RUN_TOKEN"
RUN_DIR_ENV = "HPCTRAIN_LOCAL_RUN_DIR"  # the run directory a local run's controller serves
TOKEN_VARS = (TOKEN_ENV, TOKEN_PID_ENV, RUN_TOKEN_ENV, RUN_DIR_ENV)  # never handed on to what is not the run's
# The per-task reaper (runtime/cleanup.py), as the login side names it in the command srun starts.
REAPER_MODULE = "hpctrain.runtime.cleanup"
# Its option that starts the task with Slurm's stop signals held until it listens (runtime/stop_signals.py).
HOLD_OPTION = "--hold-stop-signals"
GRACE_S = 5.0
KILL_WAIT_S = 2.0
RESCAN_S = 0.5

Log = Callable[[str], None]


def new_token() -> str:
    return uuid.uuid4().hex


def owned_token(environ: Mapping[str, str], pid: int) -> str | None:
    """The task token in ``environ`` when it was made for process ``pid`` (see the module docstring); else None."""
    token = environ.get(TOKEN_ENV)
    return token if token and environ.get(TOKEN_PID_ENV) == str(pid) else None


def token_environ(environ: Mapping[str, str], pid: int, token: str | None = None) -> dict[str, str]:
    """``environ`` with a task token (fresh unless given) made for process ``pid``."""
    return {**environ, TOKEN_ENV: token or new_token(), TOKEN_PID_ENV: str(pid)}


def without_tokens(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without any of hpctrain's process tokens."""
    return {key: value for key, value in environ.items() if key not in TOKEN_VARS}


def find_token_processes(
    token: str,
    *,
    exclude_pids: Iterable[int] = (),
    forked_from: Mapping[str, str] | None = None,
    created_after: float = 0.0,
    env_var: str = TOKEN_ENV,
    where: Callable[[Mapping[str, str]], bool] | None = None,
) -> list[psutil.Process]:
    """Live processes of this user whose exec-time environment holds ``token`` (in ``env_var``).

    With ``forked_from`` (the exec-time environment of a task started without
    the token), also those whose environment is exactly that one and that
    started after ``created_after``: children the task forked without exec.
    ``where``: only those whose environment also passes it (a local run: the run directory it serves).
    """
    import psutil

    excluded = set(exclude_pids) | _self_and_ancestors()
    uid = os.getuid()
    found = []
    # A fresh Process per PID, not process_iter's: since psutil 6 that one keeps one Process per PID across
    # calls without checking for reuse, so a long-lived caller (the supervisor, a local run's watcher) would
    # get, for a PID the kernel gave to a new process, the old object, whose signals raise "PID reused" and
    # never reach the new process that carries the token.
    for pid in psutil.pids():
        if pid in excluded:
            continue
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                uids, created = proc.uids(), proc.create_time()
            if uids.real != uid:
                continue
            environ = proc.environ()
            forked = forked_from is not None and created >= created_after and environ == forked_from
            if (forked or environ.get(env_var) == token) and (where is None or where(environ)) and alive(proc):
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
    where: Callable[[Mapping[str, str]], bool] | None = None,
    log: Log | None = None,
) -> list[int]:
    """SIGTERM every process carrying ``token`` (and ``extra``), SIGKILL survivors after ``grace_s``.

    Re-scans while waiting, so a process forked during shutdown is caught too.
    Returns the PIDs it signalled. Never touches this process or its ancestors.
    ``forked_from``/``created_after``/``env_var``/``where``: see :func:`find_token_processes`.
    """
    say: Log = log or (lambda message: None)
    excluded = set(exclude_pids)
    targets: dict[int, psutil.Process] = {}

    def rescan() -> list[psutil.Process]:
        found = find_token_processes(
            token,
            exclude_pids=excluded,
            forked_from=forked_from,
            created_after=created_after,
            env_var=env_var,
            where=where,
        )
        new = [p for p in found if process_key(p) not in _keys(targets)]
        new += [p for p in extra if p.pid not in excluded and alive(p) and process_key(p) not in _keys(targets)]
        for proc in new:
            targets[proc.pid] = proc
        return new

    _signal_all(rescan(), signal.SIGTERM, say)
    deadline = time.monotonic() + grace_s
    next_scan = time.monotonic() + RESCAN_S
    while any(alive(p) for p in targets.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        if time.monotonic() >= next_scan:
            _signal_all(rescan(), signal.SIGTERM, say)
            next_scan = time.monotonic() + RESCAN_S
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        rescan()
        survivors = [p for p in targets.values() if alive(p)]
        if not survivors:
            break
        _signal_all(survivors, signal.SIGKILL, say)
        time.sleep(0.1)
    left = [p.pid for p in targets.values() if alive(p)]
    if left:
        say(f"could not end PIDs {left}")
    return sorted(targets)


def alive(proc: psutil.Process) -> bool:
    """Whether ``proc`` still runs (a zombie has ended; a process we may not inspect counts as running)."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def process_key(proc: psutil.Process) -> tuple[int, float]:
    """A process's identity: its PID and start time (a PID alone may be reused)."""
    try:
        return (proc.pid, proc.create_time())
    except Exception:
        return (proc.pid, 0.0)


def _keys(procs: Mapping[int, psutil.Process]) -> set[tuple[int, float]]:
    return {process_key(p) for p in procs.values()}


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


def _signal_all(procs: Sequence[psutil.Process], signum: int, log: Log) -> None:
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
        if proc.pid in done or not alive(proc):
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

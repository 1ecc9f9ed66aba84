"""A local run's processes: what proves a PID is still the run's, and how the run is stopped.

submitit's local executor runs each job under a controller process whose PID
is the job id in run.json. A PID alone proves nothing: the run may have ended
and the number been reused by an unrelated process, and run.json is a file
anyone may have edited (``"job_id": "-1"`` would make ``kill`` signal every
process of the user). So every local controller starts with a fresh token,
``HPCTRAIN_RUN_TOKEN=<uuid>``, in its exec-time environment, which its tasks
and their data-loader workers inherit; run.json records the controller's PID,
its start time and the token (``local_process``). The controller's environment
also names the run directory it serves (``HPCTRAIN_LOCAL_RUN_DIR``): a copy of
a live run's run.json in another folder names the right PID, start time and
token, but not that folder. A process is the run's only when all four match
(a sweep's parent directory is served by its trials' controllers).
``/proc/PID/environ`` is readable only by the process's owner, so a run.json
written elsewhere cannot name one of this user's processes by guessing. The
controller starts without any task token the caller inherited
(``contract/process_tokens.py``).

Everything that asks "is the run still running?" (``cancel``, ``status``,
``status --watch``, ``resume``) goes through :func:`run_process`; only a
process it returns is ever signalled. Imports neither torch nor submitit.
"""

from __future__ import annotations

import math
import os
import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpctrain.contract.process_tokens import (
    RUN_DIR_ENV,
    RUN_TOKEN_ENV,
    find_token_processes,
    kill_token_processes,
    new_token,
    without_tokens,
)

if TYPE_CHECKING:
    import psutil

RECORD_KEY = "local_process"  # run.json key holding a local run's :class:`LocalProcess`
START_TIME_TOLERANCE_S = 0.05  # psutil's create_time has clock-tick resolution (10 ms)
STOP_GRACE_S = 5.0

Liveness = Literal["running", "gone", "unproven"]
Outcome = Literal["ended", "killed", "gone"]
STATE = "local"  # what status shows in place of a Slurm state for a local run
GONE_STATE = "local, process gone"  # ... whose controller has ended (or was never proven to be the run's)


@dataclass(frozen=True)
class LocalProcess:
    """What run.json records about a local run's controller: enough to recognise it, not just its number.

    ``run_dir``: where that run.json lies (not recorded: it is where the record was read); None only for
    a record of a controller this process started itself.
    """

    pid: int
    start_time: float
    token: str
    run_dir: Path | None = None

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time, "token": self.token}


def new_run_token() -> str:
    return new_token()


def controller_environ(environ: Mapping[str, str], token: str, run_dir: Path) -> dict[str, str]:
    """The environment a local controller starts with: the caller's, without any process token it
    inherited, with this run's token and run directory."""
    return {**without_tokens(environ), RUN_TOKEN_ENV: token, RUN_DIR_ENV: os.path.realpath(run_dir)}


def record_started(pid: int, token: str) -> LocalProcess:
    """The record of a controller just started as ``pid`` with ``token`` in its environment."""
    import psutil

    try:
        start_time = psutil.Process(pid).create_time()
    except psutil.Error:
        start_time = 0.0  # already gone: no process will ever match, so nothing will be signalled
    return LocalProcess(pid, start_time, token)


def valid_pid(value: object) -> int | None:
    """``value`` as a PID that names one process (an int > 1), else None.

    ``kill(0)`` signals the caller's process group, ``kill(-1)`` every process
    the user may signal, ``kill(-N)`` a group, and PID 1 is init.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,10}", value.strip()):
        value = int(value.strip())
    return value if isinstance(value, int) and 1 < value < 2**31 else None


def parse_record(info: Mapping[str, Any], run_dir: Path) -> LocalProcess | None:
    """``run_dir``'s run.json (``info``): its proof of a local run's controller, or None where it is missing,
    malformed or names another PID than ``job_id`` (written by an older hpctrain, or edited)."""
    raw = info.get(RECORD_KEY)
    if not isinstance(raw, Mapping):
        return None
    pid, start, token = valid_pid(raw.get("pid")), raw.get("start_time"), raw.get("token")
    if pid is None or valid_pid(info.get("job_id")) != pid:
        return None
    if isinstance(start, bool) or not isinstance(start, (int, float)) or not math.isfinite(start) or start <= 0:
        return None
    if not isinstance(token, str) or not re.fullmatch(r"[0-9a-f]{32}", token):
        return None
    return LocalProcess(pid, float(start), token, Path(run_dir))


def run_process(record: LocalProcess) -> psutil.Process | None:
    """The live process ``record`` names, if it is provably the run's: same PID, same start time,
    same owner, the run's token in its environment. None otherwise (gone, reused, a zombie, another
    user's)."""
    proc, verdict = _examine(record)
    return proc if verdict == "running" else None


def _examine(record: LocalProcess) -> tuple[psutil.Process | None, Liveness]:
    """``running`` (proven), ``gone`` (no such process, a zombie, or certainly another one: its start
    time or token differs), or ``unproven`` (its start time matches but its environment is not ours
    to read: another user's run, looked at by someone else)."""
    import psutil

    if valid_pid(record.pid) is None:
        return None, "gone"
    try:
        proc = psutil.Process(record.pid)
        if abs(proc.create_time() - record.start_time) > START_TIME_TOLERANCE_S:
            return None, "gone"
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None, "gone"
        if proc.uids().real != os.getuid():
            return None, "unproven"
        environ = _environ(proc)
        if environ.get(RUN_TOKEN_ENV) != record.token or not _serves(environ, record.run_dir):
            return None, "gone"
        return proc, "running"
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None, "gone"
    except psutil.AccessDenied:
        return None, "unproven"


def _environ(proc: psutil.Process, tries: int = 20) -> dict[str, str]:
    """``proc``'s exec-time environment. Just after ``exec`` the kernel shows an empty one for a moment
    (the new image's environment is set up after the old one is released), so an empty one is read again."""
    for _ in range(tries):
        if environ := proc.environ():
            return environ
        time.sleep(0.005)
    return {}


def _serves(environ: Mapping[str, str], run_dir: Path | None) -> bool:
    """Whether a controller with ``environ`` serves ``run_dir`` (itself, or the sweep whose trial it runs)."""
    if run_dir is None:
        return True  # a controller this process started
    served = environ.get(RUN_DIR_ENV)
    if not served:
        return False
    wanted = os.path.realpath(run_dir)
    return wanted in (os.path.realpath(served), os.path.dirname(os.path.realpath(served)))


def liveness(info: Mapping[str, Any], run_dir: Path) -> Liveness:
    """Whether ``run_dir``'s local controller still runs: ``running`` (proven), ``gone``, or ``unproven``
    (a live process that may be the run's: run.json has no proof, or the process is not ours to read)."""
    record = parse_record(info, run_dir)
    if record is not None:
        return _examine(record)[1]
    pid = valid_pid(info.get("job_id"))
    if pid is None or not _pid_exists(pid):
        return "gone"
    return "unproven"


def state(info: Mapping[str, Any], run_dir: Path, *, summary_final: bool) -> str:
    """A local run's job state for ``status``: :data:`GONE_STATE` once its controller is gone
    before the run wrote a final summary (killed, out of memory)."""
    return GONE_STATE if not summary_final and liveness(info, run_dir) == "gone" else STATE


def run_processes(record: LocalProcess) -> list[psutil.Process]:
    """Every live process of this user carrying the run's token for its run directory (controller, tasks,
    loader workers)."""
    return find_token_processes(record.token, env_var=RUN_TOKEN_ENV, where=_serving(record))


def _serving(record: LocalProcess) -> Callable[[Mapping[str, str]], bool]:
    return lambda environ: _serves(environ, record.run_dir)


def stop(records: Sequence[LocalProcess], timeout_s: float, *, poll_s: float = 0.2) -> Outcome:
    """SIGTERM each run's controller (it forwards the signal to its tasks, which save and stop), wait up to
    ``timeout_s`` for them, then end whatever still carries a run's token (SIGTERM, then SIGKILL).

    Signals nothing that :func:`run_process` did not prove to be a run's, or that lacks the run's token.
    Write the cancel marker first, so that the tasks read the SIGTERM as a cancel, not a preemption.
    """
    import psutil

    running = [(record, proc) for record in records if (proc := run_process(record)) is not None]
    for _, proc in running:
        try:
            proc.send_signal(signal.SIGTERM)  # psutil refuses if the PID now names another process
        except psutil.Error:
            pass
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while any(run_process(record) is not None for record, _ in running) and time.monotonic() < deadline:
        time.sleep(poll_s)  # a zombie counts as ended: its parent reaps it when it looks
    ended = all(run_process(record) is None for record, _ in running)
    grace_s = STOP_GRACE_S if ended else 0.0
    leftovers = [
        pid
        for record in records
        for pid in kill_token_processes(record.token, grace_s, env_var=RUN_TOKEN_ENV, where=_serving(record))
    ]
    if not running:
        return "killed" if leftovers else "gone"
    return "ended" if ended and not leftovers else "killed"


def _pid_exists(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True

"""A user's script as a process of a task: started in a session of its own, stopped as a whole, described.

The script runs in its own session (and so its own process group): the stop
signal goes to the group, which reaches ``mp.spawn`` workers and data-loader
workers that stayed in it, and the task's reaper (``runtime/cleanup.py``)
still finds everything by the token in its environment, whatever left the
group. Two signals are ignored from the start of the script (an ignored
disposition survives ``exec``, a handler would not): the time-limit warning,
which is hpctrain's to act on, and ``SIGTERM`` when the script stops on
another signal. Under ``proctrack/linuxproc`` Slurm sends these to every
process of the step, and a Python script dies of the default action.

Its output is the task's own (the same file descriptors, so the log keeps
its order and nothing stands between the script and its log); what the
script wrote since it started is read back from that file when it fails
(:class:`OutputTail`), and how long it has been silent is measured on it
(:class:`Silence`). Torch-free.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TAIL_LINES = 20
TAIL_LINE_CHARS = 400
TAIL_BYTES = 64 * 1024
# A stop's SIGKILL, and the ends of a group whose leader is gone: how long to wait for the group to empty.
KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class ExitStatus:
    """How the script's process ended: its exit code, or the signal that killed it."""

    code: int | None
    signal_name: str | None

    @classmethod
    def of(cls, returncode: int) -> ExitStatus:
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            return cls(None, name)
        return cls(returncode, None)

    @property
    def ok(self) -> bool:
        return self.code == 0

    def describe(self) -> str:
        """In the words of the summary and the log: 'exited with code 3', 'killed by SIGKILL'."""
        return f"exited with code {self.code}" if self.signal_name is None else f"killed by {self.signal_name}"


def launch_argv(command: Sequence[str], ignored: Iterable[str]) -> list[str]:
    """``command`` started through ``/bin/sh`` with ``ignored`` (signal names without SIG) ignored. Pure."""
    names = " ".join(dict.fromkeys(ignored))
    if not names:
        return list(command)
    return ["/bin/sh", "-c", f'trap "" {names}; exec "$@"', "hpctrain-script", *command]


def ignored_signals(timeout_signal: str, stop_signal: str) -> list[str]:
    """What the script starts with ignored (see the module docstring). Pure."""
    ignored = [timeout_signal]
    if stop_signal != "TERM":
        ignored.append("TERM")
    return [name for name in ignored if name != stop_signal]


class ScriptProcess:
    """The script's process and its process group."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, ignored: Iterable[str] = ()) -> None:
        self.argv, self.env, self.cwd, self.ignored = list(argv), dict(env), cwd, list(ignored)
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> int:
        """Start it in its own session; its PID (also its process group's id)."""
        self.process = subprocess.Popen(
            launch_argv(self.argv, self.ignored),
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        self.started = time.monotonic()
        return self.process.pid

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def poll(self) -> ExitStatus | None:
        assert self.process is not None
        code = self.process.poll()
        return None if code is None else ExitStatus.of(code)

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the script's process group; False when no process of it is left.

        The group's id is the script's PID, which the kernel does not give to another process while any
        member of the group lives, so after the script itself ended this still reaches only its children.
        """
        try:
            os.killpg(self.pid, signum)
            if signum != signal.SIGKILL:
                os.killpg(self.pid, signal.SIGCONT)  # a stopped process must wake to see it
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def kill_group(self, wait_s: float = KILL_WAIT_S) -> None:
        """SIGKILL the whole group and wait (bounded) until it is empty."""
        deadline = time.monotonic() + wait_s
        while self.signal_group(signal.SIGKILL) and time.monotonic() < deadline:
            if self.process is not None:
                self.process.poll()  # reap the leader: a zombie still counts as a member
            time.sleep(0.05)


class OutputTail:
    """What this process's stderr (or stdout) file got since :meth:`mark`: the script's last lines.

    Works where the descriptor is a regular file (submitit's per-task log under srun, torchrun's per-rank
    file with ``--tee``); elsewhere (a pipe, a terminal) there is nothing to read back.
    """

    def __init__(self, fd: int = 2) -> None:
        self.fd = fd
        self.offset: int | None = None

    def mark(self) -> None:
        self.offset = _regular_size(self.fd)

    def lines(self, count: int = TAIL_LINES) -> list[str]:
        size = _regular_size(self.fd)
        if self.offset is None or size is None:
            return []
        start = max(self.offset, size - TAIL_BYTES)
        try:
            with open(f"/proc/self/fd/{self.fd}", "rb") as handle:
                handle.seek(start)
                data = handle.read(size - start)
        except OSError:
            return []
        text = data.decode("utf-8", errors="replace")
        lines = [line.rstrip("\r") for line in text.splitlines() if line.strip()]
        return [line[:TAIL_LINE_CHARS] for line in lines[-count:]]


class Silence:
    """How long the script has written nothing: no byte to stdout or stderr, no heartbeat of its rank.

    ``None`` from :meth:`seconds` means it cannot be measured here (output to a pipe or terminal).
    """

    def __init__(self, heartbeat: Path | None = None, fds: tuple[int, ...] = (1, 2)) -> None:
        self.heartbeat, self.fds = heartbeat, fds
        self.last_seen = self._sizes()
        self.last_change = time.monotonic()

    def seconds(self) -> float | None:
        seen = self._sizes()
        if all(size is None for size in seen[: len(self.fds)]):
            return None
        if seen != self.last_seen:
            self.last_seen, self.last_change = seen, time.monotonic()
        return time.monotonic() - self.last_change

    def _sizes(self) -> tuple[float | None, ...]:
        sizes: list[float | None] = [_regular_size(fd) for fd in self.fds]
        if self.heartbeat is not None:
            try:
                sizes.append(self.heartbeat.stat().st_mtime)
            except OSError:
                sizes.append(None)
        return tuple(sizes)


def _regular_size(fd: int) -> int | None:
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None

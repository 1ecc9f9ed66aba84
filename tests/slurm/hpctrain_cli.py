"""Run the real ``hpctrain`` command line against the test cluster, the way a user would.

Every call is a fresh ``python -m hpctrain`` process with the cluster's
environment, started in the repository root (the example specs use paths
relative to it), and bounded by a timeout: no test waits forever.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .conftest import SlurmCluster

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CliResult:
    """One finished ``hpctrain`` command: exit code, output, and how long it took."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    def json(self) -> Any:
        """The first stdout line that is a JSON document (``--json`` prints it before waiting)."""
        for line in self.stdout.splitlines():
            if line.startswith(("{", "[")):
                return json.loads(line)
        raise AssertionError(f"no JSON line in the output of {self}")

    def __str__(self) -> str:
        return (
            f"hpctrain {' '.join(self.args)} exited {self.returncode} after {self.wall_s:.1f} s\n"
            f"--- stdout\n{self.stdout.rstrip()}\n--- stderr\n{self.stderr.rstrip()}"
        )


def cli_env(cluster: SlurmCluster, state_home: Path) -> dict[str, str]:
    """The cluster's environment, with hpctrain's job-id registry kept under ``state_home``.

    A private registry keeps the tests off the real user's ``~/.local/state``
    and makes job-id lookups see only this session's submissions.
    """
    return {**cluster.env, "XDG_STATE_HOME": str(state_home)}


def hpctrain(env: dict[str, str], *args: str, timeout: float = 120) -> CliResult:
    """``hpctrain ARGS`` in the repository root; its output is captured, never a TTY."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return CliResult(tuple(args), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def task_logs(run_dir: Path, lines: int = 40) -> str:
    """The tail of every task's stderr in a run, for assertion messages."""
    parts = []
    for path in sorted((run_dir / "submitit").glob("*_log.err")):
        text = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"===== {path.name}\n" + "\n".join(text))
    return "\n".join(parts) or f"(no task logs under {run_dir / 'submitit'})"

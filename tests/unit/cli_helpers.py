"""Running ``hpctrain`` as a user types it, for the unit tests: the one CLI runner and its checks.

:func:`hpctrain` runs the real command in a fresh interpreter (its start-up,
its exit code, its stderr), with :func:`isolated_env` keeping the user's own
profiles, job registry and home out of it; :func:`in_process` runs it in the
test's own process, where a ``FakeSlurm`` installed with monkeypatch answers
(``tests/fake_slurm.py``). The ``env`` and ``isolated`` fixtures are in
``conftest.py``.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpctrain.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def isolated_env(root: Path, *, state: Path | None = None) -> dict[str, str]:
    """The user's own profiles, job registry and home stay out of every run; ``state``: where the job
    registry lives (``XDG_STATE_HOME``; default ROOT/state)."""
    environ = dict(os.environ)
    environ.update(
        HOME=str(root / "home"),
        HPCTRAIN_CONFIG_DIR=str(root / "config"),
        XDG_STATE_HOME=str(state if state is not None else root / "state"),
        COLUMNS="120",
        PYTHONIOENCODING="utf-8",  # the rank table's box characters, whatever the locale
    )
    environ.pop("PYTHONWARNINGS", None)
    return environ


def hpctrain(
    *args: str,
    env: Mapping[str, str],
    cwd: Path = REPO,
    importtime: bool = False,
    limit: int | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``hpctrain ARGS`` in a fresh interpreter; ``limit``: the most bytes of address space it may use."""
    flags = ["-X", "importtime"] if importtime else []

    def cap() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run(
        [sys.executable, *flags, "-m", "hpctrain", *args],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap if limit is not None else None,  # noqa: PLW1509 - one setrlimit, no locks
    )


def hpctrain_all(
    calls: Mapping[str, Sequence[str]], *, env: Mapping[str, str], cwd: Mapping[str, Path] | None = None, **kwargs: bool
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run several commands at once (each is mostly interpreter start-up)."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {
            key: pool.submit(hpctrain, *args, env=env, cwd=(cwd or {}).get(key, REPO), **kwargs)
            for key, args in calls.items()
        }
        return {key: future.result() for key, future in futures.items()}


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``hpctrain ARGS`` in this process (Slurm: the test's FakeSlurm), as a finished command."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["hpctrain", *args], code, out, err)


def assert_user_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """A user mistake: the given exit code, a message naming what to fix, no traceback."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ")
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr}"

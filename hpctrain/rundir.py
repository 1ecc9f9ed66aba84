"""Run directories: ``OUTPUT_DIR/NAME/RUN_ID/``, never reused for a new run.

A run directory holds the resolved ``spec.yaml``, ``run.json`` (what was
submitted where: job ids, cluster, submitit folder), the submitit/Slurm logs,
and what the trainer writes (checkpoints, tb/, metrics.jsonl, summary.json).
Every write here is atomic (temp file, fsync, rename).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from hpctrain.errors import RunDirError

RUN_FILE = "run.json"
SPEC_FILE = "spec.yaml"
SUMMARY_FILE = "summary.json"
SUBMITIT_DIR = "submitit"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` so readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def new_run_id(now: float | None = None) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now))


def next_run_dir(output_dir: str, name: str, now: float | None = None) -> Path:
    """The directory a new run would get (not created): a dry run shows this."""
    base = Path(output_dir).expanduser().resolve() / name
    run_id = new_run_id(now)
    candidate, suffix = base / run_id, 1
    while candidate.exists():
        suffix += 1
        candidate = base / f"{run_id}-{suffix}"
    return candidate


def create_run_dir(output_dir: str, name: str) -> Path:
    """Create a fresh run directory; a concurrent submit never gets the same one."""
    for _ in range(100):
        candidate = next_run_dir(output_dir, name)
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
        except OSError as exc:
            raise RunDirError(
                f"cannot create run directory under {candidate.parent}: {exc.strerror}",
                hint="set output_dir in the spec (or --set output_dir=DIR) to a writable directory",
            ) from None
    raise RunDirError(f"could not find a free run directory under {Path(output_dir).expanduser() / name}")


def write_run_info(run_dir: Path, info: dict[str, Any]) -> None:
    atomic_write_text(run_dir / RUN_FILE, json.dumps(info, indent=2, sort_keys=True) + "\n")


def read_run_info(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_FILE
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory", hint="'hpctrain status' lists recent runs")
    if not path.is_file():
        raise RunDirError(
            f"{run_dir}: not an hpctrain run directory (no {RUN_FILE})",
            hint="pass a directory OUTPUT_DIR/NAME/RUN_ID created by 'hpctrain submit'",
        )
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirError(f"{path}: unreadable ({exc})") from None


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None

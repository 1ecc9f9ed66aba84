"""Which run directory a Slurm job id belongs to, so commands accept either.

Every submit appends ``{"job_id", "run_dir", "time"}`` to
``$XDG_STATE_HOME/hpctrain/jobs.jsonl`` (default ``~/.local/state``). Lines
are small and appended with O_APPEND, so concurrent submits do not interleave.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hpctrain.contract.file_writes import open_append
from hpctrain.contract.rundir import RUN_FILE
from hpctrain.contract.runfiles import RunFileError, iter_lines, load_json, plausible, real_path
from hpctrain.errors import RunDirError

MAX_ENTRY_BYTES = 64 << 10  # an entry is a job id, a path and a time


def registry_path() -> Path:
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(state_home) / "hpctrain" / "jobs.jsonl"


def record(job_id: str, run_dir: Path) -> None:
    path = registry_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"job_id": job_id, "run_dir": str(run_dir), "time": time.time()}) + "\n"
        fd = open_append(path)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # the registry is a convenience; a run dir always works


def entries() -> list[dict]:
    """The registry's entries, oldest first; streamed, and a torn, hand-edited or huge line is skipped."""
    out = []
    try:
        for line in iter_lines(registry_path(), max_line_bytes=MAX_ENTRY_BYTES):
            try:
                entry = load_json(line)
            except ValueError:
                continue
            if (
                isinstance(entry, dict)
                and isinstance(entry.get("job_id"), str)
                and isinstance(entry.get("run_dir"), str)
                and (entry.get("time") is None or plausible(entry.get("time")))
            ):
                out.append(entry)
    except (OSError, RunFileError):
        pass  # no registry (yet), or not a file: job ids cannot be resolved, run dirs still work
    return out


def resolve_run(run: str) -> Path:
    """A run directory path, or a job id (``123`` or array task ``123_4``) -> run dir."""
    path = Path(run).expanduser()
    if path.exists() or not run.replace("_", "").isdigit():
        if not (path / RUN_FILE).exists():  # a run.json that is not a file is refused when read
            raise RunDirError(
                f"{run}: not an hpctrain run directory (no {RUN_FILE})",
                hint="pass OUTPUT_DIR/NAME/RUN_ID as printed by 'hpctrain submit', or its job id",
            )
        return real_path(path)
    for entry in reversed(entries()):
        if entry.get("job_id") == run or entry.get("job_id", "").split("_")[0] == run:
            return Path(entry["run_dir"])
    raise RunDirError(
        f"job {run} was not submitted by hpctrain from this account",
        hint="pass its run directory instead ('hpctrain status' lists recent runs)",
    )

"""Functions that Slurm jobs run through submitit.

submitit pickles callables by module reference, so they live in a module the
job can import (see `importable_setup`), not inside the test files.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path


def whoami() -> dict[str, str | int | None]:
    """Where this task runs and what Slurm told it."""
    return {
        "procid": int(os.environ["SLURM_PROCID"]),
        "localid": int(os.environ["SLURM_LOCALID"]),
        "host": socket.gethostname(),
        "job_id": os.environ["SLURM_JOB_ID"],
        "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
    }


def whoami_indexed(index: int) -> dict[str, str | int | None]:
    return dict(whoami(), index=index)


def importable_setup() -> list[str]:
    """sbatch setup lines that let a job import this module under the name pytest gave it.

    pytest may import it as `slurm.jobfuncs` (rootdir-relative packages) or
    `tests.slurm.jobfuncs`; the job needs the folder that makes that name resolve.
    """
    module = sys.modules[__name__]
    root = Path(module.__file__).resolve().parents[__name__.count(".")]
    return [f'export PYTHONPATH="{root}${{PYTHONPATH:+:$PYTHONPATH}}"']

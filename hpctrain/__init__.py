"""hpctrain: distributed PyTorch training from a YAML file to a resumable Slurm run.

The Python API (docs/python-api.md) is reached from here, lazily: ``import
hpctrain`` loads nothing else, and ``hpctrain.submit`` loads the login-side
library it needs (never torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it; loaded on first use (PEP 562), so 'import hpctrain' stays cheap.
_LAZY = {
    **dict.fromkeys(
        ("load_job", "submit", "status", "cancel", "resume", "report", "Submission", "StudyStatus", "Report"),
        "hpctrain.api",
    ),
    "RunStatus": "hpctrain.observe.run_status",
    "Cancelled": "hpctrain.launch.cancel",
    **dict.fromkeys(
        ("HpctrainError", "SpecError", "UsageError", "ClusterError", "RunDirError", "CheckpointError"),
        "hpctrain.errors",
    ),
}

__all__ = [  # what _LAZY names, spelled out for tools that read __all__ without running it
    "Cancelled",
    "CheckpointError",
    "ClusterError",
    "HpctrainError",
    "Report",
    "RunDirError",
    "RunStatus",
    "SpecError",
    "StudyStatus",
    "Submission",
    "UsageError",
    "__version__",
    "cancel",
    "load_job",
    "report",
    "resume",
    "status",
    "submit",
]

if TYPE_CHECKING:
    from hpctrain.api import Report, StudyStatus, Submission, cancel, load_job, report, resume, status, submit
    from hpctrain.errors import CheckpointError, ClusterError, HpctrainError, RunDirError, SpecError, UsageError
    from hpctrain.launch.cancel import Cancelled
    from hpctrain.observe.run_status import RunStatus


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hpctrain' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

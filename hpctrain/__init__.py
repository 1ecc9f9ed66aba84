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
        ("load_job", "submit", "status", "cancel", "resume", "report", "doctor", "nodes", "forget_node", "plan"),
        "hpctrain.api",
    ),
    "Submission": "hpctrain.launch.submit",
    "RunStatus": "hpctrain.observe.run_status",
    "StudyStatus": "hpctrain.observe.status",
    "Cancelled": "hpctrain.launch.cancel",
    "Report": "hpctrain.observe.report.build",
    "DoctorReport": "hpctrain.diagnose.doctor",
    "NodeLedger": "hpctrain.observe.node_ledger",
    "Plan": "hpctrain.planning.plan",
    **dict.fromkeys(
        ("HpctrainError", "SpecError", "UsageError", "ClusterError", "RunDirError", "CheckpointError", "RunStopped"),
        "hpctrain.errors",
    ),
}

__all__ = [  # what _LAZY names, spelled out for tools that read __all__ without running it
    "Cancelled",
    "CheckpointError",
    "ClusterError",
    "DoctorReport",
    "HpctrainError",
    "NodeLedger",
    "Plan",
    "Report",
    "RunDirError",
    "RunStatus",
    "RunStopped",
    "SpecError",
    "StudyStatus",
    "Submission",
    "UsageError",
    "__version__",
    "cancel",
    "doctor",
    "forget_node",
    "load_job",
    "nodes",
    "plan",
    "report",
    "resume",
    "status",
    "submit",
]

if TYPE_CHECKING:
    from hpctrain.api import cancel, doctor, forget_node, load_job, nodes, plan, report, resume, status, submit
    from hpctrain.diagnose.doctor import DoctorReport
    from hpctrain.errors import (
        CheckpointError,
        ClusterError,
        HpctrainError,
        RunDirError,
        RunStopped,
        SpecError,
        UsageError,
    )
    from hpctrain.launch.cancel import Cancelled
    from hpctrain.launch.submit import Submission
    from hpctrain.observe.node_ledger import NodeLedger
    from hpctrain.observe.report.build import Report
    from hpctrain.observe.run_status import RunStatus
    from hpctrain.observe.status import StudyStatus
    from hpctrain.planning.plan import Plan


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

"""hpctrain: distributed PyTorch training from a YAML file to a resumable Slurm run.

The Python API (docs/python-api.md) is reached from here, lazily: ``import
hpctrain`` loads nothing else, and ``hpctrain.submit`` loads the login-side
library it needs (never torch).
"""

from __future__ import annotations

import sys as _sys
from typing import TYPE_CHECKING, Any

# name -> module that defines it; loaded on first use (PEP 562), so 'import hpctrain' stays cheap.
_LAZY = {
    **dict.fromkeys(
        (
            "load_job",
            "submit",
            "status",
            "cancel",
            "resume",
            "report",
            "doctor",
            "nodes",
            "forget_node",
            "sync",
            "plan",
        ),
        "hpctrain.api",
    ),
    "__version__": "hpctrain.version",  # defined there, so that what records it need not import this face
    "Submission": "hpctrain.launch.submit",
    "RunStatus": "hpctrain.observe.run_status",
    "StudyStatus": "hpctrain.observe.status",
    "Cancelled": "hpctrain.launch.cancel",
    "Report": "hpctrain.observe.report.build",
    "DoctorReport": "hpctrain.diagnose.doctor",
    "NodeLedger": "hpctrain.observe.node_ledger",
    "Synced": "hpctrain.tracking.sync",
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
    "Synced",
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
    "sync",
]

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from hpctrain.api import cancel, doctor, forget_node, load_job, nodes, plan, report, resume, status, submit, sync
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
    from hpctrain.tracking.sync import Synced
    from hpctrain.version import __version__


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


# -- the programs' old names, for jobs pickled before they moved (issue 36) ------------------------------------------
# submitit pickles the program a job runs (launch/task_programs.py) and pickle names its class by module path: a job
# submitted before the programs left runtime/ for programs/, requeued after an upgrade, unpickles
# ``hpctrain.runtime.launcher.TaskLauncher``. Every unpickling of an ``hpctrain.*`` class imports this package first,
# which puts ``_OldNames`` last on ``sys.meta_path``: asked only when no file answers, and only for these names, it
# gives a module whose attributes are the new module's, so the old name unpickles to the very same class. Not files at
# the old paths: a runtime/launcher.py importing programs/ would be the pieces importing what stands above them. Only
# the four pickled programs are here (torchrun_worker and the script pieces are started by name by a program of the
# same install). Keep them while jobs submitted with hpctrain 0.1 may be requeued (test_programs_old_names.py).
_OLD_PROGRAM_NAMES = {  # old module -> where it lives now
    "hpctrain.runtime.launcher": "hpctrain.programs.launcher",
    "hpctrain.runtime.torchrun_node": "hpctrain.programs.torchrun_node",
    "hpctrain.runtime.script_launcher": "hpctrain.programs.script_launcher",
    "hpctrain.runtime.script_torchrun": "hpctrain.programs.script_torchrun",
}


class _OldNames:
    """Finder and loader of the old names (the import system calls these on the class itself)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name not in _OLD_PROGRAM_NAMES:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(name, _OldNames)

    @staticmethod
    def create_module(spec: ModuleSpec) -> None:
        return None  # a plain module

    @staticmethod
    def exec_module(module: ModuleType) -> None:
        import importlib

        moved_to = importlib.import_module(_OLD_PROGRAM_NAMES[module.__name__])
        module.__doc__ = f"Moved to {moved_to.__name__}; kept for jobs pickled before (hpctrain._OLD_PROGRAM_NAMES)."
        module.__getattr__ = lambda name: getattr(moved_to, name)  # type: ignore[method-assign]  # PEP 562


if _OldNames not in _sys.meta_path:
    _sys.meta_path.append(_OldNames)

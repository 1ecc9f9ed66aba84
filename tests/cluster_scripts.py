"""The test bed's scripts in tests/cluster/ (no ``.py`` suffix), loaded as modules by the tests that use
their code: the Slurm tier's fixtures (slurm-cluster's versions and test user) and the unit tests of
slurm-cluster, check-ranks and job-memory."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

CLUSTER_DIR = Path(__file__).resolve().parent / "cluster"


def load_cluster_script(name: str) -> ModuleType:
    """``tests/cluster/NAME`` as a fresh module (not put in ``sys.modules``: each caller gets its own)."""
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(CLUSTER_DIR / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module

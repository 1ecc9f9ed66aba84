"""Fixtures shared by the local (multi-process, CPU) trainer tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from trainer_harness import make_data


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small generated ImageFolder, read (never written) by every trainer test."""
    return make_data(tmp_path_factory.mktemp("data") / "imagefolder")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Steady timings on a shared 2-core machine; the tested numerics do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

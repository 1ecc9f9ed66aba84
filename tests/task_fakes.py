"""One rank of a task-API job, faked for tests that use ``hpctrain.task.data`` outside a job."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.task import data as task_data
from hpctrain.task.session import TaskInfo


def one_rank(rank: int = 0, world: int = 1) -> TaskInfo:
    """Rank ``rank`` of ``world`` on one node's CPU, run outside hpctrain (mode ``local``)."""
    return TaskInfo(rank, world, rank, world, 0, 1, torch.device("cpu"), Path("."), Path("ck"), 0, "t", "h", "local")


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int = 0, world: int = 1) -> None:
    """Make ``hpctrain.task.data`` see this process as rank ``rank`` of ``world`` for the test."""
    info = one_rank(rank, world)
    monkeypatch.setattr(task_data, "context", lambda: info)

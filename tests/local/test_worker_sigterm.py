"""Data-loader workers outlive a SIGTERM that Slurm (not their parent) sends, and still obey their parent.

Under proctrack/linuxproc a job's SIGTERM reaches every process of a task. A
worker dying of it made the main process raise before it could save its stop
checkpoint (found by tests/slurm/test_cleanup_e2e.py).
"""

from __future__ import annotations

import subprocess
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from hpctrain.trainer.data import seed_worker

pytestmark = pytest.mark.local_dist


class SlowRange(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.005)
        return torch.tensor(index)


def test_workers_ignore_a_foreign_sigterm_and_obey_their_parent() -> None:
    loader = DataLoader(SlowRange(), batch_size=4, num_workers=2, persistent_workers=True, worker_init_fn=seed_worker)
    batches = iter(loader)
    first = next(batches)
    workers = list(batches._workers)  # type: ignore[attr-defined]
    # Sent by another process, as slurmstepd does: kill(1) is not the workers' parent.
    subprocess.run(["kill", "-TERM", *(str(w.pid) for w in workers)], check=True, timeout=10)
    time.sleep(0.5)
    later = [next(batches) for _ in range(20)]  # a dead worker would make this raise
    assert int(first[0]) == 0 and int(later[-1][-1]) == 4 * 21 - 1
    assert all(w.is_alive() for w in workers)

    workers[0].terminate()  # the parent's SIGTERM, as DataLoader sends to a worker that is slow to stop
    workers[0].join(timeout=10)
    assert workers[0].exitcode == 0
    del batches, loader  # shuts the other worker down the normal way
    workers[1].join(timeout=10)
    assert workers[1].exitcode is not None

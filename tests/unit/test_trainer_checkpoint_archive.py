"""A crafted state.pt cannot make a load allocate what its file does not hold (trainer/checkpoint_archive.py,
trainer/checkpoint.py): a record deflated into gigabytes is refused from the zip's directory, and a load
bounded by ``max_bytes`` refuses tensors beyond it before they are allocated."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.errors import CheckpointError
from hpctrain.trainer.checkpoint import CheckpointManager
from hpctrain.trainer.checkpoint_archive import ArchiveError, check_archive, tensor_bytes
from tests.checkpoint_crafting import plant_tensor

REPO = Path(__file__).resolve().parents[2]
FIVE_GIB = 5 << 30
ADDRESS_SPACE = 4 << 30  # torch's libraries map ~3 GiB; a 5 GiB tensor cannot fit beside them


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> CheckpointManager:
    manager = CheckpointManager(tmp_path / "checkpoints", keep_last=3, async_save=False)
    for step in (1, 2):
        manager.save({"model": {"w": torch.full((3,), float(step))}, "progress": {"epoch": 0}}, step=step, epoch=0)
    return manager


def test_torch_inflates_a_deflated_record_whole(tmp_path: Path) -> None:
    """The crafted file is real: torch.load alone allocates what the record's header claims."""
    manager = CheckpointManager(tmp_path, keep_last=1, async_save=False)
    manager.save({"model": {"w": torch.ones(3)}}, step=1, epoch=0)
    plant_tensor(tmp_path / "step-00000001", 64 << 20, deflated=True)
    state_file = tmp_path / "step-00000001" / "state.pt"
    assert state_file.stat().st_size < 1 << 20
    assert torch.load(state_file, weights_only=True)["model"]["planted"].numel() == (64 << 20) // 4
    with pytest.raises(ArchiveError, match="is compressed"):
        check_archive(state_file)


def test_a_5_gib_deflated_tensor_in_a_5_mb_state_pt_is_refused_before_a_byte_is_allocated(
    two_checkpoints: CheckpointManager,
) -> None:
    newest = two_checkpoints.directory / "step-00000002"
    plant_tensor(newest, FIVE_GIB, deflated=True)
    assert (newest / "state.pt").stat().st_size < 8 << 20
    # In a process that could not hold the tensor: the load falls back to step 1, and its memory stays small.
    code = (
        "import logging, resource, sys, torch\n"
        "logging.basicConfig(level=logging.WARNING, stream=sys.stdout)\n"
        "from hpctrain.trainer.checkpoint import CheckpointManager\n"
        f"state = CheckpointManager({str(two_checkpoints.directory)!r}).load()\n"
        "print('weight', state['model']['w'][0].item())\n"
        # VmHWM: this program's own peak. ru_maxrss would not do: Linux carries the forked copy's RSS across
        # exec, so a child of a pytest process grown to 1.9 GB (every tier in one session) reported 1884 MiB.
        "hwm = [line for line in open('/proc/self/status') if line.startswith('VmHWM:')][0]\n"
        "print('peak_mib', int(hwm.split()[1]) // 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE)),
    )
    assert done.returncode == 0, done.stderr
    assert "weight 1.0" in done.stdout
    assert "skipping corrupt checkpoint" in done.stdout and "is compressed" in done.stdout
    assert "inflate to 5368709120" in done.stdout
    peak = int(done.stdout.split("peak_mib ")[1])
    assert peak < 1024, done.stdout


def test_tensors_beyond_max_bytes_are_refused_from_their_sizes_alone(two_checkpoints: CheckpointManager) -> None:
    """A pickle claiming a 5 GiB storage over a small stored record, and a real tensor over the bound."""
    newest = two_checkpoints.directory / "step-00000002"
    plant_tensor(newest, FIVE_GIB, deflated=False)
    with pytest.raises(CheckpointError) as caught:
        two_checkpoints.load(newest, max_bytes=1 << 20)
    message = caught.value.message
    assert message.startswith(f"checkpoint {newest}: its tensors would take 5120.0 MiB")
    assert "state['model']['planted'] alone 5120.0 MiB" in message and "(1.0 MiB)" in message
    assert two_checkpoints.load(max_bytes=1 << 20)["model"]["w"][0].item() == 1.0  # the search falls back


def test_every_checkpoint_unusable_fails_naming_each_and_keeps_them(two_checkpoints: CheckpointManager) -> None:
    for step in (1, 2):
        plant_tensor(two_checkpoints.directory / f"step-0000000{step}", 64 << 20, deflated=True)
    with pytest.raises(CheckpointError) as caught:
        two_checkpoints.load()
    message = caught.value.message
    assert "no usable checkpoint" in message and "step-00000001:" in message and "step-00000002:" in message
    assert len(two_checkpoints.checkpoints()) == 2  # nothing was removed


def test_tensor_bytes_counts_each_storage_once() -> None:
    base = torch.zeros(100)
    total, largest = tensor_bytes({"a": base, "view": base[10:20], "b": [torch.ones(10, dtype=torch.float64)]})
    assert total == 400 + 80 and largest == ("state['a']", 400)


def test_a_weights_file_with_a_deflated_record_is_refused(tmp_path: Path) -> None:
    """trainer.weights goes through the same archive check."""
    from hpctrain.errors import TrainingConfigError
    from hpctrain.jobspec.models import Trainer
    from hpctrain.trainer.models import build_model

    manager = CheckpointManager(tmp_path, keep_last=1, async_save=False)
    manager.save({"model": {"w": torch.ones(3)}}, step=1, epoch=0)
    plant_tensor(tmp_path / "step-00000001", FIVE_GIB, deflated=True)
    weights = tmp_path / "step-00000001" / "state.pt"
    with pytest.raises(TrainingConfigError, match="is compressed"):
        build_model(Trainer(arch="resnet18", weights=str(weights)), num_classes=10)

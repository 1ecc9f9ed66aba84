"""A ddp run resumed on a number of ranks that does not divide its micro-batches (issue 29, item 4).

4 ranks of 7 samples each (64 images: 3 steps of 28 per epoch, the last filled up with the epoch's first
images) are stopped after 2 steps and resumed on 3: every step then has one whole micro-batch per rank and
the fourth split in pieces of 2, 2 and 3 samples over all three (BatchNorm takes the micro-batch's
statistics from the group). The weights must be the uninterrupted run's up to summation order, and that
uninterrupted (healthy) run's the same as before uneven shares.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_resume_elastic import BN_BUFFERS, global_batches, model_state, running_statistics, weights
from trainer_harness import run_ranks

from hpctrain.contract.rundir import checkpoints_dir, summary_path
from hpctrain.trainer.checkpoint import CheckpointManager

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.local_dist]

# weights_sha256 of the healthy 4-rank run below, recorded with hpctrain adf5be6 (main before uneven shares) on
# the development machine; a healthy run must still end bit-identically. Other torch builds or CPU kernels
# round differently, so the check applies where the record was made. torch's capability string does not tell
# CPUs apart enough: on an AMX-capable Xeon (2026-11-30: amx_tile in /proc/cpuinfo, capability AVX512 too)
# main's own code ended at another hash, with Pillow 12.3 or 13.0 and simplejpeg 1.8.2 or 1.9.0 alike, while
# CI's machine had passed it the day before; so the record does not apply on an AMX-capable CPU.
BEFORE = {
    "torch": "2.14.1+cu130",
    "cpu": "AVX512",
    "amx": False,
    "weights_sha256": "4a2f2b3da66750f06fe06c6281122f9c22d2e4b369a4739f1773c88f656f9af2",
}


def has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False


def test_four_ranks_resumed_on_three_train_the_same_global_batches(data_root: Path, tmp_path: Path) -> None:
    tmp, kwargs = tmp_path, {"data_root": str(data_root), "batch_size": 7}
    full = run_ranks("elastic", 4, tmp / "out-full", run_dir=str(tmp / "full"), **kwargs)
    split = tmp / "split"
    first = run_ranks("elastic", 4, tmp / "out-4", run_dir=str(split), stop_after=2, **kwargs)
    second = run_ranks("elastic", 3, tmp / "out-3", run_dir=str(split), **kwargs)
    assert [r["summary"]["status"] for r in first] == ["stopped"] * 4
    assert [(r["summary"]["status"], r["summary"]["global_step"]) for r in second] == [("completed", 6)] * 3

    uninterrupted = global_batches(full)
    assert sorted(uninterrupted) == [(e, s) for e in range(2) for s in range(3)]
    assert [len(uninterrupted[(0, s)]) for s in range(3)] == [28, 28, 28]
    assert global_batches(first, second) == uninterrupted  # the same samples in every step
    assert second[0]["summary"]["global_batch_size"] == full[0]["summary"]["global_batch_size"] == 28
    meta = CheckpointManager(checkpoints_dir(split)).load()
    assert meta["micro_batches"] == 4 and meta["world_size"] == 3
    assert json.loads(summary_path(split).read_text())["restarts"] == 1
    here = (torch.__version__, torch.backends.cpu.get_cpu_capability(), has_amx())
    if here == (BEFORE["torch"], BEFORE["cpu"], BEFORE["amx"]):
        assert full[0]["summary"]["weights_sha256"] == BEFORE["weights_sha256"], "a healthy run must train as before"

    # float64: what differs by summation order alone stays near 1e-12 (resnet18's BatchNorm over 1x1 maps
    # amplifies rounding); a wrong piece, loss divisor or BatchNorm statistic is off by 1e-3 or more.
    ours, theirs = weights(split), weights(tmp / "full")
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=0, atol=1e-9, msg=name)
    # and BatchNorm's running statistics follow the full shape's micro-batches (rank 0's: micro-batch 0)
    ours, theirs = running_statistics(split), running_statistics(tmp / "full")
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=0, atol=1e-9, msg=name)


def test_the_first_step_after_an_uneven_resume_matches_in_float32_batchnorm_statistics_included(
    data_root: Path, tmp_path: Path
) -> None:
    # issue 42, item 8: before, a rank computing a whole micro-batch and a piece of another moved its running
    # statistics twice a step (13 % off the undisturbed run's at the first step after a heal on the Slurm test
    # cluster); now only the micro-batch it computed in the full shape moves them. In float32, as users train.
    kwargs = {"data_root": str(data_root), "batch_size": 7, "float64": False}
    run_ranks("elastic", 4, tmp_path / "out-full", run_dir=str(tmp_path / "full"), stop_after=3, **kwargs)
    split = str(tmp_path / "split")
    run_ranks("elastic", 4, tmp_path / "out-4", run_dir=split, stop_after=2, **kwargs)
    resumed = run_ranks("elastic", 3, tmp_path / "out-3", run_dir=split, stop_after=3, **kwargs)
    assert [r["summary"]["global_step"] for r in resumed] == [3] * 3

    ours, theirs = model_state(tmp_path / "split"), model_state(tmp_path / "full")
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        if name.endswith("num_batches_tracked"):
            assert torch.equal(ours[name], value), name  # one update per step, as the full shape's rank 0
        elif name.endswith(BN_BUFFERS):  # measured: equal to the bit (the same forward of micro-batch 0)
            torch.testing.assert_close(ours[name], value, rtol=1e-3, atol=1e-6, msg=name)
        else:  # one step's gradient summed in another order: float32 rounding (measured 1.2e-07 at most)
            torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-6, msg=name)

"""A checkpoint's fields are judged against the run on resume (trainer/state.py check_fields), its tensors
against what the model and optimizer hold, both before a tensor is allocated: a checkpoint that does not
fit is skipped for the previous one, and a run whose every checkpoint fails stops naming them."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_harness import job_spec, train

from hpctrain.contract.rundir import checkpoints_dir, step_dir_name, summary_path, write_run_info
from hpctrain.errors import CheckpointError
from hpctrain.trainer.checkpoint import CheckpointManager
from tests.checkpoint_crafting import plant_tensor, rewrite

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 3  # per epoch; 2 epochs


def spec_for(data_root: Path) -> Any:
    trainer = {"epochs": 2, "max_steps_per_epoch": STEPS, "deterministic": True}
    return job_spec(data_root, trainer=trainer, checkpoint={"every_steps": 1, "keep_last": 3})


@pytest.fixture(scope="module")
def runs(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A run stopped after step 4 (checkpoints at steps 2, 3 and 4), and an uninterrupted run's summary."""
    base = tmp_path_factory.mktemp("state")
    spec = spec_for(data_root)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_thread does for the resumes: the same summation order, the same weights
    try:
        full = train(base / "full", spec)
        stopped = base / "stopped"
        assert train(stopped, spec, stop_after=4)["global_step"] == 4
    finally:
        torch.set_num_threads(threads)
    write_run_info(stopped, {"global_batch_size": 8})  # what submit records: the run's global batch
    return stopped, full


def edit(**fields: Any) -> Callable[[dict[str, Any]], None]:
    """Set dotted ``fields`` (``progress__epoch=...`` for progress.epoch) in a checkpoint."""

    def apply(state: dict[str, Any]) -> None:
        for dotted, value in fields.items():
            *parents, last = dotted.split("__")
            node = state
            for key in parents:
                node = node[key]
            node[last] = value

    return apply


CASES = {  # the rest of the fields: tests/unit/test_trainer_state.py, on check_fields alone
    "1000-way accumulation": (
        edit(micro_batches=1000),
        "micro_batches is 1000, but this run's global batch is 1 micro-batch of 8 (8 images per step)",
    ),
    "completed without training": (
        edit(progress__epoch=1_000_000_000, progress__epochs_completed=1_000_000_000),
        "progress.epoch is 1000000000; a checkpoint of this run has from 0 to 2 (trainer.epochs is 2)",
    ),
    "sampler past the data": (
        edit(sampler__consumed_samples=10**6),
        "sampler.consumed_samples is 1000000, but progress.step_in_epoch 1 means 8",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_newest_checkpoint_whose_fields_do_not_fit_falls_back_to_the_previous(
    runs: tuple[Path, dict[str, Any]], data_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    stopped, full = runs
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    tamper, said = CASES[case]
    rewrite(checkpoints_dir(run) / step_dir_name(4), tamper)
    with caplog.at_level(logging.INFO):
        last = train(run, spec_for(data_root))
    assert f"skipping unusable checkpoint {run / 'checkpoints' / 'step-00000004'}: {said}" in caplog.text
    assert "trying the previous one" in caplog.text
    assert "resumed from" in caplog.text and "step-00000003" in caplog.text
    assert last["status"] == "completed" and last["global_step"] == 2 * STEPS
    assert last["weights_sha256"] == full["weights_sha256"]  # resumed exactly, one step earlier


@pytest.mark.parametrize("deflated", [True, False], ids=["deflated-record", "pickle-claims-5GiB"])
def test_a_planted_5_gib_tensor_falls_back_before_it_is_allocated(
    runs: tuple[Path, dict[str, Any]], data_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, deflated: bool
) -> None:
    stopped, full = runs
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    newest = checkpoints_dir(run) / step_dir_name(4)
    before = (newest / "state.pt").stat().st_size
    plant_tensor(newest, 5 << 30, deflated=deflated)
    assert (newest / "state.pt").stat().st_size < before + (8 << 20)  # 5 GiB more tensor, at most 8 MB more file
    with caplog.at_level(logging.WARNING):
        last = train(run, spec_for(data_root))
    if deflated:  # refused from the zip's directory
        assert "is compressed" in caplog.text and "inflate to 5368709120" in caplog.text
    else:  # refused from its size, against the budget the model and optimizer give
        assert "its tensors would take 5" in caplog.text and "more than this run's model and optimizer" in caplog.text
    assert last["status"] == "completed" and last["weights_sha256"] == full["weights_sha256"]


def test_when_no_checkpoint_fits_the_run_fails_naming_each_and_keeps_them(
    runs: tuple[Path, dict[str, Any]], data_root: Path, tmp_path: Path
) -> None:
    stopped, _ = runs
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    for step in (2, 3, 4):
        rewrite(checkpoints_dir(run) / step_dir_name(step), edit(progress__epoch=10**9))
    with pytest.raises(CheckpointError) as caught:
        train(run, spec_for(data_root))
    message = caught.value.message
    assert "no usable checkpoint" in message
    assert all(f"step-0000000{step}: progress.epoch is 1000000000" in message for step in (2, 3, 4))
    assert len(CheckpointManager(checkpoints_dir(run)).checkpoints()) == 3  # nothing the user had is lost
    assert json.loads(summary_path(run).read_text())["status"] == "failed"

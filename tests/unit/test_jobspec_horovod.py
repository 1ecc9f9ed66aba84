"""``strategy: horovod`` is refused at validate (without importing torch or horovod) and by the trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.errors import SpecError, TrainingConfigError
from hpctrain.jobspec.horovod import INSTALL_COMMAND, horovod_refusal
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.models import JobSpec
from hpctrain.trainer.strategies import build_strategy


def test_not_installed_says_how_it_was_tried_and_what_to_use() -> None:
    message = horovod_refusal(lambda name: None)
    assert "not installed" in message and INSTALL_COMMAND in message
    assert "HOROVOD_WITH_PYTORCH=1" in message and "trainer.strategy: ddp" in message


def test_installed_is_refused_for_want_of_a_driver() -> None:
    message = horovod_refusal(lambda name: object())
    assert "no Horovod driver" in message and "trainer.strategy: ddp" in message


def test_validate_refuses_it_at_the_strategy_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: a\ndata: {root: /d}\nresources: {gpus_per_node: 4}\ntrainer:\n  strategy: horovod\n")
    with pytest.raises(SpecError) as caught:
        load_job(path)
    [problem] = caught.value.problems
    assert problem.key == "trainer.strategy" and problem.line == 5
    assert "trainer.strategy: ddp" in problem.message


def test_the_trainer_refuses_it_too() -> None:
    spec = JobSpec.model_validate({"name": "a", "trainer": {"strategy": "horovod"}})
    assert spec.tasks_per_node == 1  # no GPUs: like ddp, one task per GPU or one per node
    with pytest.raises(TrainingConfigError, match="horovod") as caught:
        build_strategy(spec).check(None, torch.device("cpu"))  # type: ignore[arg-type]
    assert "ddp" in caught.value.hint

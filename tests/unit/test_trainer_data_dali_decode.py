"""data.decode: dali, with DALI's CPU operators (same graph as on the GPU, 'cpu' instead of 'mixed').

Skipped where DALI is not installed (it is an optional extra).
"""

from __future__ import annotations

import pytest
import torch

from hpctrain.dataset.generate import make_dataset
from hpctrain.jobspec.models import Data
from hpctrain.trainer.data import build_datasets, encoded_datasets
from hpctrain.trainer.data.device_input import to_model_input

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is an optional extra (hpctrain[dali])")

CPU = torch.device("cpu")
# DALI's resampling filter differs a little more from PIL's than torch's does.
MEAN_TOLERANCE = 0.08


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    out = tmp_path_factory.mktemp("data") / "ds"
    make_dataset(out, classes=3, per_class=4, val_per_class=3, image_size=48)
    spec = Data(root=str(out), image_size=32, val_resize=36, workers=0)
    train, val = build_datasets(spec, seed=5)
    return train, val, *encoded_datasets(train, val, spec, "dali")


def _normalised(images: torch.Tensor) -> torch.Tensor:
    return to_model_input(images, CPU, channels_last=False)


def _mean_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (_normalised(a) - _normalised(b)).abs().mean(dim=(1, 2, 3))


def test_dali_training_crops_match_the_cpu_pipeline(datasets: tuple) -> None:
    train, _, encoded_train, _, collate, _ = datasets
    train.set_epoch(2)
    encoded_train.set_epoch(2)
    indices = list(range(len(train)))
    batch, labels = collate([encoded_train[i] for i in indices])
    on_dali = batch.to(CPU)
    on_cpu = torch.stack([train[i][0] for i in indices])
    assert on_dali.shape == on_cpu.shape and labels.tolist() == [train[i][1] for i in indices]
    assert _mean_error(on_dali, on_cpu).max() < MEAN_TOLERANCE
    assert _mean_error(on_dali, on_cpu.roll(1, dims=0)).min() > 2 * MEAN_TOLERANCE


def test_dali_validation_matches_the_cpu_pipeline_and_takes_a_short_last_batch(datasets: tuple) -> None:
    _, val, _, encoded_val, _, val_collate = datasets
    for indices in (list(range(len(val))), [0, 1]):  # the pipeline is built for the largest batch; fewer is fine
        batch, _ = val_collate([encoded_val[i] for i in indices])
        on_dali = batch.to(CPU)
        on_cpu = torch.stack([val[i][0] for i in indices])
        assert _mean_error(on_dali, on_cpu).max() < MEAN_TOLERANCE

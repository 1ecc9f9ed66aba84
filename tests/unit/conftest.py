"""Fixtures shared by the unit tests of the input pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.dataset.generate import make_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated ImageFolder (3 classes, 8 train and 5 val JPEGs each, 40 px), one per test module."""
    out = tmp_path_factory.mktemp("data") / "ds"
    make_dataset(out, classes=3, per_class=8, val_per_class=5, image_size=40)
    return out

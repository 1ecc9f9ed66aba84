"""Small data-spec helper shared by the unit tests of the input pipeline."""

from __future__ import annotations

from pathlib import Path

from hpctrain.spec.models import Data


def data_spec(root: Path, **kwargs: object) -> Data:
    """A ``data`` section over ``root``: 32 px crops, val resized to 36, no loader workers."""
    return Data(**{"root": str(root), "image_size": 32, "val_resize": 36, "workers": 0, **kwargs})

"""Small data-spec helper shared by the unit tests of the input pipeline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import Data
from hpctrain.trainer.data.decode import DECODERS, jpeg_decoder

JPEG_DECODERS = DECODERS  # what the decode tests run over: simplejpeg, turbojpeg, pil


def data_spec(root: Path, **kwargs: object) -> Data:
    """A ``data`` section over ``root``: 32 px crops, val resized to 36, no loader workers."""
    return Data(**{"root": str(root), "image_size": 32, "val_resize": 36, "workers": 0, **kwargs})


def available_jpeg_decoders() -> list[str]:
    """The JPEG decoders this machine has (PIL always)."""
    return [name for name in DECODERS if _missing(name) is None]


def use_jpeg_decoder(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Force hpctrain's JPEG decoder ``name``; skip where it is missing, fail under CI (the test bed has all)."""
    if (why := _missing(name)) is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test the {name} decoder (scripts/install-testbed.sh installs it): {why}")
        pytest.skip(why)
    monkeypatch.setenv("HPCTRAIN_JPEG_DECODER", name)


def _missing(name: str) -> str | None:
    saved = os.environ.get("HPCTRAIN_JPEG_DECODER")
    os.environ["HPCTRAIN_JPEG_DECODER"] = name
    try:
        jpeg_decoder()
        return None
    except TrainingConfigError as exc:
        return exc.message
    finally:
        if saved is None:
            del os.environ["HPCTRAIN_JPEG_DECODER"]
        else:
            os.environ["HPCTRAIN_JPEG_DECODER"] = saved

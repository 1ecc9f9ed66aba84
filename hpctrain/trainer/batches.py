"""Where a loader's batch becomes the model's input: the one place a batch goes to the device.

Training (every strategy, hogwild's workers included) and validation call
:func:`batch_to_device` first. Loaders yield uint8 images (or, with
``data.decode: gpu|dali``, encoded batches that decode on the device); they
become normalised float here, once, for every strategy.
"""

from __future__ import annotations

import torch

from hpctrain.trainer.data.device_input import to_model_input


def batch_to_device(
    images: torch.Tensor, targets: torch.Tensor, device: torch.device, *, channels_last: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, targets) on ``device``: images normalised float32 in the model's memory format
    (see :func:`to_model_input`; uint8 and device-decoded batches alike); copies overlap with compute."""
    images = to_model_input(images, device, channels_last=channels_last)
    return images, targets.to(device, non_blocking=True)

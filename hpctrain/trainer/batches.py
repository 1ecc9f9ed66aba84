"""Where a loader's batch becomes the model's input: the one place a batch goes to the device.

Training (every strategy, hogwild's workers included) and validation call
:func:`batch_to_device` first, so a change of what loaders yield (say, uint8
images normalised on the device) is made here once.
"""

from __future__ import annotations

import torch

from hpctrain.trainer.precision import to_memory_format


def batch_to_device(
    images: torch.Tensor, targets: torch.Tensor, device: torch.device, *, channels_last: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, targets) on ``device``, images in the model's memory format; copies overlap with compute."""
    images = to_memory_format(images.to(device, non_blocking=True), channels_last)
    return images, targets.to(device, non_blocking=True)

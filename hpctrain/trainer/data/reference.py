"""torchvision's ImageNet evaluation transform: the reference the decoders are checked against.

The trainer never uses it (its workers hand over uint8 crops, normalised on the
device by ``device_input``); tests and benchmarks compare with it.
"""

from __future__ import annotations

from torchvision import transforms

from hpctrain.trainer.data.device_input import IMAGENET_MEAN, IMAGENET_STD


def val_transform(image_size: int, resize: int) -> transforms.Compose:
    return transforms.Compose(
        [
            transforms.Resize(resize),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )

"""Crop boxes for training and validation as pure functions of (seed, epoch, index) and the image size.

Torch-free, so a decoder (PIL on the CPU, nvJPEG on the GPU) can pick its box
from the JPEG header before decoding, and decode only what the box needs.
``train_crop`` follows torchvision's ``RandomResizedCrop.get_params`` exactly
(10 tries, then the central fallback) and draws from a local generator, so
the process-wide RNGs are never touched and a resumed job repeats its crops.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

import numpy as np


class CropBox(NamedTuple):
    """A box in the source image's pixels; ``flip``: mirror the output horizontally."""

    top: float
    left: float
    height: float
    width: float
    flip: bool = False


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 63-bit seed for one sample in one epoch."""
    words = np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, epoch, index]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def sample_rng(seed: int, epoch: int, index: int) -> random.Random:
    """The local generator for one sample: every random choice about it comes from here."""
    return random.Random(sample_seed(seed, epoch, index))


def random_resized_crop(
    rng: random.Random,
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """(top, left, height, width): torchvision's RandomResizedCrop.get_params, drawing from ``rng``."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def train_crop(
    seed: int,
    epoch: int,
    index: int,
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> CropBox:
    """The training crop (RandomResizedCrop + RandomHorizontalFlip(0.5)) of sample ``index`` in ``epoch``."""
    rng = sample_rng(seed, epoch, index)
    top, left, h, w = random_resized_crop(rng, width, height, scale, ratio)
    return CropBox(top, left, h, w, rng.random() < 0.5)


def val_crop(width: int, height: int, image_size: int, resize: int) -> CropBox:
    """Resize(resize) then CenterCrop(image_size), as one box in the source image's pixels.

    Matches torchvision: the short side goes to ``resize``, the long side to
    ``int(resize * long / short)``, and the center crop starts at
    ``round((resized - image_size) / 2)``. The box is fractional; resizing the box
    straight to ``image_size`` samples the same points as the two steps did.
    """
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_w, new_h = int(resize * width / height), resize
    sx, sy = width / new_w, height / new_h
    top = int(round((new_h - image_size) / 2.0))
    left = int(round((new_w - image_size) / 2.0))
    return CropBox(top * sy, left * sx, image_size * sy, image_size * sx, False)

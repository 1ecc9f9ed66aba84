"""Decode only what a crop needs: header size, then a DCT-scaled decode, one crop+resize, uint8 CHW out.

JPEG decoding at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, through PIL's
``draft``) costs a fraction of a full decode; the scale is the smallest that
keeps the crop box at least as large as the output, so the final resize is
still a downscale (or the identity) and the result matches the reference up to
resampling noise. Other formats (PNG, ...) decode in full through PIL.
Grayscale and CMYK JPEGs come out as RGB.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

Image.MAX_IMAGE_PIXELS = None  # trusted training data; a huge scan is not a decompression bomb


def header_size(path: str) -> tuple[int, int]:
    """(width, height) from the file's header; PIL reads a few KiB, not the pixels."""
    with Image.open(path) as image:
        return image.size


def decode_crop(path: str, box_fn, out_size: int) -> torch.Tensor:
    """uint8 (3, out_size, out_size): ``box_fn(width, height) -> CropBox`` picks the box from the header size."""
    with Image.open(path) as image:
        width, height = image.size
        box = box_fn(width, height)
        if image.format == "JPEG":
            need = out_size / max(1e-9, min(box.width, box.height))  # the smallest scale keeping box >= out
            if need < 1:
                image.draft("RGB", (math.ceil(width * need), math.ceil(height * need)))
        sx, sy = image.size[0] / width, image.size[1] / height
        if image.mode != "RGB":
            image = image.convert("RGB")
        region = (box.left * sx, box.top * sy, (box.left + box.width) * sx, (box.top + box.height) * sy)
        out = image.resize((out_size, out_size), Image.BILINEAR, box=region)
    if box.flip:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return to_chw_uint8(out)


def to_chw_uint8(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()

"""Decode only what a crop needs: header size, then a DCT-scaled decode, one crop+resize, uint8 CHW out.

JPEG decoding at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling) costs a
fraction of a full decode; the scale is the smallest that
keeps the crop box at least as large as the output, so the final resize is
still a downscale (or the identity) and the result matches the reference up to
resampling noise. Other formats (PNG, ...) decode in full through PIL.
Grayscale and CMYK JPEGs come out as RGB.

Decoder: simplejpeg (libjpeg-turbo's TurboJPEG API, about 1.5-2x faster than
PIL's decode of the same file) when installed and the JPEG is YCbCr or gray;
otherwise PIL with ``draft`` (same scales). simplejpeg has no ppc64le wheels,
so the PIL path is the portable fallback. ``HPCTRAIN_JPEG_DECODER=pil`` forces PIL.

Every path reads the file and checks its header first (``image_guard``): a
file larger than ``data.max_image_pixels`` allows, or one whose header promises
more than its bytes hold, raises ``ImageRefused`` before anything is decoded.
16-bit images (PNG ``I;16``/``I``) are scaled to 8 bits, not clipped.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from hpctrain.trainer.data.augment import CropBox
from hpctrain.trainer.data.image_guard import DEFAULT_MAX_PIXELS, JPEG_SOI, check_jpeg, open_image, read_image_file

try:
    import simplejpeg
except ImportError:  # no wheel for this platform (ppc64le): PIL decodes everything
    simplejpeg = None

Image.MAX_IMAGE_PIXELS = DEFAULT_MAX_PIXELS  # PIL's own guard; image_guard.open_image sets the spec's limit
BoxFn = Callable[[int, int], CropBox]
_SCALES = (8, 4, 2)  # libjpeg-turbo's SIMD-accelerated reductions; 3/8, 5/8, ... are slower than full


def jpeg_decoder() -> str:
    """The decoder ``decode_crop`` uses for plain JPEGs: "simplejpeg" or "pil"."""
    if simplejpeg is not None and os.environ.get("HPCTRAIN_JPEG_DECODER", "").lower() != "pil":
        return "simplejpeg"
    return "pil"


def header_size(path: str) -> tuple[int, int]:
    """(width, height) from the file's header; PIL reads a few KiB, not the pixels."""
    with Image.open(path) as image:
        return image.size


def reduction(box: CropBox, out_size: int) -> int:
    """The largest of 8, 4, 2, 1 that keeps the box at least ``out_size`` on both sides."""
    short = min(box.width, box.height)
    return next((s for s in _SCALES if short / s >= out_size), 1)


def decode_crop(
    path: str, box_fn: BoxFn, out_size: int, whole: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS
) -> torch.Tensor:
    """uint8 (3, out_size, out_size): ``box_fn(width, height) -> CropBox`` picks the box from the header size.

    ``whole``: resize the whole image, then crop (validation; see ``crop_resize``).
    ``ImageRefused`` for a file over the limits (``image_guard``), before any decoding."""
    data = read_image_file(path, max_pixels)
    if data.startswith(JPEG_SOI) and jpeg_decoder() == "simplejpeg":
        check_jpeg(data, max_pixels)
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            colorspace = "unreadable"  # let PIL decide: it reads some files TurboJPEG refuses
        if colorspace in ("YCbCr", "Gray"):
            return _simplejpeg_crop(data, box_fn(width, height), width, height, out_size, whole)
    return _pil_crop(data, box_fn, out_size, whole, max_pixels)


def _simplejpeg_crop(data: bytes, box: CropBox, width: int, height: int, out_size: int, whole: bool) -> torch.Tensor:
    factor = reduction(box, out_size)
    pixels = simplejpeg.decode_jpeg(
        data, "RGB", fastdct=False, min_height=math.ceil(height / factor), min_width=math.ceil(width / factor)
    )  # fastdct=False: libjpeg's accurate IDCT, PIL's; the fast one shifts colours (R, B about -1.2/255 on average)
    return crop_resize(pixels, box, width, height, out_size, whole)


def crop_resize(
    pixels: np.ndarray, box: CropBox, width: int, height: int, out_size: int, whole: bool = False
) -> torch.Tensor:
    """uint8 CHW: ``box`` (in the ``width`` x ``height`` source) of the decoded HWC ``pixels``, resized and flipped.

    torch's uint8 antialiased bilinear resize on a channels-last view (the
    algorithm PIL uses, vectorised: about 3x faster than PIL's resize). Box
    edges are rounded to the decoded image's pixels: exact when no DCT
    reduction was used, under half a decoded pixel off otherwise.

    ``whole=True`` (validation: ``val_crop``'s fractional box) resizes the whole
    image by the box's scale and crops the box from that, i.e. torchvision's
    Resize + CenterCrop step for step, so the box's fractional edges are kept
    (rounding them zooms small images: 56.9 -> 56 px at 64/72 is 1.6 %).
    """
    with warnings.catch_warnings():  # PIL's array is read-only; it is only read here
        warnings.simplefilter("ignore", UserWarning)
        image = torch.from_numpy(pixels).permute(2, 0, 1)[None]  # channels-last view
    top, left, bottom, right, resized = pixel_box(box, width, height, pixels.shape[1], pixels.shape[0], out_size, whole)
    if resized is None:
        region = image[:, :, top:bottom, left:right]
        out = torch.nn.functional.interpolate(region, size=(out_size, out_size), mode="bilinear", antialias=True)[0]
    else:
        out = torch.nn.functional.interpolate(image, size=resized, mode="bilinear", antialias=True)[0]
        out = out[:, top:bottom, left:right]
    if box.flip:
        out = out.flip(-1)
    return out.contiguous()


def pixel_box(
    box: CropBox, width: int, height: int, image_w: int, image_h: int, out_size: int, whole: bool = False
) -> tuple[int, int, int, int, tuple[int, int] | None]:
    """(top, left, bottom, right, resized): where ``box`` (in the ``width`` x ``height`` source) lies in pixels.

    ``resized`` None: the box's edges in the ``image_w`` x ``image_h`` decoded image,
    rounded, to be resized to ``out_size``. Otherwise ``(h, w)``: the size to resize the
    whole image to, and the edges are an ``out_size`` square in that resized image.
    Shared with the device decoders (``device_decode``).
    """
    sx, sy = image_w / width, image_h / height
    if whole:
        zx, zy = out_size / (box.width * sx), out_size / (box.height * sy)  # resized px per decoded px
        resized = (max(out_size, round(image_h * zy)), max(out_size, round(image_w * zx)))
        top = min(resized[0] - out_size, max(0, round(box.top * sy * zy)))
        left = min(resized[1] - out_size, max(0, round(box.left * sx * zx)))
        return top, left, top + out_size, left + out_size, resized
    left, top = round(box.left * sx), round(box.top * sy)
    right = max(left + 1, min(image_w, round((box.left + box.width) * sx)))
    bottom = max(top + 1, min(image_h, round((box.top + box.height) * sy)))
    return top, left, bottom, right, None


def _pil_crop(data: bytes, box_fn: BoxFn, out_size: int, whole: bool, max_pixels: int) -> torch.Tensor:
    with open_image(data, max_pixels) as image:
        width, height = image.size
        box = box_fn(width, height)
        factor = reduction(box, out_size)
        if image.format == "JPEG" and factor > 1:
            image.draft("RGB", (math.ceil(width / factor), math.ceil(height / factor)))
        pixels = rgb_pixels(image)
    return crop_resize(pixels, box, width, height, out_size, whole)


def rgb_pixels(image: Image.Image) -> np.ndarray:
    """uint8 HWC RGB of any image PIL opens: 16-bit and 32-bit integer grey scaled to 8 bits (PIL's
    ``convert`` clips them, so a 16-bit PNG comes out white); grey, CMYK, palette, RGBA converted."""
    if image.mode in ("I", "I;16", "I;16L", "I;16B", "I;16N"):
        wide = np.asarray(image).astype(np.int64, copy=False)
        grey = ((np.clip(wide, 0, 65535) + 128) // 257).astype(np.uint8)  # 65535 -> 255, 257 k -> k
        return np.repeat(grey[:, :, None], 3, axis=2)
    if image.mode != "RGB":
        image = image.convert("RGB")  # grayscale, CMYK (Adobe-inverted too), palette, RGBA
    return np.asarray(image)

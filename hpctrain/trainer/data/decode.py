"""Decode only what a crop needs: header size, then a DCT-scaled decode, one crop+resize, uint8 CHW out.

JPEG decoding at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling) costs a
fraction of a full decode; the scale is the smallest that
keeps the crop box at least as large as the output, so the final resize is
still a downscale (or the identity) and the result matches the reference up to
resampling noise. Other formats (PNG, ...) decode in full through PIL.
Grayscale and CMYK JPEGs come out as RGB.

Decoder for plain JPEGs (``jpeg_decoder``), the first this machine has:
simplejpeg (libjpeg-turbo's TurboJPEG API, wheels for x86_64 and aarch64), then
libjpeg-turbo's own ``libturbojpeg`` through PyTurboJPEG (ppc64le and any
platform without simplejpeg wheels; probed once), then PIL with ``draft``
(same scales; about 1.5x slower per core). ``HPCTRAIN_JPEG_DECODER`` =
simplejpeg | turbojpeg | pil forces one. The TurboJPEG decoders take YCbCr and
grey JPEGs; CMYK and others go to PIL.

Every path reads the file and checks its header first (``image_guard``): a
file larger than ``data.max_image_pixels`` allows, or one whose header promises
more than its bytes hold, raises ``ImageRefused`` before anything is decoded.
16-bit images (PNG ``I;16``/``I``) are scaled to 8 bits, not clipped.
"""

from __future__ import annotations

import functools
import io
import logging
import math
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.data.augment import CropBox
from hpctrain.trainer.data.image_guard import DEFAULT_MAX_PIXELS, JPEG_SOI, check_jpeg, open_image, read_image_file

try:
    import simplejpeg
except ImportError:  # no wheel for this platform (ppc64le): PIL decodes everything
    simplejpeg = None

Image.MAX_IMAGE_PIXELS = DEFAULT_MAX_PIXELS  # PIL's own guard; image_guard.open_image sets the spec's limit
BoxFn = Callable[[int, int], CropBox]
WIDE_BAND_PIXELS = 1 << 20  # pixels of a 16/32-bit grey image converted at a time (about 8 MB of temporaries)
_SCALES = (8, 4, 2)  # libjpeg-turbo's SIMD-accelerated reductions; 3/8, 5/8, ... are slower than full
DECODERS = ("simplejpeg", "turbojpeg", "pil")
DECODER_ENV = "HPCTRAIN_JPEG_DECODER"
TURBOJPEG_FIX = (
    "install libjpeg-turbo's TurboJPEG library (Debian/Ubuntu: apt install libturbojpeg0; RHEL: dnf install "
    "turbojpeg; conda: conda install -c conda-forge libjpeg-turbo) and pip install 'hpctrain[turbojpeg]'"
)
_TJPF_RGB, _TJFLAG_ACCURATEDCT = 0, 4096  # turbojpeg.h; the same in PyTurboJPEG 1.x and 2.x
_TJCS_DECODED = frozenset({1, 2})  # TJCS_YCbCr, TJCS_GRAY: what TurboJPEG turns into RGB itself
log = logging.getLogger(__name__)


def jpeg_decoder() -> str:
    """The decoder ``decode_crop`` uses for plain JPEGs: one of ``DECODERS``.

    ``HPCTRAIN_JPEG_DECODER`` if set, else the fastest this machine has. A value
    that is not a decoder, or names one that is missing here, is a
    ``TrainingConfigError`` with the fix (``build_datasets`` asks once at start).
    """
    wanted = os.environ.get(DECODER_ENV, "").strip().lower()
    if not wanted:
        return "simplejpeg" if simplejpeg is not None else "turbojpeg" if turbojpeg_status()[0] else "pil"
    if wanted not in DECODERS:
        raise TrainingConfigError(
            f"{DECODER_ENV}={wanted[:40]!r} is not a JPEG decoder",
            hint=f"set it to one of {', '.join(DECODERS)}, or unset it to use the fastest installed",
        )
    if wanted == "simplejpeg" and simplejpeg is None:
        raise TrainingConfigError(
            f"{DECODER_ENV}=simplejpeg, but simplejpeg is not installed",
            hint="pip install simplejpeg (wheels for x86_64 and aarch64), or unset it",
        )
    if wanted == "turbojpeg" and not turbojpeg_status()[0]:
        raise TrainingConfigError(f"{DECODER_ENV}=turbojpeg, but {turbojpeg_status()[1]}", hint=TURBOJPEG_FIX)
    return wanted


@functools.cache
def turbojpeg_status() -> tuple[Any, str]:
    """(a working PyTurboJPEG ``TurboJPEG``, "") or (None, why not): loads libturbojpeg once and decodes a tiny JPEG.

    PyTurboJPEG 1.x speaks the TurboJPEG API of libjpeg-turbo 1.4 to 3.x; 2.x
    needs libjpeg-turbo >= 3.0 (most distributions ship 2.1), hence the extra's ``<2``.
    """
    try:
        import turbojpeg
    except ImportError:
        return None, "PyTurboJPEG is not installed"
    version = getattr(turbojpeg, "__version__", "?")
    try:
        decoder = turbojpeg.TurboJPEG()
        tiny = io.BytesIO()
        Image.new("RGB", (16, 16), (120, 60, 30)).save(tiny, format="JPEG")
        decoder.decode(tiny.getvalue(), pixel_format=_TJPF_RGB, scaling_factor=(1, 2), flags=_TJFLAG_ACCURATEDCT)
    except Exception as exc:  # noqa: BLE001 - no .so (OSError/RuntimeError), an old or new one (RuntimeError), ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"PyTurboJPEG {version} cannot use libturbojpeg ({reason[:200]})"
    return decoder, ""


def _warn_if_pil_only() -> None:
    """One line at import where JPEGs would silently take the slow path (no simplejpeg, no libturbojpeg)."""
    if simplejpeg is not None or os.environ.get(DECODER_ENV, "").strip().lower() == "pil":
        return
    decoder, why = turbojpeg_status()
    if decoder is None:
        log.warning(
            "hpctrain: JPEGs are decoded by PIL (about 1.5x slower per core): simplejpeg is not installed and %s; "
            "fix: %s",
            why,
            TURBOJPEG_FIX,
        )


_warn_if_pil_only()


def header_size(path: str) -> tuple[int, int]:
    """(width, height) from the file's header; PIL reads a few KiB, not the pixels."""
    with Image.open(path) as image:
        return image.size


def reduction(box: CropBox, out_size: int) -> int:
    """The largest of 8, 4, 2, 1 that keeps the box at least ``out_size`` on both sides."""
    short = min(box.width, box.height)
    return next((s for s in _SCALES if short / s >= out_size), 1)


def decode_crop(
    path: str,
    box_fn: BoxFn,
    out_size: int,
    whole: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    *,
    follow_links: bool = True,
) -> torch.Tensor:
    """uint8 (3, out_size, out_size): ``box_fn(width, height) -> CropBox`` picks the box from the header size.

    ``whole``: resize the whole image, then crop (validation; see ``crop_resize``).
    ``ImageRefused`` for a file over the limits (``image_guard``), before any decoding, and for a
    symlink when ``follow_links`` is False (a packed image's tree)."""
    data = read_image_file(path, max_pixels, follow_links=follow_links)
    if data.startswith(JPEG_SOI) and (decoder := jpeg_decoder()) != "pil":
        check_jpeg(data, max_pixels)
        fast = _simplejpeg_crop if decoder == "simplejpeg" else _turbojpeg_crop
        if (out := fast(data, box_fn, out_size, whole)) is not None:
            return out
    return _pil_crop(data, box_fn, out_size, whole, max_pixels)


def _simplejpeg_crop(data: bytes, box_fn: BoxFn, out_size: int, whole: bool) -> torch.Tensor | None:
    """None for a JPEG it leaves to PIL (CMYK, RGB, one TurboJPEG cannot parse)."""
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None  # let PIL decide: it reads some files TurboJPEG refuses
    if colorspace not in ("YCbCr", "Gray"):
        return None
    box = box_fn(width, height)
    factor = reduction(box, out_size)
    pixels = simplejpeg.decode_jpeg(
        data, "RGB", fastdct=False, min_height=math.ceil(height / factor), min_width=math.ceil(width / factor)
    )  # fastdct=False: libjpeg's accurate IDCT, PIL's; the fast one shifts colours (R, B about -1.2/255 on average)
    return crop_resize(pixels, box, width, height, out_size, whole)


def _turbojpeg_crop(data: bytes, box_fn: BoxFn, out_size: int, whole: bool) -> torch.Tensor | None:
    """The simplejpeg path through PyTurboJPEG: same scale, accurate IDCT, warnings (corrupt data) are errors."""
    decoder = turbojpeg_status()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTurboJPEG only warns where libjpeg recovers (a grey remainder)
        try:
            width, height, _, colorspace = decoder.decode_header(data)
        except (OSError, UserWarning):
            return None  # let PIL decide, as for simplejpeg
        if colorspace not in _TJCS_DECODED:
            return None
        box = box_fn(width, height)
        factor = reduction(box, out_size)
        try:
            pixels = decoder.decode(
                data, _TJPF_RGB, scaling_factor=None if factor == 1 else (1, factor), flags=_TJFLAG_ACCURATEDCT
            )
        except UserWarning as exc:  # truncated or corrupt: an error, as in simplejpeg and PIL
            raise ValueError(f"corrupt JPEG: {exc}") from None
    return crop_resize(pixels, box, width, height, out_size, whole)


def crop_resize(
    pixels: np.ndarray, box: CropBox, width: int, height: int, out_size: int, whole: bool = False
) -> torch.Tensor:
    """uint8 CHW: ``box`` (in the ``width`` x ``height`` source) of the decoded HWC ``pixels``, resized and flipped.

    torch's uint8 antialiased bilinear resize on a channels-last view (the
    algorithm PIL uses, vectorised: about 3x faster than PIL's resize). The box
    is copied to a contiguous channels-last tensor first: a strided crop falls
    off the vectorised uint8 path (same pixels, about 1.5x slower). Box
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
        region = image[:, :, top:bottom, left:right].contiguous(memory_format=torch.channels_last)  # see below
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
        return _wide_grey_rgb(image)
    if image.mode != "RGB":
        image = image.convert("RGB")  # grayscale, CMYK (Adobe-inverted too), palette, RGBA
    return np.asarray(image)


def _wide_grey_rgb(image: Image.Image) -> np.ndarray:
    """16/32-bit grey as uint8 RGB, (v + 128) // 257 of v clipped to 0..65535 (65535 -> 255, 257 k -> k).

    A band of rows of ``WIDE_BAND_PIXELS`` at a time: the one full-size array is the uint8
    result (3 bytes a pixel, the decode budget), never a wide copy of the image (an
    int64 one cost 8 bytes a pixel, and its arithmetic three more such arrays).
    """
    width, height = image.size
    out = np.empty((height, width, 3), dtype=np.uint8)
    rows = max(1, WIDE_BAND_PIXELS // max(1, width))
    for top in range(0, height, rows):
        band = np.asarray(image if rows >= height else image.crop((0, top, width, min(height, top + rows))))
        if band.dtype.kind == "i":  # int32 "I" may hold anything
            band = np.clip(band, 0, 65535)
        wide = band.astype(np.uint32)
        wide += 128
        wide //= 257
        out[top : top + band.shape[0]] = wide[:, :, None]  # 0..255: the cast to uint8 is exact
    return out


def crop_resize_flip(image: torch.Tensor, box: Sequence[float], image_size: int, whole: bool = False) -> torch.Tensor:
    """One uint8 CHW image -> its box, resized to image_size square (antialiased bilinear), maybe flipped.

    Pixels as ``decode.crop_resize`` (the CPU path) picks them (``decode.pixel_box``): the box's edges
    rounded to whole pixels, or with ``whole`` (validation) the whole image resized and the box cropped.
    """
    from torchvision.transforms.v2 import functional as F

    top_f, left_f, height_f, width_f, flip = (float(v) for v in box)
    box_ = CropBox(top_f, left_f, height_f, width_f, bool(flip))
    width, height = image.shape[-1], image.shape[-2]
    top, left, bottom, right, resized = pixel_box(box_, width, height, width, height, image_size, whole)
    if resized is None:
        out = F.resized_crop(image, top, left, bottom - top, right - left, [image_size, image_size], antialias=True)
    else:
        out = F.resize(image, list(resized), antialias=True)[..., top:bottom, left:right]
    return out.flip(-1) if flip else out

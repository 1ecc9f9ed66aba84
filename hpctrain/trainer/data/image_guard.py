"""Bounded decoding: what an image file claims is checked before any decoder allocates for it.

A header is a promise the decoder pays for in advance. A 7 KB progressive JPEG
whose frame header says 65000 x 65000 makes libjpeg allocate the whole image's
DCT coefficients (W x H x components x 2 bytes, 25 GB here, whatever the DCT
scale) before it reads one scan; a 4 MB PNG of 65000 x 65000 decodes into
12.7 GB. Either kills a loader worker, and, since the same sample comes back
after a resume, every resume. So every decoder path (simplejpeg, PIL, the
device decoders' CPU side) reads the file through ``read_image_file`` and the
header through ``check_jpeg``/``open_image`` first, and a file that fails is
refused with ``ImageRefused``; the datasets skip, count and name it.

The limits, from ``data.max_image_pixels`` (P, default 2**27 = 134 MP, e.g.
16384 x 8192; ImageNet's largest images are about 48 MP):

* at most P pixels (decoded RGB: 3 bytes each, 384 MiB at the default);
* a JPEG that libjpeg must buffer whole (progressive, lossless, or a first
  scan without every component) at most 3 x P bytes of coefficients, i.e.
  W x H x components x 2 <= 3 x P (half of P for a colour JPEG);
* a file at most 3 x P bytes (never more than its own decoded pixels);
* a Huffman-coded JPEG at least one bit per 8 x 8 block: a file that claims
  more blocks than its bytes can hold is truncated or has patched
  dimensions (libjpeg fills the rest with grey, and PIL decodes it so silently);
* a JPEG at most ``MAX_SCANS`` scans, and scans x pixels at most
  ``SCAN_WORK`` x P. Each scan is one more pass over the image's
  coefficients, whatever the DCT scale: a 120 KB file of 10,000 tiny scans
  (each one an end-of-band run) decodes for seconds to minutes, in every
  decoder (simplejpeg and PyTurboJPEG decode it all before they report the
  bogus progression; PIL decodes it silently). Encoders write 1 to 3 scans
  (baseline) or about 10 (progressive); libjpeg-turbo's own limit, where a
  caller asks for one, is 500. Scans are counted in the bytes (``FF DA``
  can only be a marker after the first scan header: entropy-coded data stuffs
  every ``FF``), so the count costs a ``bytes.count``, not a decode.

Nothing here imports torch.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpctrain.jobspec.models import MAX_IMAGE_PIXELS

if TYPE_CHECKING:
    from PIL import Image as PILImage

DEFAULT_MAX_PIXELS = MAX_IMAGE_PIXELS
BYTES_PER_PIXEL = 3  # decoded RGB; also the coefficient and file budgets per allowed pixel
JPEG_SOI = b"\xff\xd8"
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # DHT, JPG and DAC share the range
_HUFFMAN_SEQUENTIAL_OR_PROGRESSIVE = frozenset({0xC0, 0xC1, 0xC2, 0xC3})
_BUFFERED = frozenset({0xC2, 0xC3, 0xC6, 0xC7, 0xCA, 0xCB, 0xCE, 0xCF})  # progressive and lossless processes
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: no length field
_MAX_SEGMENTS = 4096  # real files have a few dozen before the first scan
_SOS = b"\xff\xda"
MAX_SCANS = 100
SCAN_WORK = 16  # scans x pixels per allowed pixel: a 10-scan progressive JPEG at the coefficient limit is 5


class ImageRefused(ValueError):
    """An image file that is not decoded: larger than the limits, or its header promises more than it holds."""


@dataclass(frozen=True)
class JpegFrame:
    """What a JPEG's frame header (SOFn) and first scan header (SOS) say."""

    marker: int  # 0xC0 baseline, 0xC2 progressive, ...
    width: int
    height: int
    sampling: tuple[tuple[int, int], ...]  # (horizontal, vertical) factor of each component
    first_scan_components: int
    scans: int = 1  # SOS markers from the first scan header on

    @property
    def components(self) -> int:
        return len(self.sampling)

    @property
    def buffered(self) -> bool:
        """libjpeg keeps every coefficient of the image in memory (a multi-scan image)."""
        return self.marker in _BUFFERED or self.first_scan_components < self.components

    def blocks(self) -> int:
        """8 x 8 blocks over all components (each component's size follows its sampling factors)."""
        h_max = max(h for h, _ in self.sampling)
        v_max = max(v for _, v in self.sampling)
        total = 0
        for h, v in self.sampling:
            width, height = -(-self.width * h // h_max), -(-self.height * v // v_max)
            total += -(-width // 8) * -(-height // 8)
        return total

    def min_bytes(self) -> int:
        """The fewest bytes a Huffman-coded image of this size can have: one bit per block (0 for other codings)."""
        return self.blocks() // 8 if self.marker in _HUFFMAN_SEQUENTIAL_OR_PROGRESSIVE else 0


def max_file_bytes(max_pixels: int) -> int:
    return BYTES_PER_PIXEL * max_pixels


def read_image_file(path: str, max_pixels: int = DEFAULT_MAX_PIXELS, *, follow_links: bool = True) -> bytes:
    """The file's bytes: a regular file of at most ``max_file_bytes``, or ``ImageRefused``.

    Opened non-blocking, so a FIFO named like an image cannot hang the worker;
    the read is bounded even if the file grows meanwhile. ``follow_links`` False
    (a packed image's tree): a file that is a symlink is refused, never read
    from wherever it points on this machine.
    """
    limit = max_file_bytes(max_pixels)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise ImageRefused("a symlink inside a packed image: not followed onto this machine") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ImageRefused("not a regular file")
        if info.st_size > limit:
            raise ImageRefused(
                f"the file has {_size(info.st_size)}, more than the {_size(limit)} that data.max_image_pixels "
                f"({max_pixels}) allows at 3 bytes per pixel"
            )
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ImageRefused(f"the file grew past {_size(limit)} while it was read")
    return data


def check_pixels(width: int, height: int, max_pixels: int) -> None:
    """``ImageRefused`` unless 0 < width x height <= ``max_pixels``."""
    if width <= 0 or height <= 0:
        raise ImageRefused(f"the header claims an empty image ({width} x {height})")
    if width * height > max_pixels:
        raise ImageRefused(
            f"the header claims {width} x {height} = {_mp(width * height)}, more than data.max_image_pixels "
            f"({max_pixels})"
        )


def check_jpeg(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> JpegFrame:
    """The JPEG's frame, checked against the limits (module docstring); ``ImageRefused`` otherwise."""
    frame = jpeg_frame(data)
    if frame is None:
        raise ImageRefused("no JPEG frame header before the first scan (not a JPEG, or a corrupt one)")
    check_pixels(frame.width, frame.height, max_pixels)
    coefficients = frame.width * frame.height * frame.components * 2
    if frame.buffered and coefficients > BYTES_PER_PIXEL * max_pixels:
        kind = "progressive" if frame.marker in (0xC2, 0xC6, 0xCA, 0xCE) else "multi-scan"
        raise ImageRefused(
            f"a {kind} JPEG of {frame.width} x {frame.height} x {frame.components} components: its coefficients "
            f"need {_size(coefficients)} whatever the scale, more than {_size(BYTES_PER_PIXEL * max_pixels)} "
            f"(3 bytes x data.max_image_pixels)"
        )
    if frame.scans > MAX_SCANS or frame.scans * frame.width * frame.height > SCAN_WORK * max_pixels:
        raise ImageRefused(
            f"a JPEG of {frame.scans} scans at {frame.width} x {frame.height}: each scan is one more pass over the "
            f"whole image, whatever the scale; at most {MAX_SCANS} scans and {SCAN_WORK} x data.max_image_pixels "
            f"({max_pixels}) scan pixels are decoded (encoders write about 10)"
        )
    if len(data) < frame.min_bytes():
        raise ImageRefused(
            f"the header claims {frame.width} x {frame.height} but the file holds only {_size(len(data))}, "
            f"less than the {_size(frame.min_bytes())} that many blocks need (truncated, or altered dimensions)"
        )
    return frame


def jpeg_frame(data: bytes) -> JpegFrame | None:
    """The frame and first-scan headers of a JPEG (markers walked from SOI to SOS), or None."""
    if not data.startswith(JPEG_SOI):
        return None
    i, frame, end = 2, None, len(data)
    for _ in range(_MAX_SEGMENTS):
        i = data.find(b"\xff", i)  # libjpeg skips stray bytes between segments too
        if i < 0:
            return None
        while i < end and data[i] == 0xFF:  # fill bytes
            i += 1
        if i + 2 >= end:
            return None
        marker, i = data[i], i + 1
        if marker in _STANDALONE or marker in (0x00, 0xD8):
            continue
        if marker == 0xD9:
            return None
        length = int.from_bytes(data[i : i + 2], "big")
        segment = data[i + 2 : i + length]
        if length < 2 or len(segment) != length - 2:
            return None
        if marker in _SOF and frame is None:
            frame = _frame(marker, segment)
            if frame is None:
                return None
        elif marker == 0xDA:
            if frame is None or not segment:
                return None
            scans = 1 + data.count(_SOS, i + length)
            return JpegFrame(frame.marker, frame.width, frame.height, frame.sampling, segment[0], scans)
        i += length
    return None


def _frame(marker: int, segment: bytes) -> JpegFrame | None:
    if len(segment) < 6:
        return None
    height, width, count = int.from_bytes(segment[1:3], "big"), int.from_bytes(segment[3:5], "big"), segment[5]
    if count == 0 or len(segment) < 6 + 3 * count:
        return None
    sampling = tuple((segment[7 + 3 * k] >> 4, segment[7 + 3 * k] & 15) for k in range(count))
    if any(h == 0 or v == 0 for h, v in sampling):
        return None
    return JpegFrame(marker, width, height, sampling, count)


def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> PILImage.Image:
    """The image opened lazily by PIL (no pixels decoded yet), its size checked; ``ImageRefused`` otherwise.

    PIL's own decompression-bomb guard is set to the same limit, so a path that
    opens images elsewhere is bounded too.
    """
    from PIL import Image

    if data.startswith(JPEG_SOI):
        check_jpeg(data, max_pixels)
    Image.MAX_IMAGE_PIXELS = max_pixels
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # checked below, with a clearer message
        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as exc:
            raise ImageRefused(f"the header claims over twice data.max_image_pixels ({max_pixels}): {exc}") from None
    try:
        check_pixels(*image.size, max_pixels)
    except ImageRefused:
        image.close()
        raise
    return image


def _mp(pixels: int) -> str:
    return f"{pixels / 1e6:.0f} MP" if pixels >= 10**6 else f"{pixels} pixels"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"

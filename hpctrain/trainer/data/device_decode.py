"""Decoding on the task's GPU: loader workers only read bytes and draw crop boxes.

With ``data.decode: gpu`` (or ``dali``) a sample is the file's encoded bytes,
its crop box and flip, and its label. The box is drawn in the worker by the
same pure function of (seed, epoch, index) as the CPU pipeline's crop, so
order, augmentation and exact resume do not depend on where decoding runs.
A batch reaches the device as an ``EncodedBatch``; its ``to(device)`` (called
by ``device_input.to_model_input``, as for any batch) decodes it with nvJPEG,
crops each image to its box, resizes to ``image_size`` (bilinear,
antialiased) and flips, giving the uint8 NCHW batch the CPU path gives;
``device_input.to_model_input`` normalises both alike.

Files nvJPEG cannot take (PNG, CMYK or otherwise odd JPEGs) are decoded by
PIL in the worker instead and only cropped on the device: one odd file never
fails a batch. The worker reads and checks every file as the CPU path does
(``image_guard``), so nothing over ``data.max_image_pixels`` reaches a decoder.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from PIL import Image

from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.data.augment import CropBox, val_crop
from hpctrain.trainer.data.datasets import TrainImages, ValImages
from hpctrain.trainer.data.decode import crop_resize_flip, rgb_pixels
from hpctrain.trainer.data.image_guard import DEFAULT_MAX_PIXELS, open_image, read_image_file
from hpctrain.trainer.data.index import DatasetIndex

DeviceBackend = Literal["gpu", "dali"]
JPEG_MAGIC = b"\xff\xd8\xff"
# The box columns of a batch: crop top, left, height, width (source pixels) and horizontal flip (0/1).
BOX_FIELDS = ("top", "left", "height", "width", "flip")


def header_size(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int, bool]:
    """(height, width, nvjpeg_can_decode) from the file header alone (PIL reads no pixels here);
    ``ImageRefused`` for a file over the limits (``image_guard``)."""
    with open_image(data, max_pixels) as image:
        width, height = image.size
        gpu_ok = data.startswith(JPEG_MAGIC) and image.format == "JPEG" and image.mode in ("RGB", "L")
    return height, width, gpu_ok


def pil_decode(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> torch.Tensor:
    """Any image PIL reads, as uint8 RGB CHW (the fallback for what nvJPEG cannot decode)."""
    with open_image(data, max_pixels) as image:
        array = rgb_pixels(image)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


class _EncodedLoad:
    """Mixin over TrainImages/ValImages: the sample is (payload, box) instead of decoded pixels.

    The payload is the file's bytes (1-D uint8) or, for a file nvJPEG cannot
    decode, the PIL-decoded image (3-D uint8 CHW). The box comes from the
    same ``train_crop``/``val_crop`` as the CPU pipeline's, so order, crops,
    bad-file replacement and exact resume are the parent's.
    """

    image_size: int
    max_pixels: int
    index: DatasetIndex

    def load(self, path: str, box_for: Callable[[int, int], CropBox]) -> tuple[torch.Tensor, torch.Tensor]:
        data = read_image_file(path, self.max_pixels, follow_links=self.index.follow_links)
        height, width, gpu_ok = header_size(data, self.max_pixels)
        box = box_for(width, height)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if gpu_ok else pil_decode(data, self.max_pixels)
        return payload, _box_tensor(box)

    def blank(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A skipped validation sample: a decoded blank image and its val box (never scored)."""
        size = self.image_size
        return torch.zeros((3, size, size), dtype=torch.uint8), _box_tensor(val_crop(size, size, size, size))


def _box_tensor(box: CropBox) -> torch.Tensor:
    return torch.tensor([box.top, box.left, box.height, box.width, float(box.flip)], dtype=torch.float64)


class EncodedTrainImages(_EncodedLoad, TrainImages):
    """TrainImages whose samples are decoded on the device."""


class EncodedValImages(_EncodedLoad, ValImages):
    """ValImages whose samples are decoded on the device."""


@dataclass
class EncodedBatch:
    """A batch still encoded; ``to(device)`` decodes, augments and normalises it there.

    Duck-types the one tensor method the training and evaluation loops call on
    their images, so they need no decode-specific code.
    """

    payloads: list[torch.Tensor]
    boxes: torch.Tensor  # [N, 5] float64, columns BOX_FIELDS (augment.CropBox)
    image_size: int
    backend: DeviceBackend = "gpu"
    resize: int | None = None  # validation: Resize(resize) + CenterCrop(image_size) (boxes are val_crop's)
    max_pixels: int = DEFAULT_MAX_PIXELS  # data.max_image_pixels, for the PIL fallback

    def __len__(self) -> int:
        return len(self.payloads)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.payloads), 3, self.image_size, self.image_size)

    def pin_memory(self) -> EncodedBatch:
        return self  # bytes are copied to nvJPEG by the decoder; nothing to gain from pinning them

    def to(self, device: torch.device | str, non_blocking: bool = False) -> torch.Tensor:
        """uint8 NCHW on ``device``, like a CPU-decoded batch after its copy (device_input normalises both)."""
        return self.decode(torch.device(device))

    def decode(self, device: torch.device) -> torch.Tensor:
        """uint8 NCHW on ``device``: decoded, cropped to each box, resized, flipped."""
        if self.backend == "dali":
            from hpctrain.trainer.data.dali_decode import dali_decode_batch

            return dali_decode_batch(self.payloads, self.boxes, self.image_size, device, self.resize)
        return decode_batch(self.payloads, self.boxes, self.image_size, device, self.resize, self.max_pixels)


class EncodedCollate:
    """DataLoader ``collate_fn``: keeps the byte tensors as a list (they differ in length)."""

    def __init__(
        self,
        image_size: int,
        backend: DeviceBackend = "gpu",
        resize: int | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.image_size = image_size
        self.backend = backend
        self.resize = resize
        self.max_pixels = max_pixels

    def __call__(
        self, samples: list[tuple[tuple[torch.Tensor, torch.Tensor], int]]
    ) -> tuple[EncodedBatch, torch.Tensor]:
        payloads = [payload for (payload, _), _ in samples]
        boxes = torch.stack([box for (_, box), _ in samples]) if samples else torch.empty((0, 5), dtype=torch.float64)
        labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
        batch = EncodedBatch(payloads, boxes, self.image_size, self.backend, self.resize, self.max_pixels)
        return batch, labels


def decode_batch(
    payloads: list[torch.Tensor],
    boxes: torch.Tensor,
    image_size: int,
    device: torch.device,
    resize: int | None = None,  # set for validation: the whole image is resized, then the box cropped
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> torch.Tensor:
    """Decode the encoded payloads in one batched nvJPEG call (CPU libjpeg on a CPU device),
    then crop/resize/flip every image to its box, uint8 [N, 3, image_size, image_size] on ``device``.
    Validation boxes are ``val_crop``'s: Resize(resize) + CenterCrop(image_size) as one box."""
    out = torch.empty((len(payloads), 3, image_size, image_size), dtype=torch.uint8, device=device)
    encoded = [i for i, payload in enumerate(payloads) if payload.dim() == 1]
    decoded = dict(zip(encoded, decode_jpegs([payloads[i] for i in encoded], device, max_pixels)))
    for i, payload in enumerate(payloads):
        image = decoded[i] if i in decoded else payload.to(device, non_blocking=True)
        out[i] = crop_resize_flip(image, boxes[i].tolist(), image_size, whole=resize is not None)
    return out


def decode_jpegs(
    payloads: list[torch.Tensor], device: torch.device, max_pixels: int = DEFAULT_MAX_PIXELS
) -> list[torch.Tensor]:
    """uint8 RGB CHW images on ``device``; one batched call, image by image if the batch fails.

    A file that neither nvJPEG nor libjpeg accepts goes through PIL, so the
    batch still completes (PIL raises only for a file no decoder can read).
    """
    if not payloads:
        return []
    decode, rgb = jpeg_decoder()
    try:
        return list(decode(payloads, mode=rgb, device=device))
    except RuntimeError:
        images = []
        for payload in payloads:
            try:
                images.append(decode([payload], mode=rgb, device=device)[0])
            except RuntimeError:
                images.append(pil_decode(payload.numpy().tobytes(), max_pixels).to(device))
        return images


def jpeg_decoder() -> tuple[Callable[..., Any], Any]:
    """(decode_jpeg, RGB mode): torchcodec's if installed (torchvision 0.29 deprecates its own), else torchvision's."""
    try:
        from torchcodec.decoders import decode_jpeg  # type: ignore[import-not-found]

        return decode_jpeg, "RGB"
    except (ImportError, RuntimeError, OSError):  # not installed, or its FFmpeg/CUDA libraries are missing
        pass
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as tv_decode_jpeg

    def decode(payloads: list[torch.Tensor], mode: Any, device: torch.device) -> list[torch.Tensor]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return tv_decode_jpeg(payloads, mode=mode, device=device)

    return decode, ImageReadMode.RGB


def check_gpu_decode(device: torch.device) -> None:
    """TrainingConfigError (with the fix) when this task cannot decode with nvJPEG."""
    if device.type != "cuda":
        raise TrainingConfigError(
            f"data.decode: 'gpu' needs a CUDA device, but this task runs on {device}",
            hint="set data.decode: cpu (or auto), or run on a GPU node",
        )
    probe = torch.frombuffer(bytearray(_TINY_JPEG), dtype=torch.uint8)
    try:
        decode_jpegs([probe], device)
    except (RuntimeError, ImportError) as exc:
        raise TrainingConfigError(
            f"data.decode: 'gpu': this torchvision cannot decode JPEGs on {device} ({exc})",
            hint="install a CUDA build of torchvision (or pip install 'hpctrain[torchcodec]'), or set data.decode: cpu",
        ) from None


def _tiny_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 60, 30)).save(buffer, format="JPEG")
    return buffer.getvalue()


_TINY_JPEG = _tiny_jpeg()


def resolve_decoder(decode: str, device: torch.device) -> Literal["cpu", "gpu", "dali"]:
    """``data.decode`` for this task's device; TrainingConfigError when it cannot work here.

    auto: cpu on a CPU device; on CUDA, DALI when it is installed (its fused
    decode+crop and its own thread pool for the host stage), else nvJPEG through
    torchvision/torchcodec (see docs/data.md for why).
    """
    if decode == "auto":
        if device.type != "cuda":
            return "cpu"
        return "dali" if dali_installed() else "gpu"
    if decode == "gpu":
        check_gpu_decode(device)
    elif decode == "dali":
        if device.type != "cuda":
            raise TrainingConfigError(
                f"data.decode: 'dali' runs on a CUDA device, but this task runs on {device}",
                hint="set data.decode: cpu (or auto), or run on a GPU node",
            )
        if not dali_installed():
            raise TrainingConfigError(
                "data.decode: 'dali', but NVIDIA DALI is not installed in this environment",
                hint="pip install 'hpctrain[dali]' (nvidia-dali-cuda120; use nvidia-dali-cuda130 for CUDA 13), "
                "or set data.decode: gpu",
            )
    return decode  # type: ignore[return-value]


def dali_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:
        return False

"""Decoding on the task's GPU: loader workers only read bytes and draw crop boxes.

With ``data.decode: gpu`` (or ``dali``) a sample is the file's encoded bytes,
its crop box and flip, and its label. The box is drawn in the worker by the
same pure function of (seed, epoch, index) as the CPU pipeline's crop, so
order, augmentation and exact resume do not depend on where decoding runs.
A batch reaches the device as an ``EncodedBatch``; its ``to(device)`` (the
trainer's existing ``images.to(device)`` call) decodes the batch with nvJPEG,
crops each image to its box, resizes to ``image_size`` (bilinear,
antialiased), flips, and normalises.

Files nvJPEG cannot take (PNG, CMYK or otherwise odd JPEGs) are decoded by
PIL in the worker instead and only cropped on the device: one odd file never
fails a batch.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from hpctrain.errors import TrainingConfigError

DeviceBackend = Literal["gpu", "dali"]
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
JPEG_MAGIC = b"\xff\xd8\xff"
# The box columns of a batch: crop top, left, height, width (source pixels) and horizontal flip (0/1).
BOX_FIELDS = ("top", "left", "height", "width", "flip")

BoxFunction = Callable[[int, int, int, int], tuple[int, int, int, int, bool]]


def header_size(data: bytes) -> tuple[int, int, bool]:
    """(height, width, nvjpeg_can_decode) from the file header alone (PIL reads no pixels here)."""
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        gpu_ok = data.startswith(JPEG_MAGIC) and image.format == "JPEG" and image.mode in ("RGB", "L")
    return height, width, gpu_ok


def pil_decode(data: bytes) -> torch.Tensor:
    """Any image PIL reads, as uint8 RGB CHW (the fallback for what nvJPEG cannot decode)."""
    with Image.open(io.BytesIO(data)) as image:
        array = np.asarray(image.convert("RGB"))
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


class EncodedImageDataset(Dataset):
    """``(payload, box, label)`` per sample; payload is the file's bytes (1-D uint8) or, for
    files nvJPEG cannot decode, the PIL-decoded image (3-D uint8 CHW).

    ``box_for(epoch, index, height, width)`` draws the crop; it must be pure so
    that the epoch (kept in shared memory for persistent workers) and the index
    alone decide it.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], classes: list[str], box_for: BoxFunction) -> None:
        self.samples = list(samples)
        self.classes = classes
        self.box_for = box_for
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        path, label = self.samples[index]
        with open(path, "rb") as file:
            data = file.read()
        height, width, gpu_ok = header_size(data)
        box = torch.tensor(self.box_for(self.epoch, index, height, width), dtype=torch.int64)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if gpu_ok else pil_decode(data)
        return payload, box, label


@dataclass
class EncodedBatch:
    """A batch still encoded; ``to(device)`` decodes, augments and normalises it there.

    Duck-types the one tensor method the training and evaluation loops call on
    their images, so they need no decode-specific code.
    """

    payloads: list[torch.Tensor]
    boxes: torch.Tensor  # [N, 5] int64, columns BOX_FIELDS
    image_size: int
    backend: DeviceBackend = "gpu"
    resize: int | None = None  # validation: Resize(resize) + CenterCrop(image_size); boxes are ValBoxes

    def __len__(self) -> int:
        return len(self.payloads)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.payloads), 3, self.image_size, self.image_size)

    def pin_memory(self) -> EncodedBatch:
        return self  # bytes are copied to nvJPEG by the decoder; nothing to gain from pinning them

    def to(self, device: torch.device | str, non_blocking: bool = False) -> torch.Tensor:
        return normalize(self.decode(torch.device(device)))

    def decode(self, device: torch.device) -> torch.Tensor:
        """uint8 NCHW on ``device``: decoded, cropped to each box, resized, flipped."""
        if self.backend == "dali":
            from hpctrain.trainer.dali_decode import dali_decode_batch

            return dali_decode_batch(self, device)
        return decode_batch(self.payloads, self.boxes, self.image_size, device, self.resize)


class EncodedCollate:
    """DataLoader ``collate_fn``: keeps the byte tensors as a list (they differ in length)."""

    def __init__(self, image_size: int, backend: DeviceBackend = "gpu", resize: int | None = None) -> None:
        self.image_size = image_size
        self.backend = backend
        self.resize = resize

    def __call__(self, samples: list[tuple[torch.Tensor, torch.Tensor, int]]) -> tuple[EncodedBatch, torch.Tensor]:
        payloads = [payload for payload, _, _ in samples]
        boxes = torch.stack([box for _, box, _ in samples]) if samples else torch.empty((0, 5), dtype=torch.int64)
        labels = torch.tensor([label for _, _, label in samples], dtype=torch.int64)
        return EncodedBatch(payloads, boxes, self.image_size, self.backend, self.resize), labels


def decode_batch(
    payloads: list[torch.Tensor],
    boxes: torch.Tensor,
    image_size: int,
    device: torch.device,
    resize: int | None = None,
) -> torch.Tensor:
    """Decode the encoded payloads in one batched nvJPEG call (CPU libjpeg on a CPU device),
    then crop/resize/flip every image to uint8 [N, 3, image_size, image_size] on ``device``
    (with ``resize``: the validation transform, Resize(resize) + CenterCrop(image_size))."""
    out = torch.empty((len(payloads), 3, image_size, image_size), dtype=torch.uint8, device=device)
    encoded = [i for i, payload in enumerate(payloads) if payload.dim() == 1]
    decoded = dict(zip(encoded, decode_jpegs([payloads[i] for i in encoded], device)))
    for i, payload in enumerate(payloads):
        image = decoded[i] if i in decoded else payload.to(device, non_blocking=True)
        if resize is not None:
            out[i] = resize_center_crop(image, resize, image_size)
        else:
            out[i] = crop_resize_flip(image, boxes[i].tolist(), image_size)
    return out


def crop_resize_flip(image: torch.Tensor, box: Sequence[int], image_size: int) -> torch.Tensor:
    """One uint8 CHW image -> its box, resized to image_size square (antialiased bilinear), maybe flipped."""
    from torchvision.transforms.v2 import functional as F

    top, left, height, width, flip = (int(v) for v in box)
    out = F.resized_crop(image, top, left, height, width, [image_size, image_size], antialias=True)
    return out.flip(-1) if flip else out


def resize_center_crop(image: torch.Tensor, resize: int, image_size: int) -> torch.Tensor:
    """The validation transform on a uint8 CHW tensor: short side to ``resize``, center ``image_size`` square."""
    from torchvision.transforms.v2 import functional as F

    return F.center_crop(F.resize(image, [resize], antialias=True), [image_size, image_size])


def decode_jpegs(payloads: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
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
                images.append(pil_decode(payload.numpy().tobytes()).to(device))
        return images


def jpeg_decoder() -> tuple[Callable[..., Any], Any]:
    """(decode_jpeg, RGB mode): torchcodec's if installed (torchvision 0.29 deprecates its own), else torchvision's."""
    try:
        from torchcodec.decoders import decode_jpeg  # type: ignore[import-not-found]

        return decode_jpeg, "RGB"
    except ImportError:
        pass
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as tv_decode_jpeg

    def decode(payloads: list[torch.Tensor], mode: Any, device: torch.device) -> list[torch.Tensor]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return tv_decode_jpeg(payloads, mode=mode, device=device)

    return decode, ImageReadMode.RGB


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 NCHW in [0, 255] -> float32 normalised with the ImageNet mean/std (what ToTensor+Normalize give)."""
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=images.device).view(1, 3, 1, 1) * 255
    return (images.float() - mean) / std


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


def train_box(seed: int, epoch: int, index: int, height: int, width: int) -> tuple[int, int, int, int, bool]:
    """RandomResizedCrop's box and RandomHorizontalFlip's coin for one sample, drawn exactly
    as the CPU pipeline draws them (torch RNG seeded with ``sample_seed``), without the pixels."""
    from torchvision.transforms import RandomResizedCrop

    from hpctrain.trainer.data import sample_seed

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sample_seed(seed, epoch, index))
        shape_only = torch.empty((1, 1, 1)).expand(1, height, width)
        top, left, h, w = RandomResizedCrop.get_params(shape_only, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3])
        flip = bool(torch.rand(1) < 0.5)
    return top, left, h, w, flip


@dataclass(frozen=True)
class TrainBoxes:
    """Picklable ``box_for`` of the training set (loader workers get a copy)."""

    seed: int

    def __call__(self, epoch: int, index: int, height: int, width: int) -> tuple[int, int, int, int, bool]:
        return train_box(self.seed, epoch, index, height, width)


@dataclass(frozen=True)
class ValBoxes:
    """``box_for`` of the validation set: where Resize(resize) + CenterCrop(image_size) land.

    The box is (crop top, crop left, resized height, resized width, 0), with
    torchvision's rounding, so a decoder that cannot call torchvision (DALI)
    reproduces the CPU pipeline's pixels exactly instead of a pixel off.
    """

    image_size: int
    resize: int

    def __call__(self, epoch: int, index: int, height: int, width: int) -> tuple[int, int, int, int, bool]:
        if width <= height:
            new_w, new_h = self.resize, int(self.resize * height / width)
        else:
            new_w, new_h = int(self.resize * width / height), self.resize
        top = int(round((new_h - self.image_size) / 2.0))
        left = int(round((new_w - self.image_size) / 2.0))
        return top, left, new_h, new_w, False

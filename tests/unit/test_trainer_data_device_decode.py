"""Device-side decoding (data.decode: gpu), run here on the CPU device: the same crops as
the CPU pipeline, odd files that never fail a batch, and errors that name the fix.

The batch transform is device-agnostic torch code; on a CPU device it decodes
with libjpeg instead of nvJPEG, which is the correctness proof available
without a GPU (tests/local/test_decode_gpu.py runs it on CUDA).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import data_spec
from PIL import Image
from torch.utils.data import DataLoader

from hpctrain.dataset.generate import make_dataset
from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import Trainer
from hpctrain.trainer.data import build_datasets, build_loaders, encoded_datasets
from hpctrain.trainer.data.augment import train_crop
from hpctrain.trainer.data.device_decode import (
    EncodedBatch,
    EncodedCollate,
    EncodedValImages,
    decode_batch,
    resolve_decoder,
)
from hpctrain.trainer.data.device_input import to_model_input
from hpctrain.trainer.data.index import scan_split

CPU = torch.device("cpu")
# PIL's and torch's antialiased bilinear differ by rounding, and libjpeg builds by IDCT details:
# a few levels of 255 on average (0.05 in normalised units is ~3 levels).
MEAN_TOLERANCE = 0.05


def normalised(images: torch.Tensor) -> torch.Tensor:
    return to_model_input(images, CPU, channels_last=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "ds"
    make_dataset(out, classes=3, per_class=6, val_per_class=4, image_size=48)
    return out


def _device_images(dataset, indices: list[int], resize: int | None = None) -> torch.Tensor:
    batch, _ = EncodedCollate(32, resize=resize)([dataset[i] for i in indices])
    images = batch.to(CPU)
    assert images.dtype == torch.uint8  # like a CPU-decoded batch: device_input normalises both
    return normalised(images)


@pytest.mark.parametrize("epoch", [0, 3])
def test_training_crops_match_the_cpu_pipeline(root: Path, epoch: int) -> None:
    train, val = build_datasets(data_spec(root), seed=7)
    encoded_train, _, _, _ = encoded_datasets(train, val, data_spec(root), "gpu")
    train.set_epoch(epoch)
    encoded_train.set_epoch(epoch)
    indices = list(range(len(train)))
    on_device = _device_images(encoded_train, indices)
    on_cpu = normalised(torch.stack([train[i][0] for i in indices]))
    assert on_device.shape == on_cpu.shape == (len(indices), 3, 32, 32)
    for i in indices[:3]:  # the CPU pipeline's own crops
        width, height = Image.open(train.index.path(i)).size
        assert encoded_train[i][0][1].tolist() == list(map(float, train_crop(7, epoch, i, width, height)))
    per_image = (on_device - on_cpu).abs().mean(dim=(1, 2, 3))
    assert per_image.max() < MEAN_TOLERANCE, per_image
    # a wrong box or flip would be far off: neighbouring samples differ by much more than the tolerance
    assert (on_device - on_cpu.roll(1, dims=0)).abs().mean(dim=(1, 2, 3)).min() > 4 * MEAN_TOLERANCE


def test_validation_center_crop_matches_the_cpu_pipeline(root: Path) -> None:
    train, val = build_datasets(data_spec(root), seed=0)
    _, encoded_val, _, _ = encoded_datasets(train, val, data_spec(root), "gpu")
    indices = list(range(len(val)))
    on_device = _device_images(encoded_val, indices, resize=36)
    on_cpu = normalised(torch.stack([val[i][0] for i in indices]))
    assert (on_device - on_cpu).abs().mean(dim=(1, 2, 3)).max() < MEAN_TOLERANCE


def _jpeg(image: Image.Image, **save: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", **save)
    return buffer.getvalue()


def test_odd_files_are_decoded_in_the_worker_and_never_fail_the_batch(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8))
    files = {
        "rgb.jpg": _jpeg(rgb),
        "gray.jpg": _jpeg(rgb.convert("L")),
        "cmyk.jpg": _jpeg(rgb.convert("CMYK")),
        "progressive.jpg": _jpeg(rgb, progressive=True),
    }
    png = io.BytesIO()
    rgb.save(png, format="PNG")
    files["really_a_png.jpg"] = png.getvalue()
    (tmp_path / "a").mkdir()
    for name, data in files.items():
        (tmp_path / "a" / name).write_bytes(data)
    dataset = EncodedValImages(scan_split(tmp_path), 32, 36)
    names = [Path(path).name for path, _ in dataset.index.samples]
    items = [dataset[i] for i in range(len(names))]
    kinds = {name: item[0][0].dim() for name, item in zip(names, items)}
    assert kinds == {"rgb.jpg": 1, "gray.jpg": 1, "cmyk.jpg": 3, "progressive.jpg": 1, "really_a_png.jpg": 3}
    batch, labels = EncodedCollate(32, resize=36)(items)
    images = batch.decode(CPU)
    assert images.shape == (5, 3, 32, 32) and images.dtype == torch.uint8 and labels.tolist() == [0] * 5
    gray = images[names.index("gray.jpg")].float()
    assert (gray[0] - gray[1]).abs().max() <= 1  # grayscale became RGB with equal channels


def test_a_corrupt_jpeg_in_a_batch_falls_back_to_pil(tmp_path: Path) -> None:
    good = torch.frombuffer(bytearray(_jpeg(Image.new("RGB", (20, 20), (200, 10, 10)))), dtype=torch.uint8)
    broken = good.clone()
    broken[-2:] = 0  # no end-of-image marker: libjpeg refuses it, PIL pads it
    boxes = torch.tensor([[0, 0, 20, 20, 0], [0, 0, 20, 20, 1]])
    images = decode_batch([good, broken], boxes, 16, CPU)
    assert images.shape == (2, 3, 16, 16)
    assert images[0, 0].float().mean() > 150


def test_batches_survive_loader_workers_and_report_their_shape(root: Path) -> None:
    train, val = build_datasets(data_spec(root), seed=0)
    encoded_train, _, collate, _ = encoded_datasets(train, val, data_spec(root), "gpu")
    loader = DataLoader(encoded_train, batch_size=4, num_workers=2, collate_fn=collate)
    batches = list(loader)
    assert [len(batch) for batch, _ in batches] == [4, 4, 4, 4, 2]
    first, labels = batches[0]
    assert isinstance(first, EncodedBatch) and first.shape == (4, 3, 32, 32) and labels.shape == (4,)
    assert to_model_input(first, CPU, channels_last=True).shape == (4, 3, 32, 32)  # the trainer's call


@pytest.mark.parametrize(("decode", "needle"), [("gpu", "needs a CUDA device"), ("dali", "runs on a CUDA device")])
def test_gpu_decoders_on_a_cpu_device_say_what_to_change(decode: str, needle: str) -> None:
    with pytest.raises(TrainingConfigError) as info:
        resolve_decoder(decode, CPU)
    assert needle in info.value.message and "data.decode" in info.value.message
    assert "data.decode: cpu" in (info.value.hint or "")


def test_auto_decodes_on_the_cpu_of_a_cpu_task() -> None:
    assert resolve_decoder("auto", CPU) == "cpu" and resolve_decoder("cpu", CPU) == "cpu"


def test_build_loaders_refuses_gpu_decoding_on_a_cpu_task(root: Path) -> None:
    with pytest.raises(TrainingConfigError, match="data.decode"):
        build_loaders(
            data_spec(root, decode="gpu"),
            Trainer(),
            rank=0,
            world_size=1,
            device_is_cuda=False,
            epoch_seed=0,
            batch_size=4,
        )

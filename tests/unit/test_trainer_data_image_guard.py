"""Hostile images and dataset trees: bombs are refused from the header, loops are cut, nothing is silent.

Every hostile file is made here (a few KB with a crafted header); nothing is downloaded. The
memory-bound test runs its decoding in a child with an address-space limit, so a regression
fails that child, not the machine.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import JPEG_DECODERS, available_jpeg_decoders, data_spec, use_jpeg_decoder
from PIL import Image

from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.data import build_datasets
from hpctrain.trainer.data.augment import val_crop
from hpctrain.trainer.data.datasets import SKIPPED_LABEL
from hpctrain.trainer.data.decode import decode_crop
from hpctrain.trainer.data.device_decode import EncodedValImages, pil_decode
from hpctrain.trainer.data.image_guard import ImageRefused, check_jpeg, jpeg_frame, read_image_file
from hpctrain.trainer.data.index import IndexError_, scan_split
from hpctrain.trainer.evaluation import evaluate
from hpctrain.trainer.precision import Precision

REPO = Path(__file__).resolve().parents[2]
BOMB = 65000  # 4.2 GP: 12.7 GB as RGB, 25 GB of progressive coefficients


# --- crafted files ---------------------------------------------------------------------------


def jpeg_bytes(size: tuple[int, int] = (64, 48), *, progressive: bool = False) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90, progressive=progressive)
    return out.getvalue()


def patch_jpeg_size(data: bytes, width: int, height: int) -> bytes:
    """The same file with its frame header (SOF0/SOF2) claiming ``width`` x ``height``."""
    i = 2
    while data[i + 1] not in (0xC0, 0xC2):
        i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    return data[: i + 5] + struct.pack(">HH", height, width) + data[i + 9 :]


def png_bomb(width: int = BOMB, height: int = BOMB) -> bytes:
    """A valid PNG header (IHDR with a correct CRC) claiming ``width`` x ``height``, with a few bytes of data."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(out, "PNG")
    data = out.getvalue()
    chunk = b"IHDR" + struct.pack(">II", width, height) + data[24:29]
    return data[:8] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + data[33:]


def scan_bomb(scans: int = 10_000, size: tuple[int, int] = (500, 375)) -> bytes:
    """A real progressive JPEG whose last scan (an end-of-band run over every block) is repeated: about
    12 bytes a scan, each one more pass over the whole image in every decoder (seconds to minutes)."""
    out = io.BytesIO()
    Image.new("RGB", size, (128, 128, 128)).save(out, "JPEG", quality=90, progressive=True)
    data = out.getvalue()
    last = data.rindex(b"\xff\xda")  # the last scan header; its entropy-coded data runs to the EOI
    end = data.rindex(b"\xff\xd9")
    return data[:end] + data[last:end] * (scans - data.count(b"\xff\xda")) + data[end:]


def bombs(folder: Path) -> dict[str, Path]:
    """Every hostile image, by what it is."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "progressive_bomb.jpg": patch_jpeg_size(jpeg_bytes(progressive=True), BOMB, BOMB),
        "baseline_bomb.jpg": patch_jpeg_size(jpeg_bytes(), BOMB, BOMB),
        "patched_4000.jpg": patch_jpeg_size(jpeg_bytes(), 4000, 4000),  # under the cap; data ends early
        "png_bomb.png": png_bomb(),
        "scan_bomb.jpg": scan_bomb(),  # 10,000 scans in 120 KB, under every size cap
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return {name: folder / name for name in files}


def _val_box(width: int, height: int):  # noqa: ANN202 - a CropBox
    return val_crop(width, height, 32, 36)


# --- item 4: bombs are refused from the header ----------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("decoder", JPEG_DECODERS)
def test_bombs_are_refused_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str) -> None:
    use_jpeg_decoder(monkeypatch, decoder)
    for name, path in bombs(tmp_path).items():
        with pytest.raises(ImageRefused) as refused:
            decode_crop(str(path), _val_box, 32)
        reason = str(refused.value)
        if name == "patched_4000.jpg":
            assert "4000 x 4000" in reason and "truncated, or altered dimensions" in reason
        elif name == "scan_bomb.jpg":
            assert "10000 scans" in reason and "at most 100 scans" in reason
        else:
            assert "65000" in reason or "max_image_pixels" in reason


def test_progressive_jpegs_have_the_tighter_coefficient_bound() -> None:
    # 400 x 400 = 160k pixels is under a 200k cap, but a progressive JPEG's coefficients
    # (400 x 400 x 3 components x 2 bytes = 960 kB) exceed 3 bytes x 200k.
    baseline, progressive = jpeg_bytes((400, 400)), jpeg_bytes((400, 400), progressive=True)
    assert not jpeg_frame(baseline).buffered and jpeg_frame(progressive).buffered
    check_jpeg(baseline, max_pixels=200_000)
    with pytest.raises(ImageRefused, match="progressive JPEG of 400 x 400 x 3 components"):
        check_jpeg(progressive, max_pixels=200_000)
    check_jpeg(progressive, max_pixels=400_000)


def test_scans_are_bounded_by_count_and_by_scans_times_pixels() -> None:
    honest = jpeg_bytes((640, 480), progressive=True)
    assert check_jpeg(honest).scans == 10 and check_jpeg(jpeg_bytes((640, 480))).scans == 1
    assert check_jpeg(scan_bomb(100)).scans == 100  # at the limit: decoded
    with pytest.raises(ImageRefused, match="101 scans"):
        check_jpeg(scan_bomb(101))
    # 60 scans of 2000 x 1500 are 180 M scan pixels: within 16 x 134 MP, beyond 16 x 10 MP
    big = scan_bomb(60, (2000, 1500))
    check_jpeg(big)
    with pytest.raises(ImageRefused, match="60 scans at 2000 x 1500"):
        check_jpeg(big, max_pixels=10_000_000)
    exif = jpeg_bytes((64, 48))  # an EXIF thumbnail is a JPEG with its own scan, before the image's first one
    thumbnail = b"\xff\xe1" + (2 + 6 + len(exif)).to_bytes(2, "big") + b"Exif\0\0" + exif
    assert check_jpeg(exif[:2] + thumbnail + exif[2:]).scans == 1


def test_a_16_bit_png_converts_without_wide_copies_of_the_image() -> None:
    """The conversion's own arrays are its uint8 RGB result (3 bytes a pixel) and one band of rows
    (numpy's allocations are traced; an int64 copy of the image and its arithmetic cost over 30)."""
    import tracemalloc

    from hpctrain.trainer.data.decode import WIDE_BAND_PIXELS, rgb_pixels

    side = 2048
    values = (np.arange(side * side, dtype=np.uint32) * 7 % 65536).astype(np.uint16).reshape(side, side)
    out = io.BytesIO()
    Image.fromarray(values).save(out, "PNG")
    image = Image.open(io.BytesIO(out.getvalue()))
    image.load()
    tracemalloc.start()
    try:
        pixels = rgb_pixels(image)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * side * side + 16 * WIDE_BAND_PIXELS, f"{peak / side / side:.1f} bytes a pixel"
    expected = ((values.astype(np.uint32) + 128) // 257).astype(np.uint8)
    assert pixels.shape == (side, side, 3) and all((pixels[:, :, c] == expected).all() for c in range(3))
    wide = Image.fromarray(np.array([[-5, 0, 300, 65535, 70000]], dtype=np.int32), "I")
    assert rgb_pixels(wide)[0, :, 0].tolist() == [0, 0, 1, 255, 255]


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("subsampling", [0, 2])
def test_real_flat_jpegs_pass_the_truncation_check(progressive: bool, subsampling: int) -> None:
    """The smallest honest JPEGs (one flat colour, optimised Huffman tables) still hold 2 bits per block."""
    out = io.BytesIO()
    Image.new("RGB", (2000, 1500), (128, 128, 128)).save(
        out, "JPEG", quality=50, optimize=True, progressive=progressive, subsampling=subsampling
    )
    frame = check_jpeg(out.getvalue())
    assert len(out.getvalue()) >= 2 * frame.min_bytes()


@pytest.mark.timeout(60)
def test_files_over_the_size_limit_and_fifos_are_refused_without_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.jpg"
    big.write_bytes(jpeg_bytes() + b"\0" * 40_000)
    with pytest.raises(ImageRefused, match="more than the"):
        read_image_file(str(big), max_pixels=10_000)  # 30 kB allowed
    fifo = tmp_path / "fifo.jpg"
    os.mkfifo(fifo)
    with pytest.raises(ImageRefused, match="not a regular file"):  # and no hang waiting for a writer
        decode_crop(str(fifo), _val_box, 32)


def test_a_truncated_jpeg_is_an_error_not_grey(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cut.jpg"
    path.write_bytes(jpeg_bytes((400, 300))[:-3000])
    for decoder in available_jpeg_decoders():
        monkeypatch.setenv("HPCTRAIN_JPEG_DECODER", decoder)
        with pytest.raises(Exception):  # noqa: B017 - each decoder words it its own way; it must not decode
            decode_crop(str(path), _val_box, 32)


def _tree_with(root: Path, tmp_path: Path, extra: dict[str, bytes]) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(root, tree)
    for name, data in extra.items():
        for split in ("train", "val"):
            (tree / split / "class_00" / name).write_bytes(data)
    return tree


@pytest.mark.timeout(120)
def test_bombs_in_a_dataset_are_skipped_counted_and_named(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hostile = {name: path.read_bytes() for name, path in bombs(tmp_path / "made").items()}
    tree = _tree_with(root, tmp_path, hostile)
    train, _ = build_datasets(data_spec(tree), seed=1)
    with caplog.at_level(logging.WARNING):
        samples = [train[i] for i in range(len(train))]
    assert all(image.shape == (3, 32, 32) for image, _ in samples)
    assert train.skipped_samples == len(hostile)
    warned = " ".join(r.getMessage() for r in caplog.records if "skipping unreadable image" in r.getMessage())
    for name in hostile:
        assert name in warned and "ImageRefused" in warned


def test_max_image_pixels_comes_from_the_spec(root: Path, tmp_path: Path) -> None:
    tree = _tree_with(root, tmp_path, {"wide.jpg": jpeg_bytes((300, 200))})
    train, val = build_datasets(data_spec(tree, max_image_pixels=50_000), seed=1)
    assert train.max_pixels == val.max_pixels == 50_000
    [wide] = [i for i in range(len(train)) if train.index.path(i).endswith("wide.jpg")]
    train[wide]
    assert train.skipped_samples == 1


# --- item 4 (memory): a child with an address-space limit survives every bomb, through every path ---

_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    torch.set_num_threads(1)
    from torch.utils.data import DataLoader
    from hpctrain.jobspec.models import Data
    from hpctrain.trainer.data import build_datasets, encoded_datasets
    from hpctrain.trainer.data.augment import val_crop
    from hpctrain.trainer.data.decode import decode_crop
    from hpctrain.trainer.data.device_decode import EncodedTrainImages
    from hpctrain.trainer.data.image_guard import ImageRefused

    tree, files, decoders = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    status = open("/proc/self/status").read()
    vm = int(status.split("VmSize:")[1].split()[0]) * 1024
    limit = vm + 1536 * 2**20  # what torch has mapped, plus 1.5 GiB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    box = lambda w, h: val_crop(w, h, 32, 36)
    refused = {}
    for decoder in decoders:
        import os
        os.environ["HPCTRAIN_JPEG_DECODER"] = decoder
        for path in files:
            try:
                decode_crop(path, box, 32)
                refused[decoder + ":" + path] = "decoded"
            except ImageRefused:
                refused[decoder + ":" + path] = "refused"
    spec = Data(root=tree, image_size=32, val_resize=36, workers=0)
    train, val = build_datasets(spec, seed=0)
    encoded, _, _, _ = encoded_datasets(train, val, spec, "gpu")
    for path in files:  # the device decoders' CPU side: header + PIL fallback
        try:
            encoded.load(path, box)
            refused["device:" + path] = "decoded"
        except ImageRefused:
            refused["device:" + path] = "refused"
    batches = list(DataLoader(train, batch_size=8, num_workers=2))  # loader workers, as in training
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    print(json.dumps({"refused": refused, "images": sum(len(b[1]) for b in batches), "rss_growth_kib": grown}))
    """
)


@pytest.mark.timeout(300)
def test_bombs_stay_within_bounded_memory_in_every_decoder_path(root: Path, tmp_path: Path) -> None:
    hostile = bombs(tmp_path / "made")
    tree = _tree_with(root, tmp_path, {name: path.read_bytes() for name, path in hostile.items()})
    files = [str(path) for path in hostile.values()]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tree), json.dumps(files), json.dumps(available_jpeg_decoders())],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert set(result["refused"].values()) == {"refused"}, result["refused"]
    train, _ = build_datasets(data_spec(tree), seed=0)
    assert result["images"] == len(train)  # every sample came out of the workers (bombs replaced)
    assert result["rss_growth_kib"] < 512 * 1024


# --- item 5: symlinked folders are followed once, loops cut ------------------------------------


@pytest.mark.timeout(60)
def test_symlink_loops_are_cut_and_named(root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(root, tree)
    before = scan_split(tree / "train")
    folder = tree / "train" / "class_01"
    (folder / "loop").symlink_to(".")
    (folder / "again").symlink_to("..")  # the split: class_00 and class_02 reached through class_01
    (folder / "sub").mkdir()
    (folder / "sub" / "up").symlink_to("..")
    outside = tmp_path / "extra"
    outside.mkdir()
    shutil.copy(next(iter(sorted(folder.glob("*.jpg")))), outside / "x.jpg")
    (folder / "extra").symlink_to(outside)
    (folder / "extra2").symlink_to(outside)
    with caplog.at_level(logging.WARNING):
        after = scan_split(tree / "train")
    paths = [path for path, _ in after.samples]
    assert len(paths) == len(set(paths))
    own = [p for p, label in after.samples if label == 1]
    old_own = [p for p, label in before.samples if label == 1]
    assert own[: len(old_own)] == old_own  # the real files first, in ImageFolder's order
    assert own.count("class_01/extra/x.jpg") == 1 and "class_01/extra2/x.jpg" not in own  # followed once
    assert sum(1 for p in own if p.endswith("x.jpg")) == 1
    warned = [r.getMessage() for r in caplog.records if "not following" in r.getMessage()]
    assert any("class_01/loop" in m and "loop" in m for m in warned)
    assert any("sub/up" in m for m in warned)
    assert any("extra2" in m for m in warned)


@pytest.mark.timeout(60)
def test_two_loops_do_not_hang_the_scan(tmp_path: Path) -> None:
    folder = tmp_path / "split" / "a"
    folder.mkdir(parents=True)
    (folder / "x.jpg").write_bytes(jpeg_bytes())
    (folder / "l1").symlink_to(".")
    (folder / "l2").symlink_to(".")
    (folder / "deep").mkdir()
    (folder / "deep" / "l3").symlink_to("..")
    assert [path for path, _ in scan_split(tmp_path / "split").samples] == ["a/x.jpg"]


# --- item 6 ------------------------------------------------------------------------------------


def test_an_unreadable_class_folder_stops_the_job_with_the_fix(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(root, tree)
    locked = str(tree / "train" / "class_02")
    real_scandir = os.scandir

    def scandir(path: str = ".") -> object:  # chmod 000 does not stop root, who runs some test machines
        if os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(IndexError_) as raised:
        scan_split(tree / "train")
    assert "class_02" in str(raised.value) and "Permission denied" in str(raised.value)
    assert "chmod" in raised.value.hint
    assert pickle.loads(pickle.dumps(raised.value)).hint == raised.value.hint  # what other ranks receive
    with pytest.raises(TrainingConfigError) as config:
        build_datasets(data_spec(tree), seed=0)
    assert "class_02" in config.value.message and "chmod" in (config.value.hint or "")


def _png16(path: Path, value: int) -> Path:
    Image.fromarray(np.full((40, 50), value, dtype=np.uint16)).save(path)  # mode I;16
    return path


@pytest.mark.parametrize("value", [0, 257 * 64, 32768, 65535])
def test_16_bit_pngs_are_scaled_not_clipped(tmp_path: Path, value: int) -> None:
    path = _png16(tmp_path / "deep.png", value)
    assert Image.open(path).mode in ("I;16", "I")
    expected = round(value / 257)
    cpu = decode_crop(str(path), _val_box, 32)
    assert int(cpu.min()) == int(cpu.max()) == expected
    device = pil_decode(path.read_bytes())
    assert int(device.min()) == int(device.max()) == expected


def test_a_failing_val_image_is_not_replaced_by_one_scored_twice(root: Path, tmp_path: Path) -> None:
    tree = _tree_with(root, tmp_path, {})
    val_files = sorted((tree / "val" / "class_01").iterdir())
    val_files[0].write_bytes(png_bomb())
    _, val = build_datasets(data_spec(tree), seed=0)
    labels = [val[i][1] for i in range(len(val))]
    assert labels.count(SKIPPED_LABEL) == 1 and val.skipped_samples == 1
    encoded = EncodedValImages(val.index, 32, 36, max_pixels=val.max_pixels)
    assert [encoded[i][1] for i in range(len(val))] == labels  # the device path agrees

    scored: list[int] = []

    class Recorder(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return torch.zeros(images.shape[0], 3)

    def batches():  # noqa: ANN202
        for start in range(0, len(val), 4):
            items = [val[i] for i in range(start, min(start + 4, len(val)))]
            scored.extend(label for _, label in items if label != SKIPPED_LABEL)
            yield torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])

    accuracy = evaluate(
        Recorder(),
        batches(),
        device=torch.device("cpu"),
        precision=Precision("fp32", torch.device("cpu")),
        criterion=torch.nn.CrossEntropyLoss(),
    )
    assert accuracy.samples == len(val) - 1 and accuracy.skipped == 1
    assert accuracy.as_dict()["skipped"] == 1
    assert accuracy.top1 == pytest.approx(100 * sum(1 for y in scored if y == 0) / len(scored))


def test_a_newline_in_a_file_name_cannot_forge_log_lines(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    forged = "x.jpg\nhpctrain: epoch 9 val top1 99.99.jpg"
    tree = _tree_with(root, tmp_path, {forged: b"not an image"})
    train, _ = build_datasets(data_spec(tree), seed=0)
    with caplog.at_level(logging.WARNING):
        for i in range(len(train)):
            train[i]
    [line] = [r.getMessage() for r in caplog.records if "skipping unreadable image" in r.getMessage()]
    assert "\n" not in line and "x.jpg\\nhpctrain: epoch" in line


@pytest.mark.timeout(120)
def test_bench_data_decode_rate_survives_bombs_and_says_so(root: Path, tmp_path: Path) -> None:
    from hpctrain.jobspec.models import JobSpec
    from hpctrain.trainer.data.pipeline_rates import decode_rate

    hostile = {name: path.read_bytes() for name, path in bombs(tmp_path / "made").items()}
    tree = _tree_with(root, tmp_path, hostile)
    spec = JobSpec.model_validate(
        {"name": "bench", "data": {"root": str(tree), "image_size": 32, "val_resize": 36, "workers": 0}}
    )
    rate, note = decode_rate(spec, "cpu", max_images=1000, max_s=60)
    skipped = re.search(r"(\d+) unreadable or oversized images skipped", note)
    assert rate > 0 and skipped and int(skipped.group(1)) >= len(hostile)  # a bomb may also be drawn as a stand-in

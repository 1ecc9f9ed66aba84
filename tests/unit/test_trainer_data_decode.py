"""The fast input pipeline: crop distribution, val equivalence, one scan per job, bad input."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import JPEG_DECODERS, data_spec, use_jpeg_decoder
from PIL import Image
from torchvision import transforms

from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.data import build_datasets, decode, val_transform
from hpctrain.trainer.data.augment import CropBox, train_crop, val_crop
from hpctrain.trainer.data.decode import decode_crop, header_size
from hpctrain.trainer.data.device_input import to_model_input
from hpctrain.trainer.data.index import cached_index, scan_split, shared_index


def _photo(path: Path, size: tuple[int, int], mode: str = "RGB") -> Path:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    base = np.stack([x * 255 // size[0], y * 255 // size[1], (x + y) * 127 // sum(size)], -1)
    noise = rng.integers(0, 30, base.shape)
    Image.fromarray((base + noise).clip(0, 255).astype(np.uint8)).convert(mode).save(path, quality=90)
    return path


# --- crop boxes: same distribution as torchvision --------------------------------------------


@pytest.mark.parametrize("size", [(500, 375), (300, 480), (1000, 200)])
def test_train_crop_has_torchvisions_area_aspect_and_flip_statistics(size: tuple[int, int]) -> None:
    width, height = size
    ours = [train_crop(3, 1, i, width, height) for i in range(4000)]
    torch.manual_seed(0)
    image = torch.empty(1, height, width)
    theirs = [transforms.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)]

    def stats(boxes: list[tuple[float, float, float, float]]) -> list[float]:
        areas = [h * w / (width * height) for _, _, h, w in boxes]
        aspects = [np.log(w / h) for _, _, h, w in boxes]
        centres = [(left + w / 2) / width for _, left, _, w in boxes]
        return [statistics.mean(areas), statistics.stdev(areas), statistics.mean(aspects), statistics.stdev(aspects),
                statistics.mean(centres)]  # fmt: skip

    for a, b in zip(stats([b[:4] for b in ours]), stats(theirs), strict=True):
        assert abs(a - b) < 0.02, (stats(ours), stats(theirs))
    assert 0.47 < sum(b.flip for b in ours) / len(ours) < 0.53
    assert all(b.top >= 0 and b.top + b.height <= height and b.left >= 0 and b.left + b.width <= width for b in ours)


def test_train_crop_is_pure_and_leaves_global_rngs_alone() -> None:
    torch.manual_seed(1)
    random.seed(1)
    first = train_crop(7, 2, 11, 400, 300)
    after = (torch.rand(1).item(), random.random())
    torch.manual_seed(1)
    random.seed(1)
    assert after == (torch.rand(1).item(), random.random())  # train_crop drew nothing from them
    assert train_crop(7, 2, 11, 400, 300) == first
    assert train_crop(7, 3, 11, 400, 300) != first and train_crop(8, 2, 11, 400, 300) != first


def test_val_crop_matches_resize_then_center_crop(tmp_path: Path) -> None:
    for size in [(500, 375), (333, 500), (256, 256)]:
        path = _photo(tmp_path / "p.jpg", size)
        with Image.open(path) as image:
            normalised = val_transform(224, 256)(image.convert("RGB"))
        std, mean = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1), torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        reference = (normalised * std + mean) * 255
        ours = decode_crop(str(path), lambda w, h: val_crop(w, h, 224, 256), 224, whole=True).float()
        assert ours.shape == reference.shape
        assert (ours - reference).abs().mean() < 1, size  # rounding noise only


@pytest.mark.parametrize("decoder", JPEG_DECODERS)
@pytest.mark.parametrize("size", [(74, 64), (64, 64), (56, 64)])
def test_small_val_sample_equals_torchvision_resize_center_crop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str, size: tuple[int, int]
) -> None:
    """The quickstart's case (64 px JPEGs, Resize(72) + CenterCrop(64)): no zoom from a rounded box, no colour shift.

    Rounding val_crop's fractional box to whole pixels cropped 56 px instead of 56.9 (a 1.6 % zoom, up to 90/255
    off per pixel); simplejpeg's fast IDCT shifted red and blue by about -1.2/255 on average.
    """
    use_jpeg_decoder(monkeypatch, decoder)
    path = _photo(tmp_path / "small.jpg", size)
    with Image.open(path) as image:
        reference = transforms.Compose([transforms.Resize(72), transforms.CenterCrop(64), transforms.PILToTensor()])(
            image.convert("RGB")
        )
    ours = decode_crop(str(path), lambda w, h: val_crop(w, h, 64, 72), 64, whole=True)
    diff = (ours.float() - reference.float()).abs()
    assert diff.max() <= 2 and diff.mean() < 0.1, (decoder, size, diff.max(), diff.mean())


@pytest.mark.parametrize("decoder", JPEG_DECODERS)
def test_decoders_match_pils_pixels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str) -> None:
    """Same pixels as PIL's decode (libjpeg's accurate IDCT): train and val see what the reference pipeline saw."""
    use_jpeg_decoder(monkeypatch, decoder)
    path = _photo(tmp_path / "p.jpg", (48, 48))
    with Image.open(path) as image:
        reference = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
    ours = decode_crop(str(path), lambda w, h: CropBox(0, 0, h, w, False), 48)
    assert torch.equal(ours, reference)


@pytest.mark.parametrize("decoder", JPEG_DECODERS)
@pytest.mark.parametrize("whole", [False, True])
def test_dct_scaled_crops_agree_with_pils_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str, whole: bool
) -> None:
    """A box small enough for 1/2 and 1/4 decodes: same shape, dtype and pixels (within IDCT noise) as PIL's draft."""
    path = _photo(tmp_path / "big.jpg", (1200, 900))
    grey = _photo(tmp_path / "grey.jpg", (1200, 900), "L")
    boxes = [CropBox(100, 200, 460, 500, True), CropBox(50, 60, 240, 230, False), CropBox(0, 0, 900, 1200, False)]
    for image in (path, grey):
        for box in boxes:
            monkeypatch.setenv("HPCTRAIN_JPEG_DECODER", "pil")
            reference = decode_crop(str(image), lambda w, h: box, 56, whole=whole)  # noqa: B023
            use_jpeg_decoder(monkeypatch, decoder)
            ours = decode_crop(str(image), lambda w, h: box, 56, whole=whole)  # noqa: B023
            assert ours.shape == reference.shape == (3, 56, 56) and ours.dtype == reference.dtype == torch.uint8
            diff = (ours.float() - reference.float()).abs()
            assert diff.mean() < 1 and diff.max() <= 16, (decoder, image.name, box, diff.mean(), diff.max())


def test_an_unknown_or_missing_decoder_stops_the_task_with_the_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    monkeypatch.setenv("HPCTRAIN_JPEG_DECODER", "libjpeg")
    with pytest.raises(TrainingConfigError) as error:
        build_datasets(data_spec(root), seed=0)
    assert "HPCTRAIN_JPEG_DECODER='libjpeg'" in error.value.message
    assert error.value.hint is not None and "simplejpeg, turbojpeg, pil" in error.value.hint
    monkeypatch.setenv("HPCTRAIN_JPEG_DECODER", "PIL")  # case does not matter
    build_datasets(data_spec(root), seed=0)


def test_without_libturbojpeg_turbojpeg_is_refused_and_pil_takes_over_with_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No .so (PyTurboJPEG raises when it loads the library): forced -> error with the fix; default -> PIL, one line."""
    turbojpeg = pytest.importorskip("turbojpeg", reason="PyTurboJPEG is not installed")

    def no_library(*args: object, **kwargs: object) -> None:
        raise OSError("libturbojpeg.so.0: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(turbojpeg, "TurboJPEG", no_library)
    monkeypatch.setattr(decode, "simplejpeg", None)
    decode.turbojpeg_status.cache_clear()
    try:
        monkeypatch.setenv("HPCTRAIN_JPEG_DECODER", "turbojpeg")
        with pytest.raises(TrainingConfigError) as error:
            decode.jpeg_decoder()
        assert "cannot use libturbojpeg (libturbojpeg.so.0: cannot open" in error.value.message
        assert error.value.hint is not None and "libturbojpeg0" in error.value.hint
        monkeypatch.setenv("HPCTRAIN_JPEG_DECODER", "simplejpeg")
        with pytest.raises(TrainingConfigError, match="simplejpeg is not installed"):
            decode.jpeg_decoder()
        monkeypatch.delenv("HPCTRAIN_JPEG_DECODER")
        assert decode.jpeg_decoder() == "pil"
        with caplog.at_level(logging.WARNING):
            decode._warn_if_pil_only()
        [line] = [r.getMessage() for r in caplog.records]
        assert "decoded by PIL" in line and "cannot open shared object" in line and "hpctrain[turbojpeg]" in line
    finally:
        decode.turbojpeg_status.cache_clear()


def test_without_simplejpeg_the_default_is_turbojpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a ppc64le node with libturbojpeg gets (simplejpeg hidden in a child, as the benchmark does)."""
    use_jpeg_decoder(monkeypatch, "turbojpeg")
    monkeypatch.delenv("HPCTRAIN_JPEG_DECODER")
    code = "import sys; sys.modules['simplejpeg'] = None\nfrom hpctrain.trainer.data.decode import jpeg_decoder\n"
    child = subprocess.run(
        [sys.executable, "-c", code + "print(jpeg_decoder())"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["turbojpeg"] and "decoded by PIL" not in child.stderr


def test_val_crop_box_is_the_centered_reference_box() -> None:
    box = val_crop(500, 375, 224, 256)
    assert box.flip is False
    assert box.height == pytest.approx(224 * 375 / 256) and box.width == pytest.approx(224 * 500 / 341, rel=1e-3)
    assert box.top == pytest.approx(16 * 375 / 256)


def test_train_sample_follows_its_box(tmp_path: Path) -> None:
    path = _photo(tmp_path / "p.jpg", (480, 360))
    box = CropBox(40, 60, 200, 200, False)
    plain = decode_crop(str(path), lambda w, h: box, 100)
    flipped = decode_crop(str(path), lambda w, h: box._replace(flip=True), 100)
    assert torch.equal(plain.flip(-1), flipped)
    with Image.open(path) as image:
        reference = torch.from_numpy(np.array(image.crop((60, 40, 260, 240)).resize((100, 100), Image.BILINEAR)))
    assert (plain.permute(1, 2, 0).float() - reference.float()).abs().mean() < 4
    assert header_size(str(path)) == (480, 360)


# --- device input -----------------------------------------------------------------------------


def test_to_model_input_normalises_uint8_like_the_reference() -> None:
    batch = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    reference = transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))(batch.float() / 255)
    out = to_model_input(batch, "cpu", channels_last=True)
    assert out.dtype == torch.float32 and out.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(out, reference, atol=1e-5)
    assert torch.equal(to_model_input(reference, "cpu", channels_last=False), reference)  # float: already normalised


# --- index: one scan per job ------------------------------------------------------------------


def test_index_matches_imagefolder(root: Path) -> None:
    from torchvision.datasets import ImageFolder

    index = scan_split(root / "train")
    folder = ImageFolder(str(root / "train"))
    assert index.classes == folder.classes
    assert [(index.path(i), label) for i, (_, label) in enumerate(index.samples)] == folder.samples


def _count_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real_scandir, real_walk = os.scandir, os.walk

    def scandir(path: object = ".") -> object:
        calls.append(str(path))
        return real_scandir(path)

    def walk(top: object, *args: object, **kwargs: object) -> object:
        for entry in real_walk(top, *args, **kwargs):
            calls.append(entry[0])
            yield entry

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "walk", walk)
    return calls


def test_only_the_leader_lists_directories(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_listings(monkeypatch)
    mailbox: list[object] = []

    def broadcast(value: object) -> object:  # stands in for torch.distributed.broadcast_object_list
        if value is not None:
            mailbox.append(value)
        return mailbox[0]

    leader = shared_index(root / "train", is_leader=True, broadcast=broadcast)
    leader_listings = len(calls)
    assert leader_listings >= 4  # the split + 3 class folders
    followers = [shared_index(root / "train", is_leader=False, broadcast=broadcast) for _ in range(7)]
    assert len(calls) == leader_listings  # 7 more ranks, no more listings
    assert all(f.samples == leader.samples for f in followers)


def test_index_cache_skips_the_walk_until_the_tree_changes(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(root / "train", tree)
    first = cached_index(tree, tmp_path / "cache")
    calls = _count_listings(monkeypatch)
    assert cached_index(tree, tmp_path / "cache").samples == first.samples
    assert len(calls) == 1  # the key: one listing of the split folder (stats of class folders), no walk
    os.unlink(tree / first.samples[0][0])
    assert len(cached_index(tree, tmp_path / "cache").samples) == len(first.samples) - 1


@pytest.mark.timeout(60)
def test_a_planted_index_cache_is_never_trusted(root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A shared data.index_cache_dir: another user's file, one naming another tree, a FIFO, brackets."""
    from hpctrain.dataset.index import cache_key

    tree = tmp_path / "tree"
    shutil.copytree(root / "train", tree)
    honest = scan_split(tree)
    cache = tmp_path / "cache"
    cache.mkdir()
    planted = cache / f"index-{cache_key(tree)}.json"
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root / "train", elsewhere)
    other = scan_split(elsewhere).to_json()  # a valid index, of another tree
    for content in (
        json.dumps(other),
        json.dumps({**honest.to_json(), "samples": [[p, (label + 1) % 3] for p, label in honest.samples]}),
        "[" * 100_000 + "]" * 100_000,
        "fifo",
    ):
        planted.unlink(missing_ok=True)
        if content == "fifo":
            os.mkfifo(planted)
        else:
            planted.write_text(content)
        if content.startswith('{"version"') and "elsewhere" not in content:
            os.chown(planted, 12345, 12345)  # the relabelled list, written by another user
        with caplog.at_level("WARNING"):
            index = cached_index(tree, cache)
        assert index.root == honest.root and index.samples == honest.samples, content[:40]
        assert any("not using the index cache" in r.getMessage() for r in caplog.records)
        caplog.clear()
    assert cached_index(tree, cache).samples == honest.samples and planted.stat().st_uid == os.geteuid()


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("decoder", JPEG_DECODERS)
def test_grayscale_and_cmyk_jpegs_decode_to_rgb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str) -> None:
    """Grey comes out as RGB from every decoder; CMYK, which TurboJPEG cannot turn into RGB, goes to PIL."""
    use_jpeg_decoder(monkeypatch, decoder)
    for mode in ("L", "CMYK"):
        path = _photo(tmp_path / f"{mode}.jpg", (120, 90), mode)
        out = decode_crop(str(path), lambda w, h: val_crop(w, h, 32, 36), 32)
        assert out.shape == (3, 32, 32) and out.dtype == torch.uint8
        rgb = decode_crop(str(_photo(tmp_path / "rgb.jpg", (120, 90))), lambda w, h: val_crop(w, h, 32, 36), 32)
        if mode == "CMYK":
            assert (out.float() - rgb.float()).abs().mean() < 12  # colours survive the round trip


def test_bad_files_are_replaced_deterministically_and_counted(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    files = sorted((bad / "train" / "class_00").iterdir())
    files[0].write_bytes(files[0].read_bytes()[:200])  # truncated JPEG
    files[1].write_text("not an image")  # not a JPEG at all
    files[2].chmod(0)  # unreadable (as root this still reads: then it simply decodes)
    _photo(files[3].with_suffix(".png"), (50, 40))  # a PNG decodes through PIL
    train, _ = build_datasets(data_spec(bad), seed=5)
    train.set_epoch(2)
    with caplog.at_level("WARNING"):
        first = [train[i] for i in range(len(train))]
        again = [train[i] for i in range(len(train))]
    assert all(x.shape == (3, 32, 32) for x, _ in first)
    assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(first, again, strict=True))
    assert train.skipped_samples >= 4  # two bad files, read twice
    warned = [r for r in caplog.records if "skipping unreadable image" in r.getMessage()]
    assert 2 <= len(warned) <= 3  # one line per bad file, not per read

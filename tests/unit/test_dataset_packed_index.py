"""A packed image's index is half-trusted (``hpctrain.dataset.packed_index``): real images, crafted by an adversary.

Each hostile image is made with plain ``mksquashfs`` (what anyone can do, not
``hpctrain pack``) and mounted with squashfuse, as a node mounts it: a huge
or repetitive index, more classes than folders, a FIFO index, nested
brackets, wrong types, symlinks that lead onto this machine, a corrupt image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from data_helpers import data_spec

from hpctrain.dataset import packed_index, squashfs
from hpctrain.dataset.generate import make_dataset
from hpctrain.dataset.index import DatasetIndex, scan_split
from hpctrain.dataset.pack import pack
from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.data import build_datasets
from tests.squashfs_tools import require_mount, require_pack_tools

FORMAT = {"format": packed_index.PACKED_FORMAT, "version": 1}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree") / "data"
    make_dataset(root, classes=2, per_class=3, val_per_class=2, image_size=16)
    return root


def _image(tmp_path: Path, tree: Path, index: str | bytes | None, name: str = "x.sqsh") -> Path:
    """``tree`` plus ``index`` as the index file (None: no index; b"fifo": a FIFO), by plain mksquashfs."""
    require_pack_tools()
    source = tmp_path / f"src-{name}"
    shutil.copytree(tree, source, symlinks=True)
    target = source / squashfs.INDEX_NAME
    if index == b"fifo":
        os.mkfifo(target)
    elif index is not None:
        target.write_bytes(index.encode() if isinstance(index, str) else index)
    out = tmp_path / name
    subprocess.run(["mksquashfs", str(source), str(out), "-noappend", "-no-progress"], capture_output=True, check=True)
    return out


@contextmanager
def mounted(image: Path) -> Iterator[Path]:
    require_mount()
    point = image.with_suffix(".mnt")
    point.mkdir()
    subprocess.run(["squashfuse", str(image), str(point)], check=True)
    try:
        yield point
    finally:
        tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount"
        subprocess.run([tool, "-u", str(point)], check=False)


def _split(split: dict) -> str:
    return json.dumps({**FORMAT, "splits": {"train": split}})


def _refused(point: Path, needle: str) -> None:
    with pytest.raises(squashfs.ImageError) as caught:
        document = packed_index.read_packed(point)
        assert document is not None
        packed_index.packed_split(point, document, "train")
    assert needle in caught.value.message, caught.value.message
    assert caught.value.hint


def test_an_honest_packed_index_reads_back_as_the_scan(tree: Path, tmp_path: Path) -> None:
    require_pack_tools()
    pack(tree, tmp_path / "ok.sqsh", log=lambda line: None)
    with mounted(tmp_path / "ok.sqsh") as point:
        document = packed_index.read_packed(point)
        assert document is not None
        index = packed_index.packed_split(point, document, "train")
        assert index is not None and index.samples == scan_split(tree / "train").samples
        assert index.root == str(point / "train") and not index.follow_links
        assert packed_index.packed_split(point, document, "test") is None


def test_an_index_larger_than_its_image_allows_is_refused_unread(tree: Path, tmp_path: Path) -> None:
    # 10^6 copies of one entry: 22 MB of JSON that compresses into a 60 KB image (round 4: 10^7 cost 3.1 GB)
    samples = ",".join(['["class_00/x.jpg",0]'] * 1_000_000)
    index = '{"format":"hpctrain-packed-index","version":1,"splits":{"train":{"classes":["class_00"],"samples":['
    image = _image(tmp_path, tree, index + samples + "]}}}")
    assert image.stat().st_size < 1_000_000
    with mounted(image) as point:
        _refused(point, "larger than")


def test_more_classes_than_the_image_has_folders_are_refused(tree: Path, tmp_path: Path) -> None:
    classes = [f"c{n:05d}" for n in range(5_000)]  # 2,000,000 class names OOMed the model head
    image = _image(tmp_path, tree, _split({"classes": classes, "samples": [["c00000/x.jpg", 0]]}), "wide.sqsh")
    with mounted(image) as point:
        _refused(point, "5000 classes, more than the")
    split = {"classes": ["a"], "samples": [[f"a/{n}.jpg", 0] for n in range(11)], "empty_classes": []}
    with pytest.raises(ValueError, match="11 samples, more than the 10 files"):  # samples: one per 2 bytes of image
        DatasetIndex.from_json(split, str(tmp_path), max_samples=10)


@pytest.mark.timeout(60)
def test_a_fifo_index_and_nested_brackets_are_refused_without_hanging(tree: Path, tmp_path: Path) -> None:
    with mounted(_image(tmp_path, tree, b"fifo", "fifo.sqsh")) as point:
        _refused(point, "FIFO")
    with mounted(_image(tmp_path, tree, '{"splits": ' + "[" * 100_000 + "]" * 100_000 + "}", "deep.sqsh")) as point:
        _refused(point, "nested")


@pytest.mark.parametrize(
    "split, needle",
    [
        ({"classes": ["class_00"], "samples": [["class_00/x.jpg", True]], "empty_classes": []}, "label True"),
        ({"classes": "abcd", "samples": []}, "'classes' is not a list"),
        ({"classes": ["class_00"], "samples": [], "empty_classes": 5}, "'empty_classes'"),
        ({"classes": ["class_00"], "samples": [["class_00/x.jpg", 0]] * 2, "empty_classes": []}, "listed twice"),
        ({"classes": ["b", "a"], "samples": []}, "sorted"),
        ({"classes": ["class_00", "class_01"], "samples": [["class_00/x.jpg", 1]]}, "not inside its class"),
        ({"classes": ["class_00"], "samples": [["class_00/../../../etc/passwd.jpg", 0]]}, "not inside"),
        ({"classes": ["class_00"], "samples": [["/etc/x.jpg", 0]]}, "not inside"),
        ({"classes": ["class_00"], "samples": [["class_00/notes.txt", 0]]}, "not the path of an image"),
        ({"classes": ["class_00"], "samples": {"a": 1}}, "'samples' is not a list"),
    ],
    ids=str,
)
def test_wrong_types_are_malformed_never_reinterpreted(split: dict, needle: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError) as caught:
        DatasetIndex.from_json(split, str(tmp_path))
    assert needle in str(caught.value), str(caught.value)


def _squash(source: Path, image: Path) -> Path:
    command = ["mksquashfs", str(source), str(image), "-noappend", "-no-progress"]
    subprocess.run(command, capture_output=True, check=True)
    return image


def test_a_split_linked_out_of_the_image_is_refused(tree: Path, tmp_path: Path) -> None:
    require_pack_tools()
    victim = tmp_path / "victim"
    make_dataset(victim, classes=2, per_class=2, val_per_class=1, image_size=16)
    hostile = tmp_path / "hostile"
    shutil.copytree(tree, hostile)
    shutil.rmtree(hostile / "train")
    (hostile / "train").symlink_to(victim / "train")  # train -> /home/victim/photos
    (hostile / squashfs.INDEX_NAME).write_text(_index_of(tree))
    with mounted(_squash(hostile, tmp_path / "link.sqsh")) as point:
        assert (point / "train").is_symlink()
        _refused(point, "is a symlink")
    shutil.rmtree(hostile / "val")
    (hostile / "val").mkdir()
    (hostile / "val" / "class_00").symlink_to(victim / "val" / "class_00")  # one class linked out
    (hostile / "train").unlink()
    shutil.copytree(tree / "train", hostile / "train")
    with mounted(_squash(hostile, tmp_path / "class.sqsh")) as point:
        document = packed_index.read_packed(point)
        assert document is not None and packed_index.packed_split(point, document, "train") is not None
        with pytest.raises(squashfs.ImageError, match="val/class_00 in the image is a symlink"):
            packed_index.packed_split(point, document, "val")


def test_a_file_linked_out_of_the_image_is_skipped_never_read(tree: Path, tmp_path: Path) -> None:
    from hpctrain.trainer.data.datasets import TrainImages

    require_pack_tools()
    outside = tmp_path / "outside.jpg"
    shutil.copy(sorted((tree / "train" / "class_01").iterdir())[0], outside)
    hostile = tmp_path / "hostile"
    shutil.copytree(tree, hostile)
    (hostile / squashfs.INDEX_NAME).write_text(_index_of(tree))
    first = sorted((hostile / "train" / "class_00").iterdir())[0]
    first.unlink()
    first.symlink_to(outside)  # a readable JPEG of this machine: decoding it would "work"
    with mounted(_squash(hostile, tmp_path / "file.sqsh")) as point:
        document = packed_index.read_packed(point)
        assert document is not None
        index = packed_index.packed_split(point, document, "train")
        assert index is not None and not index.follow_links
        images = TrainImages(index, 16, seed=0)
        position = [n for n, (rel, _) in enumerate(index.samples) if rel == f"class_00/{first.name}"][0]
        images[position]
        assert images.skipped_samples == 1  # refused (a symlink), another sample took its place


def _index_of(tree: Path) -> str:
    splits = {}
    for split in ("train", "val"):
        index = scan_split(tree / split)
        splits[split] = {"classes": index.classes, "samples": index.samples, "empty_classes": index.empty_classes}
    return json.dumps({**FORMAT, "splits": splits})


def test_a_corrupt_image_is_named_corrupt_everywhere(tree: Path, tmp_path: Path) -> None:
    require_pack_tools()
    image = tmp_path / "ok.sqsh"
    pack(tree, image, log=lambda line: None)
    data = bytearray(image.read_bytes())
    fields = squashfs.SUPERBLOCK.unpack(data[: squashfs.SUPERBLOCK.size])
    directory_table = fields[16]
    for offset in range(directory_table + 2, directory_table + 60):
        data[offset] ^= 0x5A
    corrupt = tmp_path / "corrupt.sqsh"
    corrupt.write_bytes(bytes(data))
    (problem,) = squashfs.check_image(corrupt)
    assert "is corrupt" in problem.message and "copy the image again" in problem.hint
    assert "no train/" not in problem.message
    with pytest.raises(TrainingConfigError) as caught:
        build_datasets(data_spec(corrupt, stage_dir=str(tmp_path)))
    assert "corrupt" in caught.value.message or "corrupt" in (caught.value.hint or "")

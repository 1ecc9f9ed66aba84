"""The synthetic dataset: real JPEGs, learnable classes, and never overwriting user data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hpctrain.dataset import generate as dataset_gen
from hpctrain.dataset.generate import MANIFEST, make_dataset
from hpctrain.errors import UsageError


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_writes_an_imagefolder_of_real_jpegs(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    manifest = make_dataset(out, classes=3, per_class=4, image_size=32)

    for split, count in (("train", 4), ("val", 10)):  # val default: max(10, per_class // 5)
        folders = sorted(p.name for p in (out / split).iterdir())
        assert folders == ["class_00", "class_01", "class_02"]
        for folder in folders:
            images = sorted((out / split / folder).iterdir())
            assert len(images) == count
            for path in images:
                assert path.read_bytes()[:3] == b"\xff\xd8\xff"  # JPEG magic, not a renamed PNG
                with Image.open(path) as image:
                    assert image.format == "JPEG" and image.mode == "RGB"
                    assert image.height == 32 and 27 <= image.width <= 39
    assert json.loads((out / MANIFEST).read_text()) == manifest
    assert manifest["train_images"] == 12 and manifest["val_images"] == 30
    assert manifest["class_names"] == ["class_00", "class_01", "class_02"]


def test_val_count_default_and_explicit(tmp_path: Path) -> None:
    assert make_dataset(tmp_path / "a", classes=2, per_class=100, image_size=16)["val_per_class"] == 20
    assert make_dataset(tmp_path / "b", classes=2, per_class=3, val_per_class=2, image_size=16)["val_per_class"] == 2
    assert len(list((tmp_path / "b" / "val" / "class_01").iterdir())) == 2


def test_same_parameters_give_the_same_bytes(tmp_path: Path) -> None:
    make_dataset(tmp_path / "a", classes=2, per_class=3, val_per_class=1, image_size=24, seed=5)
    make_dataset(tmp_path / "b", classes=2, per_class=3, val_per_class=1, image_size=24, seed=5)
    make_dataset(tmp_path / "c", classes=2, per_class=3, val_per_class=1, image_size=24, seed=6)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert _files(tmp_path / "a") != _files(tmp_path / "c")


def test_rerun_with_same_parameters_is_a_no_op(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    first = make_dataset(out, classes=2, per_class=2, val_per_class=1, image_size=16)
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert make_dataset(out, classes=2, per_class=2, val_per_class=1, image_size=16) == first
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == stamps


def test_an_existing_empty_directory_is_filled(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    make_dataset(out, classes=2, per_class=1, val_per_class=1, image_size=16)
    assert (out / MANIFEST).is_file()


def test_refuses_a_non_empty_directory_without_touching_it(tmp_path: Path) -> None:
    out = tmp_path / "imagenet"
    (out / "train" / "n01440764").mkdir(parents=True)
    (out / "train" / "n01440764" / "img.JPEG").write_bytes(b"user data")
    before = _files(out)
    with pytest.raises(UsageError, match="not empty") as info:
        make_dataset(out, classes=2, per_class=1, image_size=16)
    assert info.value.hint and "new directory" in info.value.hint
    assert _files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imagenet"]  # no temp dir left behind


def test_refuses_a_generated_dataset_with_other_parameters(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    make_dataset(out, classes=2, per_class=2, val_per_class=1, image_size=16)
    before = _files(out)
    with pytest.raises(UsageError, match=r"per_class=2 \(asked 3\)"):
        make_dataset(out, classes=2, per_class=3, val_per_class=1, image_size=16)
    assert _files(out) == before


def test_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "ds").write_text("mine")
    with pytest.raises(UsageError, match="not a directory"):
        make_dataset(tmp_path / "ds", classes=2, per_class=1, image_size=16)


def test_a_failed_run_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def flaky(*args: object) -> np.ndarray:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return np.zeros((16, 16, 3), np.uint8)

    monkeypatch.setattr(dataset_gen, "render_image", flaky)
    with pytest.raises(KeyboardInterrupt):
        make_dataset(tmp_path / "ds", classes=2, per_class=2, image_size=16)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs", [{"classes": 1}, {"per_class": 0}, {"val_per_class": 0}, {"image_size": 4}], ids=lambda k: str(k)
)
def test_bad_parameters_are_usage_errors(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(UsageError, match=next(iter(kwargs))):
        make_dataset(tmp_path / "ds", **kwargs)


def test_importing_it_does_not_import_torch() -> None:
    code = "import sys, hpctrain.dataset.generate; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _load(root: Path) -> tuple[np.ndarray, np.ndarray]:
    features, labels = [], []
    for label, folder in enumerate(sorted(root.iterdir())):
        for path in sorted(folder.iterdir()):
            with Image.open(path) as image:
                small = image.convert("RGB").resize((8, 8), Image.BILINEAR)
            features.append(np.asarray(small, dtype=np.float32).ravel() / 255)
            labels.append(label)
    return np.stack(features), np.asarray(labels)


def test_classes_are_learnable_but_not_trivial(tmp_path: Path) -> None:
    """Softmax regression on 8x8 thumbnails: far above chance (10%), yet not perfect."""
    make_dataset(tmp_path / "ds", classes=10, per_class=80, val_per_class=20, image_size=48)
    x_train, y_train = _load(tmp_path / "ds" / "train")
    x_val, y_val = _load(tmp_path / "ds" / "val")
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    x_train, x_val = (x_train - mean) / std, (x_val - mean) / std

    weights, bias, onehot = np.zeros((x_train.shape[1], 10)), np.zeros(10), np.eye(10)[y_train]
    for _ in range(300):
        logits = x_train @ weights + bias
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        grad = (probs - onehot) / len(x_train)
        weights -= 0.5 * (x_train.T @ grad + 1e-3 * weights)
        bias -= 0.5 * grad.sum(0)
    accuracy = float(((x_val @ weights + bias).argmax(1) == y_val).mean())
    assert 0.4 < accuracy < 1.0, accuracy


# ---------------------------------------------------------------- hostile arguments (issue 19)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"classes": 1_000_000_000}, "classes must be between 2 and 100,000"),
        ({"image_size": 100_000}, "image_size must be between 8 and 2,048"),
        ({"per_class": 10**12}, "per_class must be between 1 and 100,000"),
        ({"val_per_class": 100_001}, "val_per_class must be between 1 and 100,000"),
        ({"classes": 100_000, "per_class": 100}, "images in all"),
        ({"classes": 1000, "per_class": 1000, "image_size": 2048}, "pixels in all"),
        ({"classes": 2.5}, "whole number"),
    ],
    ids=lambda value: str(value)[:40],
)
def test_absurd_sizes_are_refused_before_anything_is_written(tmp_path: Path, kwargs: dict, needle: str) -> None:
    """--classes 1e9 ran 53 s, was OOM-killed and left a temp folder; --image-size 100000 a traceback."""
    with pytest.raises(UsageError, match="make-dataset") as info:
        make_dataset(tmp_path / "deep" / "ds", **kwargs)
    assert needle in info.value.message and "--classes" in (info.value.hint or "")
    assert list(tmp_path.iterdir()) == []


def test_every_bad_size_is_named_at_once(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        make_dataset(tmp_path / "ds", classes=0, per_class=0, image_size=5000)
    assert all(name in info.value.message for name in ("classes", "per_class", "image_size"))


def test_an_unwritable_parent_is_one_message_and_leaves_nothing() -> None:
    """sysfs refuses new folders even to root, so this holds for any user."""
    with pytest.raises(UsageError, match=r"cannot write /sys/hpctrain-ds: Operation not permitted") as info:
        make_dataset(Path("/sys/hpctrain-ds"), classes=2, per_class=1, image_size=16)
    assert "write to" in (info.value.hint or "")
    assert not Path("/sys/hpctrain-ds").exists()


def test_missing_parents_it_created_are_removed_when_a_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk half way: the temp folder and the parent folders it made are gone, the user's are kept."""
    (tmp_path / "mine").mkdir()
    calls = []

    def full_disk(self: Image.Image, fp: object, *args: object, **kwargs: object) -> None:
        calls.append(fp)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        Path(str(fp)).write_bytes(b"x")

    monkeypatch.setattr(Image.Image, "save", full_disk)
    with pytest.raises(UsageError, match="No space left on device"):
        make_dataset(tmp_path / "mine" / "a" / "b" / "ds", classes=2, per_class=2, image_size=16)
    assert list(tmp_path.iterdir()) == [tmp_path / "mine"] and list((tmp_path / "mine").iterdir()) == []


def test_ctrl_c_leaves_neither_temp_folder_nor_created_parents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object) -> np.ndarray:
        raise KeyboardInterrupt

    monkeypatch.setattr(dataset_gen, "render_image", interrupted)
    with pytest.raises(KeyboardInterrupt):
        make_dataset(tmp_path / "new" / "ds", classes=2, per_class=1, image_size=16)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--classes", "1000000000"], "classes must be between 2 and 100,000"),
        (["--image-size", "100000"], "image_size must be between 8 and 2,048"),
        (["--classes", "1e9"], "invalid int value: '1e9'"),
        (["--per-class", "nan"], "invalid int value: 'nan'"),
    ],
)
def test_the_command_answers_absurd_sizes_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    from hpctrain.cli.main import main

    try:
        code = main(["make-dataset", str(tmp_path / "ds"), *argv])
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP"])
def test_a_terminated_command_removes_its_temp_folder(tmp_path: Path, signum: str) -> None:
    """SIGTERM or a closed terminal half way: exit 130 as for Ctrl-C, nothing left behind."""
    import os
    import signal
    import time

    command = [sys.executable, "-m", "hpctrain", "make-dataset", str(tmp_path / "new" / "ds")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen([*command, "--per-class", "5000", "--image-size", "64"], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("new/.ds.tmp-*/train/*/*.jpg")) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(getattr(signal, signum))
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and b"interrupted" in err and b"Traceback" not in err
    assert list(tmp_path.iterdir()) == []

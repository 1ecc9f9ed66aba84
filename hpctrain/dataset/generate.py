"""A small, learnable, real-JPEG ImageFolder for smoke tests and demos.

Every class has its own hue, stripe orientation, stripe frequency and shape;
every image adds random background, noise, position, scale and colour jitter,
so a model has to learn the pattern rather than copy pixels. The dataset is a
pure function of its parameters (same parameters, same bytes).

The CLI calls this, so it must not import torch: PIL and numpy only. It never
touches user data: a non-empty directory is refused unless it already holds a
dataset generated with the same parameters. The images are written to a
temporary sibling directory that is renamed into place at the end, so a
dataset is complete or absent, never half-written: on any failure (a
read-only or full disk, Ctrl-C) the temporary directory and any parent folders
it created are removed, and the error is a one-line UsageError.

It is bounded (``_check_params``): at most MAX_CLASSES classes, MAX_PER_CLASS
images per class and split, MAX_IMAGE_SIZE pixels a side (one image at 2048
takes ~0.5 GB while it is drawn), MAX_IMAGES images and MAX_TOTAL_PIXELS pixels
in all (ImageNet-1k at 224 px is about 7e10).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from hpctrain.contract.runfiles import RunFileError, printable, read_json
from hpctrain.errors import UsageError

MANIFEST = "hpctrain_dataset.json"
FORMAT = "hpctrain-synthetic-imagefolder"
FORMAT_VERSION = 1
_GOLDEN = 0.6180339887498949
_SHAPES = ("disc", "square", "diamond", "ring")
_SPLIT_IDS = {"train": 0, "val": 1}
MAX_CLASSES = 100_000
MAX_PER_CLASS = 100_000
MAX_IMAGE_SIZE = 2048
MAX_IMAGES = 2_000_000
MAX_TOTAL_PIXELS = 100_000_000_000


def make_dataset(
    out: Path,
    classes: int = 10,
    per_class: int = 100,
    val_per_class: int | None = None,
    image_size: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Write ``out/train/class_XX/*.jpg`` and ``out/val/class_XX/*.jpg``; return the manifest.

    ``val_per_class`` defaults to ``max(10, per_class // 5)``. Calling it again
    with the same parameters is a no-op that returns the existing manifest.
    """
    out = Path(out).expanduser()
    if val_per_class is None:
        val_per_class = max(10, per_class // 5)
    _check_params(classes, per_class, val_per_class, image_size)
    params = {
        "classes": classes,
        "per_class": per_class,
        "val_per_class": val_per_class,
        "image_size": image_size,
        "seed": seed,
    }
    try:
        existing = _existing_manifest(out, params)
    except OSError as exc:  # an unreadable folder in the way
        raise UsageError(
            f"make-dataset: cannot read {out}: {exc.strerror or exc}", hint="choose a new directory"
        ) from None
    if existing is not None:
        return existing

    created = _make_parents(out.parent)
    tmp: Path | None = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        names = [class_name(c, classes) for c in range(classes)]
        for split, count in (("train", per_class), ("val", val_per_class)):
            for c, name in enumerate(names):
                folder = tmp / split / name
                folder.mkdir(parents=True)
                for i in range(count):
                    rng = np.random.default_rng([seed & 0xFFFFFFFF, _SPLIT_IDS[split], c, i])
                    pixels = render_image(c, classes, image_size, rng)
                    Image.fromarray(pixels).save(folder / f"{name}_{i:05d}.jpg", format="JPEG", quality=90)
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            **params,
            "class_names": names,
            "train_images": classes * per_class,
            "val_images": classes * val_per_class,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        if out.exists():
            out.rmdir()  # known empty: _existing_manifest refused anything else
        os.rename(tmp, out)
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in reversed(created):
            _remove_if_empty(folder)
        if isinstance(exc, OSError):
            raise UsageError(
                f"make-dataset: cannot write {out}: {exc.strerror or exc}",
                hint="choose a directory you can write to, on a disk with room for the images",
            ) from None
        raise
    return manifest


def _make_parents(folder: Path) -> list[Path]:
    """``mkdir -p folder``; the folders it created, outermost first (removed again on failure)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    created = []
    try:
        for path in reversed(missing):
            path.mkdir()
            created.append(path)
    except OSError as exc:
        for path in reversed(created):
            _remove_if_empty(path)
        raise UsageError(
            f"make-dataset: cannot create {path}: {exc.strerror or exc}", hint="choose a directory you can write to"
        ) from None
    return created


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty any more (something else wrote there) or already gone


def class_name(index: int, classes: int) -> str:
    return f"class_{index:0{max(2, len(str(classes - 1)))}d}"


def class_style(index: int, classes: int) -> dict[str, Any]:
    """The fixed look of one class: what a model is meant to learn."""
    return {
        # Evenly spread hues for few classes, golden-ratio spread for many.
        "hue": index / classes if classes <= 12 else (index * _GOLDEN) % 1.0,
        "angle": (index * 2.399963) % np.pi,  # golden angle: orientations stay apart
        "frequency": (2.0, 3.5, 5.0)[index % 3],
        "shape": _SHAPES[(index // 3) % len(_SHAPES)],
    }


def render_image(index: int, classes: int, image_size: int, rng: np.random.Generator) -> np.ndarray:
    """One ``(H, W, 3)`` uint8 image of class ``index`` with per-image randomness."""
    style = class_style(index, classes)
    height = image_size
    width = int(round(image_size * rng.uniform(0.85, 1.2)))  # non-square, like real photos
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    y /= image_size
    x /= image_size

    background = rng.uniform(0.05, 0.6, size=3).astype(np.float32)
    image = np.broadcast_to(background, (height, width, 3)).copy()
    image += _smooth_noise(rng, height, width, 0.15)

    # The class pattern: oriented stripes in the class hue, inside the class shape.
    angle = style["angle"] + rng.normal(0.0, 0.12)
    phase = rng.uniform(0, 2 * np.pi)
    stripes = 0.5 + 0.5 * np.sin(2 * np.pi * style["frequency"] * (x * np.cos(angle) + y * np.sin(angle)) + phase)
    hue = (style["hue"] + rng.normal(0.0, 0.02)) % 1.0
    colour = _hsv_to_rgb(hue, rng.uniform(0.6, 1.0), rng.uniform(0.7, 1.0))
    radius = rng.uniform(0.25, 0.42)
    cy, cx = rng.uniform(radius * 0.8, 1 - radius * 0.8, size=2)
    cx *= width / image_size
    mask = _shape_mask(style["shape"], (y - cy) / radius, (x - cx) / radius)
    pattern = colour * (0.35 + 0.65 * stripes)[..., None]
    image = image * (1 - mask[..., None]) + pattern * mask[..., None]

    image *= rng.uniform(0.8, 1.15)  # brightness
    image += rng.normal(0.0, 0.04, size=image.shape).astype(np.float32)
    return (np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)


def _check_params(classes: int, per_class: int, val_per_class: int, image_size: int) -> None:
    """Every out-of-range parameter at once, before anything is written."""
    problems = []
    for name, value, low, high in (
        ("classes", classes, 2, MAX_CLASSES),
        ("per_class", per_class, 1, MAX_PER_CLASS),
        ("val_per_class", val_per_class, 1, MAX_PER_CLASS),
        ("image_size", image_size, 8, MAX_IMAGE_SIZE),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{name} must be a whole number (got {value!r})")
        elif not low <= value <= high:
            problems.append(f"{name} must be between {low} and {high:,} (got {value:,})")
    if not problems:
        images = classes * (per_class + val_per_class)
        pixels = images * image_size * image_size
        if images > MAX_IMAGES:
            problems.append(f"{images:,} images in all, above the {MAX_IMAGES:,} make-dataset writes")
        elif pixels > MAX_TOTAL_PIXELS:
            problems.append(f"{pixels:.2g} pixels in all, above the {MAX_TOTAL_PIXELS:.0e} make-dataset writes")
    if problems:
        raise UsageError(
            "make-dataset: " + "; ".join(problems),
            hint="give --classes, --per-class, --val-per-class and --image-size within these limits (docs/trainer.md)",
        )


def _existing_manifest(out: Path, params: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest when ``out`` already holds this very dataset; None when ``out`` is absent or empty."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise UsageError(f"make-dataset: {out} exists and is not a directory", hint="choose a new directory")
    if not any(out.iterdir()):
        return None
    manifest_path = out / MANIFEST
    hint = f"choose a new directory, or delete {out} yourself if it is an old generated dataset"
    if not manifest_path.is_file():
        raise UsageError(f"make-dataset: {out} is not empty and is not a generated dataset; refusing to write", hint)
    try:
        manifest = read_json(manifest_path)
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RunFileError) as exc:
        raise UsageError(f"make-dataset: cannot read {manifest_path}: {printable(exc)}", hint) from exc
    found = {key: manifest.get(key) for key in params}
    if manifest.get("format") != FORMAT or found != params:
        differing = ", ".join(f"{k}={found[k]!r} (asked {params[k]!r})" for k in params if found[k] != params[k])
        raise UsageError(
            f"make-dataset: {out} holds a generated dataset with other parameters: {differing or 'other format'}",
            hint,
        )
    return manifest


def _smooth_noise(rng: np.random.Generator, height: int, width: int, amplitude: float) -> np.ndarray:
    """Low-frequency colour blotches: a coarse random grid upsampled by nearest repeat."""
    cell = max(4, min(height, width) // 6)
    coarse = rng.normal(0.0, amplitude, size=(height // cell + 1, width // cell + 1, 3)).astype(np.float32)
    return np.repeat(np.repeat(coarse, cell, axis=0), cell, axis=1)[:height, :width]


def _shape_mask(shape: str, dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    if shape == "disc":
        inside = dy**2 + dx**2 <= 1.0
    elif shape == "square":
        inside = np.maximum(np.abs(dy), np.abs(dx)) <= 0.85
    elif shape == "diamond":
        inside = np.abs(dy) + np.abs(dx) <= 1.15
    else:  # ring
        r2 = dy**2 + dx**2
        inside = (r2 <= 1.0) & (r2 >= 0.3)
    return inside.astype(np.float32)


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    i = int(h * 6.0) % 6
    f = h * 6.0 - int(h * 6.0)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    rgb = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]
    return np.asarray(rgb, dtype=np.float32)

"""Per-core images/s of hpctrain's train and val input pipelines vs torchvision's reference, same files, one run.

The photo set is built at start from real photographs shipped inside PyPI
packages (scikit-image's bundled ``skimage.data`` images, matplotlib's
``grace_hopper.jpg``; nothing is downloaded): a few hundred distinct
ImageNet-sized JPEGs (short side 300-500 px, quality 90, varied crops, scales
and aspect ratios), cached under ``--photos`` (default: a temp folder).

Both pipelines run in this process with one thread and no loader workers,
timing ``dataset[i]`` over the same files:

* reference train: ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize
* reference val:   ImageFolder + Resize(256) + CenterCrop(224) + ToTensor + Normalize
* hpctrain: ``build_datasets(Data(root=...))`` -> (train, val), uint8 samples (normalised on the device)

    python benchmarks/input_pipeline.py [--images 300 --repeats 3] [--decoder simplejpeg|turbojpeg|pil]

``--decoder`` picks hpctrain's JPEG decoder (default: the fastest installed).
For ``turbojpeg`` and ``pil`` simplejpeg is made unimportable in this process
first, as on a platform without its wheels (ppc64le); nothing is uninstalled.

Goal: train >= 2.0x, val >= 1.5x, with any decoder but PIL. Needs scikit-image
(``pip install hpctrain[bench]``); ``turbojpeg`` needs libturbojpeg and PyTurboJPEG.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision import datasets, transforms

DECODERS = ("simplejpeg", "turbojpeg", "pil")
SKIMAGE_PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "hubble_deep_field.jpg", "retina.jpg", "rocket.jpg",
                  "motorcycle_left.png", "motorcycle_right.png"]  # fmt: skip


def source_photos() -> list[tuple[str, Image.Image]]:
    import matplotlib
    import skimage.data

    folders = [Path(skimage.data.__file__).parent, Path(matplotlib.__file__).parent / "mpl-data" / "sample_data"]
    names = [*SKIMAGE_PHOTOS, "grace_hopper.jpg"]
    photos = []
    for name in names:
        for folder in folders:
            if (folder / name).is_file():
                photos.append((name, Image.open(folder / name).convert("RGB")))
                break
    if len(photos) < 4:
        raise SystemExit(f"found only {len(photos)} bundled photos; install scikit-image (pip install hpctrain[bench])")
    return photos


def build_photo_set(out: Path, count: int, classes: int = 4) -> Path:
    """``count`` distinct JPEGs, short side 300-500 px, q90, split over ``classes`` folders (train == val)."""
    marker = out / f".complete-{count}"
    if marker.exists():
        return out
    rng = np.random.default_rng(2024)
    photos = source_photos()
    for i in range(count):
        name, photo = photos[i % len(photos)]
        width, height = photo.size
        area = rng.uniform(0.4, 1.0) * width * height
        aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))) * (4 / 3 if rng.random() < 0.7 else 3 / 4)
        w = min(width, int(round((area * aspect) ** 0.5)))
        h = min(height, int(round((area / aspect) ** 0.5)))
        left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
        short = int(rng.integers(300, 501))
        scale = short / min(w, h)
        image = photo.crop((left, top, left + w, top + h)).resize((round(w * scale), round(h * scale)), Image.BICUBIC)
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        for split in ("train", "val"):
            folder = out / split / f"class_{i % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            image.save(folder / f"{Path(name).stem}_{i:04d}.jpg", quality=90)
    marker.touch()
    return out


def rate(dataset: object, n: int) -> float:
    """images per CPU-second of ``dataset[i]`` for i in range(n), after a short warm-up.

    CPU time of this (one-thread) process, not wall time: on a shared machine
    the wall clock also counts time spent waiting for the core.
    """
    for i in range(min(8, n)):
        dataset[i]
    started = time.process_time()
    for i in range(n):
        dataset[i]
    return n / (time.process_time() - started)


def reference_train_transform(image_size: int) -> transforms.Compose:
    """pytorch/examples' ImageNet training transform: the yardstick of hpctrain's train pipeline."""
    from hpctrain.trainer.data.device_input import IMAGENET_MEAN, IMAGENET_STD

    return transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="photos in the set")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per pipeline (interleaved)")
    parser.add_argument("--photos", type=Path, default=None, help="cache folder for the photo set")
    parser.add_argument("--decoder", choices=DECODERS, default=None, help="hpctrain's JPEG decoder (default: fastest)")
    args = parser.parse_args()
    if args.decoder is not None:
        os.environ["HPCTRAIN_JPEG_DECODER"] = args.decoder
        if args.decoder != "simplejpeg":
            sys.modules["simplejpeg"] = None  # type: ignore[assignment]  # import fails: simplejpeg "uninstalled"
    from hpctrain.jobspec.models import Data
    from hpctrain.trainer.data import build_datasets, val_transform
    from hpctrain.trainer.data.decode import jpeg_decoder

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    root = args.photos or Path(tempfile.gettempdir()) / "hpctrain-bench-photos"
    started = time.perf_counter()
    build_photo_set(root, args.images)
    print(f"photo set: {args.images} JPEGs (q90, short side 300-500) in {root} ({time.perf_counter() - started:.1f} s)")

    train, val = build_datasets(Data(root=str(root), image_size=224, val_resize=256, workers=0), seed=0)
    ref_train = datasets.ImageFolder(str(root / "train"), transform=reference_train_transform(224))
    ref_val = datasets.ImageFolder(str(root / "val"), transform=val_transform(224, 256))
    results: dict[str, list[float]] = {k: [] for k in ("ref_train", "train", "ref_val", "val")}
    for repeat in range(args.repeats):
        train.set_epoch(repeat)
        results["ref_train"].append(rate(ref_train, args.images))
        results["train"].append(rate(train, args.images))
        results["ref_val"].append(rate(ref_val, args.images))
        results["val"].append(rate(val, args.images))

    print(f"\nper core (1 thread, workers=0, CPU time), {args.repeats} interleaved passes of {args.images} images")
    print(f"hpctrain JPEG decoder: {jpeg_decoder()}")
    header = ("pipeline", "reference img/s", "hpctrain img/s", "ratio (median)", "ratio range", "goal")
    print(f"{header[0]:<8} {header[1]:>16} {header[2]:>16} {header[3]:>15} {header[4]:>14} {header[5]:>6}")
    for name, goal in (("train", 2.0), ("val", 1.5)):
        ref, ours = results[f"ref_{name}"], results[name]
        ratios = [o / r for o, r in zip(ours, ref, strict=True)]
        print(
            f"{name:<8} {statistics.median(ref):>16.1f} {statistics.median(ours):>16.1f} "
            f"{statistics.median(ratios):>14.2f}x {min(ratios):>6.2f}-{max(ratios):.2f}x {goal:>5.1f}x"
        )


if __name__ == "__main__":
    main()

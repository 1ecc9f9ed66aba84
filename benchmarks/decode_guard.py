"""What the decode-cost bounds cost an honest dataset: the JPEG scan count and the 16-bit PNG conversion.

On the photo set of ``input_pipeline.py`` (real photographs, ImageNet-sized
JPEGs, q90, baseline and progressive copies of each), in this process, one
thread, CPU time:

* **scan bound**: the scan count (a ``bytes.count`` over the file, the new
  part of ``image_guard.check_jpeg``) and the whole guard (header walk + scan
  count) against the decode they guard (``decode.decode_crop``, a training
  crop at 224 px with this machine's decoder); ratio per file, median and range.
* **16-bit PNG**: the same photos as 16-bit grey PNGs through ``decode_crop``
  (PNG decode, conversion to uint8 RGB by ``decode.rgb_pixels`` in bands of
  rows, crop) against the same call with the conversion it replaced (one
  int64 copy of the whole image); time ratio, and peak traced memory of the
  conversion alone at ImageNet size and at 4096 x 4096.

    python benchmarks/decode_guard.py [--images 300] [--photos DIR]

Needs scikit-image (``pip install hpctrain[bench]``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from input_pipeline import build_photo_set  # noqa: E402


def old_wide_grey(image: Image.Image) -> np.ndarray:
    """The 16-bit conversion before the bound: one int64 copy of the image and its arithmetic."""
    wide = np.asarray(image).astype(np.int64, copy=False)
    grey = ((np.clip(wide, 0, 65535) + 128) // 257).astype(np.uint8)
    return np.repeat(grey[:, :, None], 3, axis=2)


def cpu_seconds(work, repeats: int = 3) -> float:  # noqa: ANN001 - a callable
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best


def peak_bytes(work) -> int:  # noqa: ANN001 - a callable
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--photos", type=Path, default=Path(tempfile.gettempdir()) / "hpctrain-bench-photos")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from hpctrain.trainer.data import decode as decoding
    from hpctrain.trainer.data.augment import train_crop
    from hpctrain.trainer.data.decode import decode_crop, jpeg_decoder, rgb_pixels
    from hpctrain.trainer.data.image_guard import check_jpeg

    root = build_photo_set(args.photos, args.images)
    photos = sorted((root / "train").rglob("*.jpg"))
    work = Path(tempfile.mkdtemp(prefix="hpctrain-guard-bench-"))
    files = []
    for n, path in enumerate(photos):
        progressive = work / f"p{n}.jpg"
        Image.open(path).save(progressive, "JPEG", quality=90, progressive=True)
        files += [path, progressive]

    counts, guards, scans = [], [], []
    for n, path in enumerate(files):
        data = path.read_bytes()
        scans.append(check_jpeg(data).scans)
        count = cpu_seconds(lambda data=data: [data.count(b"\xff\xda") for _ in range(200)]) / 200
        guard = cpu_seconds(lambda data=data: [check_jpeg(data) for _ in range(20)]) / 20
        box = lambda w, h, n=n: train_crop(0, 0, n, w, h)  # noqa: E731
        decode = cpu_seconds(lambda path=path, box=box: decode_crop(str(path), box, 224))
        counts.append(count / decode)
        guards.append(guard / decode)
    print(f"{len(files)} JPEGs ({len(photos)} photos, baseline and progressive), decoder {jpeg_decoder()}")
    print(f"scans per file: {min(scans)}-{max(scans)}")
    print(f"scan count / decode_crop: {spread(counts)}")
    print(f"whole guard (header walk + scan count) / decode_crop: {spread(guards)}")

    times, peaks = [], []
    for n, path in enumerate(photos[:100]):
        grey = np.asarray(Image.open(path).convert("L"), dtype=np.uint16) * 257
        png = work / f"g{n}.png"
        Image.fromarray(grey).save(png)
        box = lambda w, h, n=n: train_crop(0, 0, n, w, h)  # noqa: E731
        new = cpu_seconds(lambda png=png, box=box: decode_crop(str(png), box, 224))
        decoding.rgb_pixels = old_wide_grey
        old = cpu_seconds(lambda png=png, box=box: decode_crop(str(png), box, 224))
        decoding.rgb_pixels = rgb_pixels
        times.append(new / old)
        image = Image.open(png)
        image.load()
        peaks.append(peak_bytes(lambda i=image: rgb_pixels(i)) / peak_bytes(lambda i=image: old_wide_grey(i)))
    print(f"16-bit PNG at ImageNet size ({len(times)} photos): decode_crop time new/old {spread(times)}")
    print(f"  conversion's peak memory new/old {spread(peaks)}")
    side = 4096
    big = Image.fromarray((np.arange(side * side, dtype=np.uint32) % 65536).astype(np.uint16).reshape(side, side))
    new, old = peak_bytes(lambda: rgb_pixels(big)), peak_bytes(lambda: old_wide_grey(big))
    speed = cpu_seconds(lambda: rgb_pixels(big), 1) / cpu_seconds(lambda: old_wide_grey(big), 1)
    print(
        f"16-bit PNG {side} x {side} conversion: peak {new / side**2:.2f} B/px new, {old / side**2:.2f} B/px old "
        f"(ratio {new / old:.3f}); time new/old {speed:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Data start-up on an ImageNet-shaped tree: the folder (one scan of every split) vs its packed image.

Builds ``--classes`` class folders holding ``--files`` small JPEGs in train/
(10 per class in val/), packs them with ``hpctrain pack``, and times, each in a
fresh process: ``build_datasets`` (what a task does before its first step:
folder: list the tree; image: mount it with squashfuse and read the index
stored inside) and the first sample. Also the file-system calls that matter
on a shared file system: directory entries listed. The page cache is warm
here (no root to drop it), so the folder's numbers flatter a shared file
system, where each listing is a metadata-server round trip.

Pack's own cost is measured against its baseline in the same run: plain
``mksquashfs`` of the tree's folders (what pack ran before it walked the tree
itself and handed mksquashfs the list of what the job reads).

    .venv/bin/python benchmarks/packed_startup.py --files 200000 --work /tmp/pack-bench
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image

CHILD = """
import json, sys, time
from pathlib import Path
started = time.perf_counter()
from hpctrain.jobspec.models import Data
from hpctrain.trainer.data import build_datasets
spec = Data(root=sys.argv[1], image_size=32, val_resize=36, workers=0, stage_dir=sys.argv[2])
imported = time.perf_counter()
train, val = build_datasets(spec)
built = time.perf_counter()
train[0]
first = time.perf_counter()
print(json.dumps({"import_s": imported - started, "build_datasets_s": built - imported,
                  "first_sample_s": first - built, "train": len(train), "val": len(val)}))
"""


def make_tree(root: Path, classes: int, files: int, val_per_class: int) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (48, 48), (120, 80, 40)).save(buffer, "JPEG", quality=80)
    jpeg = buffer.getvalue()
    per_class = files // classes
    for split, count in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                # distinct bytes after the JPEG's end: mksquashfs would store identical files once
                (folder / f"n{c:08d}_{i}.JPEG").write_bytes(jpeg + f"{split}{c}-{i}".encode())


def child(root: Path, stage: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", CHILD, str(root), str(stage)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000, help="train images (default 200,000)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--work", type=Path, default=Path("/tmp/hpctrain-pack-bench"))
    args = parser.parse_args()
    from hpctrain.dataset import mount_release
    from hpctrain.dataset.pack import pack

    tree, image, stage = args.work / "tree", args.work / "data.sqsh", args.work / "stage"
    if not (tree / "train").is_dir():
        started = time.perf_counter()
        make_tree(tree, args.classes, args.files, args.val_per_class)
        print(f"made the tree in {time.perf_counter() - started:.1f} s")
    stage.mkdir(parents=True, exist_ok=True)
    plain = args.work / "plain.sqsh"
    started = time.perf_counter()
    sources = [str(tree / name) for name in sorted(os.listdir(tree))]
    subprocess.run(["mksquashfs", *sources, str(plain), "-noappend", "-no-xattrs", "-no-progress"], check=True,
                   capture_output=True)  # fmt: skip
    baseline = time.perf_counter() - started
    plain.unlink()
    result = pack(tree, image, force=True, log=lambda line: None, progress=False)
    print(
        f"pack: {result.files} files, {result.bytes / 2**20:.1f} MiB -> {result.image_bytes / 2**20:.1f} MiB "
        f"in {result.seconds:.1f} s; plain mksquashfs of the folders {baseline:.1f} s "
        f"(ratio {result.seconds / baseline:.2f})"
    )
    folder, packed = child(tree, stage), child(image, stage)
    for point in stage.glob("hpctrain-*/job-*/mnt-*"):  # the child's watcher would, once it sees it gone
        mount_release.release(point, None)
    entries = result.files + sum(1 for _ in tree.rglob("*") if _.is_dir())
    print(f"{'':22} {'folder':>10} {'image':>10}")
    for key in ("build_datasets_s", "first_sample_s"):
        print(f"{key:22} {folder[key]:10.2f} {packed[key]:10.2f}")
    print(f"{'entries listed':22} {entries:10d} {0:10d}")
    print(f"samples: train {folder['train']} / {packed['train']}, val {folder['val']} / {packed['val']}")
    print(f"ratio build_datasets image/folder: {packed['build_datasets_s'] / folder['build_datasets_s']:.2f}")
    if os.environ.get("KEEP") != "1":
        shutil.rmtree(stage, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

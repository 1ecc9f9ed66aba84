"""The dataset index: every (relative path, label) of an ImageFolder split and its class names.

Built by one scan of the tree per job, not one per rank: rank 0 scans (or reads
the cache) and the others receive the list (``shared_index``). The cache file
is keyed by the split's absolute path and the mtimes of the split folder and
its class folders (adding or removing an image changes its folder's mtime), so
a requeued job reads the index back instead of walking GPFS again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
INDEX_VERSION = 1


class IndexError_(ValueError):
    """The split has no class folders, or no images at all."""


@dataclass
class DatasetIndex:
    """One split: ``samples[i] = (path relative to root, label)``; labels index ``classes``."""

    root: str
    classes: list[str]
    samples: list[tuple[str, int]]
    empty_classes: list[str] = field(default_factory=list)

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.samples[i][0])

    @property
    def targets(self) -> list[int]:
        return [label for _, label in self.samples]

    def to_json(self) -> dict:
        return {
            "version": INDEX_VERSION,
            "root": self.root,
            "classes": self.classes,
            "samples": self.samples,
            "empty_classes": self.empty_classes,
        }

    @classmethod
    def from_json(cls, data: dict) -> DatasetIndex:
        return cls(
            data["root"],
            list(data["classes"]),
            [(p, int(label)) for p, label in data["samples"]],
            list(data.get("empty_classes", [])),
        )


def scan_split(root: str | Path) -> DatasetIndex:
    """One walk of ``root/<class>/...``: torchvision ImageFolder's classes, order and extensions.

    A class folder without images keeps its label (so train and val labels still
    match) and is listed in ``empty_classes``; no class folders, or no image at
    all, raises ``IndexError_``.
    """
    root = str(Path(root).resolve())
    with os.scandir(root) as entries:
        classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise IndexError_(f"no class folders in {root}")
    samples: list[tuple[str, int]] = []
    empty: list[str] = []
    for label, name in enumerate(classes):
        found = 0
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, name), followlinks=True):
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            for fname in sorted(filenames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(rel, fname), label))
                    found += 1
        if not found:
            empty.append(name)
    if not samples:
        raise IndexError_(f"no images ({', '.join(IMG_EXTENSIONS)}) under {root}")
    for name in empty:
        log.warning(
            "hpctrain: class folder %s has no images; its label is kept, no sample uses it", os.path.join(root, name)
        )
    return DatasetIndex(root, classes, samples, empty)


def cache_key(root: str | Path) -> str:
    """Path + mtimes of the split folder and its class folders (stats, not listings of the images)."""
    root = str(Path(root).resolve())
    parts = [root, str(os.stat(root).st_mtime_ns)]
    with os.scandir(root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_dir():
                parts.append(f"{entry.name}:{entry.stat().st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cached_index(root: str | Path, cache_dir: str | Path | None) -> DatasetIndex:
    """``scan_split`` through a cache file in ``cache_dir`` (None: always scan)."""
    if cache_dir is None:
        return scan_split(root)
    key = cache_key(root)
    path = Path(cache_dir) / f"index-{key}.json"
    try:
        data = json.loads(path.read_text())
        if data.get("version") == INDEX_VERSION:
            return DatasetIndex.from_json(data)
    except (OSError, ValueError, KeyError):
        pass
    index = scan_split(root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
            json.dump(index.to_json(), tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, path)
    except OSError as exc:  # a read-only cache is no reason to stop
        log.warning("hpctrain: could not write the dataset index cache %s: %s", path, exc)
    return index


Broadcast = Callable[[DatasetIndex | None], DatasetIndex]


def shared_index(
    root: str | Path, *, cache_dir: str | Path | None = None, is_leader: bool = True, broadcast: Broadcast | None = None
) -> DatasetIndex:
    """The split's index, scanned by the leader only and handed to every rank by ``broadcast``.

    ``broadcast(index_or_None)`` returns the leader's index on every rank (see
    ``torch_broadcast``). Without it (one process) the caller scans itself.
    """
    if broadcast is None:
        return cached_index(root, cache_dir)
    result: DatasetIndex | BaseException | None = None
    if is_leader:
        try:
            result = cached_index(root, cache_dir)
        except (OSError, IndexError_) as exc:  # every rank must raise, not only the leader
            result = exc
    shared = broadcast(result)
    if isinstance(shared, BaseException):
        raise shared
    return shared


def torch_broadcast(value: object) -> object:
    """Rank 0's ``value`` on every rank of the default process group (pickled, on the CPU)."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]

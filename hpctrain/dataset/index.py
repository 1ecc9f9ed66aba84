"""The dataset index: every (relative path, label) of an ImageFolder split and its class names.

Built by one scan of the tree per job, not one per rank: rank 0 scans (or reads
the cache) and the others receive the list (``shared_index``). The cache file
is keyed by the split's absolute path and the mtimes of the split folder and
its class folders (adding or removing an image changes its folder's mtime), so
a requeued job reads the index back instead of walking GPFS again.

The scan is ``walk``'s, the one ``hpctrain pack`` makes too: symlinked
folders and files are followed (as ImageFolder does), each folder of a class
entered once, loops, pseudo file systems and entries that are not regular
files cut, with a warning naming them. A folder that cannot be listed stops
the job with its name and the fix, rather than dropping its images (a class
without them would still train, silently).
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
from typing import Any

from hpctrain.contract.runfiles import RunFileError, load_json, open_regular, printable, real_path
from hpctrain.dataset.walk import NOT_A_FILE, Tree, walk

log = logging.getLogger(__name__)

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
INDEX_VERSION = 1
MAX_INDEX_BYTES = 2**31  # a stored index (cache or packed); ImageNet-1k's is about 70 MB
SHOWN_CUT = 20  # warnings about paths not followed, per split


class IndexError_(ValueError):
    """The split has no class folders, no images at all, or a folder that cannot be read."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:  # the hint survives shared_index's broadcast
        return type(self), (str(self), self.hint)


@dataclass
class DatasetIndex:
    """One split: ``samples[i] = (path relative to root, label)``; labels index ``classes``.

    ``follow_links`` False (a packed image's tree): a sample that is a symlink is not opened.
    """

    root: str
    classes: list[str]
    samples: list[tuple[str, int]]
    empty_classes: list[str] = field(default_factory=list)
    follow_links: bool = True

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
    def from_json(
        cls, data: Any, root: str, *, max_samples: int | None = None, max_classes: int | None = None
    ) -> DatasetIndex:
        """The one parser of a stored index (the index cache, a packed image's): untrusted, checked whole.

        What a scan writes is what is accepted: sorted unique class names, each sample a
        ``[CLASS/.../NAME.jpg, label]`` pair whose first folder is its label's class (no absolute
        path, no ``..``, listed once), ``empty_classes`` exactly the classes no sample uses; at most
        ``max_samples`` samples and ``max_classes`` classes. ``root`` is where the caller found the
        split, never the document's own. ``ValueError`` naming the first problem.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a split is a JSON object, not {type(data).__name__}")
        classes, samples, empty = data.get("classes"), data.get("samples"), data.get("empty_classes", [])
        if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
            raise ValueError("'classes' is not a list of class names")
        if max_classes is not None and len(classes) > max_classes:
            raise ValueError(f"{len(classes)} classes, more than the {max_classes} folders it can hold")
        if classes != sorted(set(classes)) or not all(_plain_name(c) for c in classes):
            raise ValueError("'classes' are not the sorted, distinct folder names a scan lists")
        if not isinstance(samples, list):
            raise ValueError("'samples' is not a list")
        if max_samples is not None and len(samples) > max_samples:
            raise ValueError(f"{len(samples)} samples, more than the {max_samples} files it can hold")
        checked = [_sample(item, classes) for item in samples]
        if len({path for path, _ in checked}) != len(checked):
            raise ValueError("a sample is listed twice")
        used = {label for _, label in checked}
        if not isinstance(empty, list) or empty != [c for n, c in enumerate(classes) if n not in used]:
            raise ValueError("'empty_classes' are not the classes without samples")
        return cls(root, list(classes), checked, list(empty))


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _sample(item: Any, classes: list[str]) -> tuple[str, int]:
    if not (isinstance(item, list) and len(item) == 2):
        raise ValueError(f"sample {printable(item)[:80]} is not a [path, label] pair")
    path, label = item
    if type(label) is not int or not 0 <= label < len(classes):  # a bool is no label
        raise ValueError(f"sample {printable(path)[:80]} has the label {printable(label)[:20]}")
    if not isinstance(path, str) or not path.lower().endswith(IMG_EXTENSIONS):
        raise ValueError(f"sample {printable(path)[:80]} is not the path of an image")
    parts = path.split("/")
    if len(parts) < 2 or parts[0] != classes[label] or not all(_plain_name(part) for part in parts):
        raise ValueError(f"sample path {printable(path)[:80]} is not inside its class folder {classes[label]!r}")
    return path, label


def scan_split(root: str | Path) -> DatasetIndex:
    """One walk of ``root/<class>/...`` (``walk``'s rules): torchvision ImageFolder's classes, order and extensions.

    A class folder without images keeps its label (so train and val labels still
    match) and is listed in ``empty_classes``; no class folders, no image at all,
    or a folder that cannot be listed raises ``IndexError_``.
    """
    root = str(real_path(root))
    try:
        tree = walk(root, scope_depth=1, hidden_top=False)
    except OSError as exc:
        raise _unreadable(root, exc) from None
    return index_of(tree)


def index_of(tree: Tree) -> DatasetIndex:
    """The index of the split that ``tree`` walked (also a part of ``pack``'s walk of the whole root)."""
    if tree.unreadable:
        rel, exc = tree.unreadable[0]
        raise _unreadable(os.path.join(tree.top, rel), exc)
    _warn_cut(tree)
    classes = [folder for folder in tree.folders if "/" not in folder and not folder.startswith(".")]
    if not classes:
        raise IndexError_(f"no class folders in {tree.top!r}")
    label = {name: number for number, name in enumerate(classes)}
    samples: list[tuple[str, int]] = []
    for path in tree.files:
        name, slash, rest = path.partition("/")
        if slash and name in label and path.lower().endswith(IMG_EXTENSIONS):
            samples.append((path, label[name]))
    if not samples:
        raise IndexError_(f"no images ({', '.join(IMG_EXTENSIONS)}) under {tree.top!r}")
    used = {label for _, label in samples}
    empty = [name for name in classes if label[name] not in used]
    for name in empty:
        folder = os.path.join(tree.top, name)
        log.warning("hpctrain: class folder %r has no images; its label is kept, no sample uses it", folder)
    return DatasetIndex(tree.top, classes, samples, empty)


def _warn_cut(tree: Tree) -> None:
    """One warning per link not followed or image-named entry that is not a file (the first few)."""
    shown = [
        (path, why) for path, why in tree.cut if path.lower().endswith(IMG_EXTENSIONS) or not why.endswith(NOT_A_FILE)
    ]
    for path, why in shown[:SHOWN_CUT]:
        log.warning("hpctrain: not following %r: %s", os.path.join(tree.top, path), why)
    if len(shown) > SHOWN_CUT:
        log.warning("hpctrain: ... and %d more paths of %r not followed", len(shown) - SHOWN_CUT, tree.top)


def _read_own_file(path: Path, max_bytes: int) -> bytes:
    """A regular file of at most ``max_bytes`` that this user owns; RunFileError or OSError otherwise."""
    with open_regular(path) as handle:
        owner = os.fstat(handle.fileno()).st_uid
        if owner != os.geteuid():
            raise RunFileError(f"{path}: written by user {owner}, not by you; not trusted")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RunFileError(f"{path}: larger than {max_bytes} bytes")
    return data


def _unreadable(folder: str, exc: OSError) -> IndexError_:
    return IndexError_(
        f"cannot list {folder!r} ({exc.strerror or exc})",
        hint=f"make it readable to the job (chmod -R a+rX {printable(folder)!r}) or move it out of the split: "
        "without its images the class would still train, without telling you",
    )


def cache_key(root: str | Path) -> str:
    """Path + mtimes of the split folder and its class folders (stats, not listings of the images)."""
    root = str(real_path(root))
    parts = [root, str(os.stat(root).st_mtime_ns)]
    with os.scandir(root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_dir():
                parts.append(f"{entry.name}:{entry.stat().st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cached_index(root: str | Path, cache_dir: str | Path | None) -> DatasetIndex:
    """``scan_split`` through a cache file in ``cache_dir`` (None: always scan).

    The cache folder may be shared, so a cache file is input like any other: used only when it
    is a regular file of this user's (not a FIFO someone planted, not another user's list), it
    parses (``DatasetIndex.from_json``) and it is the index of this very split; otherwise the
    split is scanned (with a warning naming the file) and the file written anew.
    """
    if cache_dir is None:
        return scan_split(root)
    try:
        key = cache_key(root)
    except OSError:
        return scan_split(root)  # which names what cannot be read
    path = Path(cache_dir) / f"index-{key}.json"
    split = str(real_path(root))
    try:
        data = load_json(_read_own_file(path, MAX_INDEX_BYTES))
        if not isinstance(data, dict) or data.get("version") != INDEX_VERSION or data.get("root") != split:
            raise ValueError("not an index of this split")
        return DatasetIndex.from_json(data, split)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, RunFileError) as exc:
        log.warning("hpctrain: not using the index cache %r (%s); scanning the split", str(path), printable(exc))
    index = scan_split(root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
            json.dump(index.to_json(), tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, path)
    except OSError as exc:  # a read-only cache is no reason to stop
        log.warning("hpctrain: could not write the dataset index cache %r: %s", str(path), printable(exc))
    return index


Broadcast = Callable[[DatasetIndex | None], DatasetIndex]


def shared_index(
    root: str | Path,
    *,
    cache_dir: str | Path | None = None,
    is_leader: bool = True,
    broadcast: Broadcast | None = None,
    load: Callable[[], DatasetIndex] | None = None,
) -> DatasetIndex:
    """The split's index, scanned by the leader only and handed to every rank by ``broadcast``.

    ``broadcast(index_or_None)`` returns the leader's index on every rank (see
    ``torch_broadcast``). Without it (one process) the caller scans itself.
    ``load`` replaces the scan (e.g. the index stored in a packed image).
    """
    load = load or (lambda: cached_index(root, cache_dir))
    if broadcast is None:
        return load()
    result: DatasetIndex | BaseException | None = None
    if is_leader:
        try:
            result = load()
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

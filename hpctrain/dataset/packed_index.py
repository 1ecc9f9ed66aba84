"""A packed image's index, read as untrusted input: bounded by the image, checked whole, never followed out.

An image may come from anyone (a shared dataset folder, a colleague's
scratch), and the index inside it says which files a job reads. So the node
that mounted it (``mount``) reads it under bounds that follow from the image
itself:

* the index file: a regular file (a FIFO in the image would hang the read),
  at most ``INDEX_BYTES_PER_IMAGE_BYTE`` times the image's size plus 1 MiB
  (an honest index is a fraction of its image: ImageNet's is 70 MB in
  150 GB), JSON nested at most 64 levels (``runfiles.load_json``);
* each split through ``DatasetIndex.from_json`` (the index cache's parser
  too), with at most one sample per ``BYTES_PER_SAMPLE`` bytes of the image
  (a directory entry costs a compressed image about 2 bytes at the least:
  2.25 measured for 20,000 hard links of one file) and at most the image's
  inode count of classes (each class is a folder of its own).

The image's size and inode count are the mount's (``statvfs``: squashfuse
and the kernel report the superblock's, the size rounded up to a block), so
the image file itself need not be reachable (under Apptainer it may not be).
* nothing in it leads out of the image: the split folder, its class folders
  and every folder a sample lies in must be real folders of the mounted
  image (a symlink ``train -> /home/victim/photos`` is refused), and sample
  files are opened without following a last link (``DatasetIndex.follow_links``:
  a linked file is skipped and counted).

Every problem is an ``ImageError`` naming the index and the fix. Torch-free.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from hpctrain.contract.runfiles import RunFileError, load_json, printable, read_bounded
from hpctrain.dataset.index import MAX_INDEX_BYTES, DatasetIndex
from hpctrain.dataset.squashfs import INDEX_NAME, ImageError

PACKED_FORMAT = "hpctrain-packed-index"
INDEX_BYTES_PER_IMAGE_BYTE = 16
BYTES_PER_SAMPLE = 2
_AGAIN = "pack the dataset again with `hpctrain pack` (or ask whoever packed it)"


def read_packed(point: Path) -> dict[str, Any] | None:
    """The index document stored in the image mounted at ``point`` (None: an image packed otherwise)."""
    path = point / INDEX_NAME
    if not os.path.lexists(path):
        return None
    image_bytes, _ = _image_size(point)
    limit = min(MAX_INDEX_BYTES, INDEX_BYTES_PER_IMAGE_BYTE * image_bytes + 2**20)
    try:
        data = load_json(read_bounded(path, limit))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RunFileError) as exc:
        why = printable(getattr(exc, "message", None) or getattr(exc, "strerror", None) or exc)
        corrupt = " (is the image corrupt? copy it again)" if isinstance(exc, OSError) else ""
        raise ImageError(f"cannot read the index {path}: {why}{corrupt}", _AGAIN) from None
    if not (isinstance(data, dict) and data.get("format") == PACKED_FORMAT and data.get("version") == 1):
        raise ImageError(f"{path} is not an index written by `hpctrain pack` (format, version)", _AGAIN)
    if not isinstance(data.get("splits"), dict):
        raise ImageError(f"the index {path} is malformed: 'splits' is not an object", _AGAIN)
    return data


def packed_split(point: Path, document: dict[str, Any], split: str) -> DatasetIndex | None:
    """Split ``split`` of ``document`` (``read_packed``'s), checked against the image; None when it has none."""
    found = document["splits"].get(split)
    if found is None:
        return None
    image_bytes, inodes = _image_size(point)
    try:
        index = DatasetIndex.from_json(
            found, str(point / split), max_samples=image_bytes // BYTES_PER_SAMPLE, max_classes=inodes
        )
    except ValueError as exc:
        raise ImageError(f"the index {point / INDEX_NAME} is malformed: {split}: {printable(exc)}", _AGAIN) from None
    index.follow_links = False
    folders = {split} | {f"{split}/{name}" for name in index.classes}
    folders |= {f"{split}/{path.rsplit('/', 1)[0]}" for path, _ in index.samples}
    for folder in sorted(folders, key=lambda f: (f.count("/"), f)):
        _real_folder(point, folder)
    return index


def _image_size(point: Path) -> tuple[int, int]:
    """(bytes, inodes) of the image mounted at ``point``."""
    try:
        info = os.statvfs(point)
    except OSError as exc:
        raise ImageError(f"cannot read the mounted image at {point}: {exc.strerror}", _AGAIN) from None
    return info.f_blocks * info.f_frsize, info.f_files


def _real_folder(point: Path, folder: str) -> None:
    """``point/folder`` is a folder of the image itself, not a link that would lead onto this machine."""
    try:
        mode = os.lstat(point / folder).st_mode
    except OSError as exc:
        raise ImageError(
            f"the image's index names {printable(folder)}/, which the image does not hold ({exc.strerror})", _AGAIN
        ) from None
    if stat.S_ISLNK(mode):
        raise ImageError(
            f"{printable(folder)} in the image is a symlink: its files would be read from this machine, "
            "not from the image; not followed",
            "pack the dataset with `hpctrain pack`, which stores what links lead to, never a link",
        )
    if not stat.S_ISDIR(mode):
        raise ImageError(f"{printable(folder)} in the image is not a folder", _AGAIN)

"""``hpctrain pack``: an ImageFolder tree -> one SquashFS image with its scan index inside.

A job on a shared filesystem opens every image file of the tree, each epoch,
on every node; a packed image is one file per node instead (mounted with
squashfuse, see ``mount``). ``mksquashfs`` writes the tree (in parallel, with
its progress bar on a terminal) in one pass, with ``INDEX_NAME`` (the index
of every split, exactly what a job's scan of the mounted tree would build, so
the job never lists the tree) as one more source: mksquashfs puts each
source at the image's top. (Appending the index afterwards rereads the whole
image: minutes for 200,000 files. Pseudo files vary across 4.x versions.)

Nothing of the user's is lost: the image is written under a temporary name
next to OUT and renamed over it only when it is complete and checked; an
existing OUT is refused unless ``force``. Files that cannot be read (and
symlinks, which an image stores as links pointing outside it) are left out
and listed, or refused with ``strict``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.dataset.index import IndexError_, scan_split
from hpctrain.dataset.squashfs import INDEX_NAME, ImageError, check_image, read_superblock, require_tool

REQUIRED_SPLITS = ("train", "val")
OVERHEAD = 1.05  # image = data (JPEGs do not compress; small tails share fragment blocks), 5% spare
PER_FILE_BYTES = 256  # inode, directory entry and index line of one file, generously
PACKED_FORMAT = "hpctrain-packed-index"
SHOWN_SKIPPED = 10


class PackError(ValueError):
    """Pack cannot start or failed; ``hint`` is the fix."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


@dataclass
class Survey:
    """The tree as pack sees it: what goes in, and what is left out and why."""

    files: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path relative to the root, why)


@dataclass(frozen=True)
class PackResult:
    out: Path
    files: int
    bytes: int
    image_bytes: int
    seconds: float
    skipped: list[tuple[str, str]]


def survey(root: Path) -> Survey:
    """One walk of the tree: sizes of what goes in; unreadable files and symlinks are skipped."""
    found = Survey()
    for dirpath, dirnames, filenames in os.walk(root, onerror=lambda exc: found.skipped.append(_why(root, exc))):
        dirnames.sort()
        for name in list(dirnames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                found.skipped.append((os.path.relpath(path, root), "a symlink (the image would point outside)"))
                dirnames.remove(name)
            elif not os.access(path, os.R_OK | os.X_OK):
                found.skipped.append((os.path.relpath(path, root), "folder not readable"))
                dirnames.remove(name)
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found.skipped.append((rel, "a symlink (the image would point outside)"))
            elif not os.access(path, os.R_OK):
                found.skipped.append((rel, "not readable"))
            else:
                try:
                    found.bytes += os.stat(path).st_size
                    found.files += 1
                except OSError as exc:
                    found.skipped.append(_why(root, exc, rel))
    return found


def build_index(root: Path, skipped: list[tuple[str, str]]) -> dict:
    """The index document: every split folder's classes and samples, without the skipped paths."""
    gone = {rel for rel, _ in skipped}
    splits = {}
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if not entry.is_dir(follow_symlinks=False) or entry.name.startswith(".") or entry.name in gone:
            continue
        try:
            index = scan_split(entry.path)
        except (IndexError_, OSError):
            continue  # not an ImageFolder split: packed, not indexed
        samples = [(rel, label) for rel, label in index.samples if not _under(f"{entry.name}/{rel}", gone)]
        splits[entry.name] = {"classes": index.classes, "samples": samples, "empty_classes": index.empty_classes}
    return {"format": PACKED_FORMAT, "version": 1, "source": str(root), "splits": splits}


def pack(
    root: str | Path,
    out: str | Path,
    *,
    force: bool = False,
    strict: bool = False,
    processors: int | None = None,
    progress: bool | None = None,
    log: Callable[[str], None] = print,
) -> PackResult:
    """Write the image of ``root`` to ``out``; raises ``PackError`` (nothing written) on bad input."""
    started = time.perf_counter()
    root, out = Path(root).expanduser().resolve(), Path(out).expanduser().absolute()
    _check_input(root, out, force)
    mksquashfs = _tool("mksquashfs")
    _tool("unsquashfs")
    found = survey(root)
    _report_skipped(found.skipped, strict, log)
    _check_space(out, found)
    index = build_index(root, found.skipped)
    for split in REQUIRED_SPLITS:
        if not index["splits"].get(split, {}).get("samples"):
            raise PackError(f"{root / split} holds no readable images", "an ImageFolder split is SPLIT/CLASS/IMG.jpg")
    index.update(files=found.files, bytes=found.bytes)
    log(f"pack: {found.files} files, {found.bytes / 2**20:.1f} MiB from {root} -> {out}")
    with tempfile.TemporaryDirectory(prefix=".hpctrain-pack-", dir=out.parent) as work:
        tmp = Path(work) / out.name
        (Path(work) / INDEX_NAME).write_text(json.dumps(index, separators=(",", ":")))
        _mksquashfs(mksquashfs, root, tmp, found.skipped, processors, progress, Path(work))
        _verify(tmp)
        os.replace(tmp, out)
    seconds = time.perf_counter() - started
    image_bytes = out.stat().st_size
    return PackResult(out, found.files, found.bytes, image_bytes, seconds, found.skipped)


def _check_input(root: Path, out: Path, force: bool) -> None:
    if not root.is_dir():
        raise PackError(f"{root} is not a folder", "pass the dataset folder that holds train/ and val/")
    missing = [s for s in REQUIRED_SPLITS if not (root / s).is_dir()]
    if missing:
        raise PackError(
            f"{root} has no {' or '.join(f'{m}/' for m in missing)} folder",
            "pack the ImageFolder root: DATA_ROOT/train/<class>/*.jpg and DATA_ROOT/val/<class>/*.jpg",
        )
    if out.exists() and not force:
        raise PackError(f"{out} exists already", "choose another name, or pass --force to replace it")
    if out.exists() and not out.is_file():
        raise PackError(f"{out} is not a regular file", "choose a file name for the image")
    if not out.parent.is_dir():
        raise PackError(f"{out.parent} does not exist", "create the folder first, or choose another")
    if out == root or root in out.parents:
        raise PackError(f"{out} is inside the tree being packed", "write the image outside DATA_ROOT")


def _tool(name: str) -> str:
    try:
        return require_tool(name)
    except ImageError as exc:
        raise PackError(exc.message, exc.hint) from None


def _report_skipped(skipped: list[tuple[str, str]], strict: bool, log: Callable[[str], None]) -> None:
    if not skipped:
        return
    for rel, why in skipped[:SHOWN_SKIPPED]:
        log(f"pack: skipped {rel}: {why}")
    if len(skipped) > SHOWN_SKIPPED:
        log(f"pack: ... and {len(skipped) - SHOWN_SKIPPED} more")
    if strict:
        raise PackError(
            f"{len(skipped)} path(s) of the tree cannot go into the image (listed above)",
            "fix their permissions or replace the symlinks with files, or drop --strict to leave them out",
        )
    log(f"pack: {len(skipped)} path(s) left out of the image and its index")


def _check_space(out: Path, found: Survey) -> None:
    needed = int(found.bytes * OVERHEAD) + PER_FILE_BYTES * (found.files + 1)
    free = shutil.disk_usage(out.parent).free
    if needed > free:
        raise PackError(
            f"{out.parent} has {free / 2**30:.2f} GiB free; the image needs about {needed / 2**30:.2f} GiB",
            "write the image to a file system with more space, or free some",
        )


def _mksquashfs(
    mksquashfs: str,
    root: Path,
    tmp: Path,
    skipped: list[tuple[str, str]],
    processors: int | None,
    progress: bool | None,
    work: Path,
) -> None:
    """One mksquashfs pass: the root's entries and the index file as sources, each at the image's top."""
    gone = {rel for rel, _ in skipped}
    top = [root / name for name in sorted(os.listdir(root)) if name != INDEX_NAME and name not in gone]
    command = [mksquashfs, *map(str, top), str(work / INDEX_NAME), str(tmp), "-noappend", "-no-xattrs"]
    if skipped:
        excludes = work / "excludes"
        excludes.write_text("".join(f"{root / rel}\n" for rel, _ in skipped))  # absolute: one meaning
        command += ["-ef", str(excludes)]
    if processors:
        command += ["-processors", str(processors)]
    show = sys.stdout.isatty() if progress is None else progress
    if show:
        if subprocess.run(command, check=False).returncode != 0:
            raise PackError(f"mksquashfs failed writing {tmp}", "see its message above")
    else:
        _run([*command, "-no-progress"], what="writing the image")


def _run(command: list[str], *, what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, errors="replace", check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PackError(f"mksquashfs failed {what}: {' / '.join(tail)}", "see the message; is the disk full?")


def _verify(image: Path) -> None:
    try:
        read_superblock(image)
    except ImageError as exc:
        raise PackError(f"the new image does not check out: {exc.message}", "pack again") from None
    problems = check_image(image, REQUIRED_SPLITS + (INDEX_NAME,))
    if problems:
        raise PackError(f"the new image does not check out: {problems[0].message}", "pack again")


def _under(rel: str, gone: set[str]) -> bool:
    parts = rel.split("/")
    return any("/".join(parts[:n]) in gone for n in range(1, len(parts) + 1))


def _why(root: Path, exc: OSError, rel: str | None = None) -> tuple[str, str]:
    where = rel if rel is not None else os.path.relpath(exc.filename or str(root), root)
    return where, exc.strerror or "unreadable"

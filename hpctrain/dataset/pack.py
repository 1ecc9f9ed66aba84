"""``hpctrain pack``: an ImageFolder tree -> one SquashFS image with its scan index inside.

A job on a shared filesystem opens every image file of the tree, each epoch,
on every node; a packed image is one file per node instead (mounted with
squashfuse, see ``mount``). The image holds what a job on the folder reads:
the tree is walked once by ``walk`` (the job's own scan), links followed to
readable files and folders and their content stored, and ``mksquashfs``
builds the image from that list alone (a pseudo file: one ``d`` line per
folder, one ``l`` line per file naming its path on this machine), in one
pass, in parallel, with its progress bar on a terminal. ``INDEX_NAME`` (the
index of every split, derived from the same walk) is one more line. What is
not listed is not in the image: no exclude list, nothing the walk cut.

Nothing of the user's is lost: the image is written under a temporary name
next to OUT and renamed over it only when it is complete and checked; an
existing OUT is refused unless ``force``. What cannot go in (files that
cannot be read, folders that cannot be listed, names with a line break,
which the pseudo file cannot carry, and what the walk cuts: loops, FIFOs,
devices, pseudo file systems) is listed and left out, or refused with ``strict``.
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
from typing import Any

from hpctrain.contract.child_process import start_child
from hpctrain.contract.runfiles import printable, real_path
from hpctrain.dataset.index import IndexError_, index_of
from hpctrain.dataset.packed_index import PACKED_FORMAT
from hpctrain.dataset.squashfs import INDEX_NAME, ImageError, check_image, count_entries, read_superblock, require_tool
from hpctrain.dataset.walk import Tree, walk

REQUIRED_SPLITS = ("train", "val")
OVERHEAD = 1.05  # image = data (JPEGs do not compress; small tails share fragment blocks), 5% spare
PER_FILE_BYTES = 256  # inode, directory entry and index line of one file, generously
SHOWN_SKIPPED = 10
MAX_PROCESSORS = 1024
LINE_BREAKS = ("\n", "\r")  # a pseudo file's lines cannot carry them, escaped or not
_ESCAPES = str.maketrans({char: "\\" + char for char in " \t\x0b\x0c\\\"'#"})  # what mksquashfs splits or reads on


class PackError(ValueError):
    """Pack cannot start or failed; ``hint`` is the fix."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


@dataclass
class Survey:
    """The tree as pack sees it: what goes in, and what is left out and why."""

    tree: Tree  # the folders and files that go in (the walk, less what cannot)
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
    links: int = 0


def survey(root: Path) -> Survey:
    """The walk of ``root`` (``walk``'s rules: what a job reads), less what cannot go into the image."""
    try:
        walked = walk(root, scope_depth=2)
    except OSError as exc:
        raise PackError(f"cannot list {printable(root)}: {exc.strerror or exc}", "make it readable") from None
    skipped = [*walked.cut, *((rel, f"folder not readable ({exc.strerror or exc})") for rel, exc in walked.unreadable)]
    gone = {rel for rel, _ in skipped}
    folders = []
    for rel in walked.folders:
        if _under(rel, gone):
            continue
        if any(mark in rel.rsplit("/", 1)[-1] for mark in LINE_BREAKS):
            skipped.append((rel, "its name holds a line break, which mksquashfs's list cannot carry"))
            gone.add(rel)
            continue
        folders.append(rel)
    found = Survey(Tree(walked.top, folders, links=walked.links, targets=walked.targets), skipped=skipped)
    for rel in walked.files:
        if _under(rel, gone):
            continue
        why = _unpackable(root, rel, walked.targets.get(rel))
        if why is None:
            try:
                found.bytes += os.stat(f"{root}/{rel}").st_size
            except OSError as exc:
                why = exc.strerror or "unreadable"
        if why is None:
            found.files += 1
            found.tree.files.append(rel)
        else:
            skipped.append((rel, why))
    return found


def _unpackable(root: Path, rel: str, target: str | None) -> str | None:
    if rel == INDEX_NAME:
        return "pack writes its own index there"
    name = rel.rsplit("/", 1)[-1]
    if "\n" in name or "\r" in name:
        return "its name holds a line break, which mksquashfs's list cannot carry"
    host = target or str(root)
    if "\n" in host or "\r" in host:
        return "its path on this machine holds a line break, which mksquashfs's list cannot carry"
    if not os.access(f"{root}/{rel}", os.R_OK):
        return "not readable"
    return None


def build_index(found: Survey) -> dict:
    """The index document: every split folder's classes and samples, as the job's scan of it would find them."""
    splits = {}
    top_folders = [rel for rel in found.tree.folders if "/" not in rel and not rel.startswith(".")]
    for name in top_folders:
        try:
            index = index_of(found.tree.below(name))
        except IndexError_ as exc:
            if name in REQUIRED_SPLITS:
                where = printable(Path(found.tree.top) / name)
                raise PackError(f"{where} is not an ImageFolder split: {printable(exc)}", _SPLIT_HINT) from None
            continue  # not an ImageFolder split: packed, not indexed
        splits[name] = {"classes": index.classes, "samples": index.samples, "empty_classes": index.empty_classes}
    return {"format": PACKED_FORMAT, "version": 1, "source": found.tree.top, "splits": splits}


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
    root, out = real_path(Path(root).expanduser()), _out_path(out)
    _check_input(root, out, force, processors)
    mksquashfs = _tool("mksquashfs")
    _tool("unsquashfs")
    found = survey(root)
    _report_skipped(found.skipped, strict, log)
    _check_space(out, found)
    index = build_index(found)
    for split in REQUIRED_SPLITS:
        if split not in index["splits"]:
            why = next((why for rel, why in found.skipped if rel == split), "left out (see the lines above)")
            raise PackError(f"{printable(root / split)} cannot be packed: {printable(why)}", _SPLIT_HINT)
    index.update(files=found.files, bytes=found.bytes)
    links = f", through {found.tree.links} symlink(s) followed" if found.tree.links else ""
    log(f"pack: {found.files} files, {found.bytes / 2**20:.1f} MiB from {printable(root)}{links} -> {printable(out)}")
    kept = set(found.tree.folders)
    folders = [(rel, target) for rel, target in found.tree.targets.items() if rel in kept]
    for rel, target in folders[:SHOWN_SKIPPED]:
        log(f"pack: followed {printable(rel)} -> {printable(target)} (its content is stored)")
    if len(folders) > SHOWN_SKIPPED:
        log(f"pack: ... and {len(folders) - SHOWN_SKIPPED} more linked folders")
    try:
        work_dir = tempfile.TemporaryDirectory(prefix=".hpctrain-pack-", dir=out.parent)
    except OSError as exc:
        raise PackError(f"cannot write in {printable(out.parent)}: {exc.strerror}", _WRITABLE_HINT) from None
    with work_dir as work:
        tmp = Path(work) / out.name
        try:
            (Path(work) / INDEX_NAME).write_text(json.dumps(index, separators=(",", ":")))
            (Path(work) / "pseudo").write_text(
                pseudo_definitions(root, found.tree, Path(work) / INDEX_NAME), errors="surrogateescape"
            )
            (Path(work) / "empty").mkdir()
        except OSError as exc:
            raise PackError(f"cannot write in {printable(out.parent)}: {exc.strerror}", _WRITABLE_HINT) from None
        _mksquashfs(mksquashfs, Path(work), tmp, processors, progress)
        _verify(tmp, 2 + len(found.tree.folders) + found.files)  # + its root and the index
        try:
            os.replace(tmp, out)
        except OSError as exc:
            raise PackError(f"cannot write {printable(out)}: {exc.strerror}", _WRITABLE_HINT) from None
    seconds = time.perf_counter() - started
    image_bytes = out.stat().st_size
    return PackResult(out, found.files, found.bytes, image_bytes, seconds, found.skipped, found.tree.links)


_WRITABLE_HINT = "write the image to a folder you can write to (and with room for it)"
_SPLIT_HINT = "an ImageFolder split is SPLIT/CLASS/IMG.jpg, readable by you"


def pseudo_definitions(root: Path, tree: Tree, index_file: Path) -> str:
    """mksquashfs's pseudo file: every folder (``d``) and file (``l``: its content, read at its path here).

    ``l`` stores what it finds without following a last link (a link inode, and a corrupt one at that, in
    squashfs-tools 4.5), so a file reached through a link is named by the real path the link leads to.
    """
    uid, gid = os.getuid(), os.getgid()
    lines = [f"{_escape(rel)} d 755 {uid} {gid}" for rel in tree.folders]
    lines += [f"{_escape(rel)} l {_escape(tree.targets.get(rel) or f'{root}/{rel}')}" for rel in tree.files]
    lines.append(f"{_escape(INDEX_NAME)} l {_escape(str(index_file))}")
    return "".join(line + "\n" for line in lines)


def _escape(path: str) -> str:
    if "\n" in path or "\r" in path:  # survey leaves such names out; never write one
        raise ValueError(f"a line break in {path!r}")
    return path.translate(_ESCAPES)


def _out_path(out: str | Path) -> Path:
    """OUT with its folder's links resolved (so "inside the tree" is judged where it really lands)."""
    out = Path(out).expanduser()
    if out.is_symlink():
        raise PackError(f"{printable(out)} is a symlink", "name the image file itself, not a link to it")
    return real_path(out.parent) / out.name


def _check_input(root: Path, out: Path, force: bool, processors: int | None) -> None:
    if processors is not None and (
        isinstance(processors, bool) or not isinstance(processors, int) or not 1 <= processors <= MAX_PROCESSORS
    ):
        raise PackError(
            f"--processors {printable(processors)} is not a number of threads", f"use 1 to {MAX_PROCESSORS}"
        )
    if not root.is_dir():
        raise PackError(f"{printable(root)} is not a folder", "pass the dataset folder that holds train/ and val/")
    missing = [s for s in REQUIRED_SPLITS if not (root / s).is_dir()]
    if missing:
        raise PackError(
            f"{printable(root)} has no {' or '.join(f'{m}/' for m in missing)} folder",
            "pack the ImageFolder root: DATA_ROOT/train/<class>/*.jpg and DATA_ROOT/val/<class>/*.jpg",
        )
    if out.exists() and not force:
        raise PackError(f"{printable(out)} exists already", "choose another name, or pass --force to replace it")
    if out.exists() and not out.is_file():
        raise PackError(f"{printable(out)} is not a regular file", "choose a file name for the image")
    if not out.parent.is_dir():
        raise PackError(f"{printable(out.parent)} does not exist", "create the folder first, or choose another")
    if out == root or root in out.parents or _same_folder(root, out.parent):
        raise PackError(f"{printable(out)} is inside the tree being packed", "write the image outside DATA_ROOT")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise PackError(f"cannot write in {printable(out.parent)}: permission denied", _WRITABLE_HINT)


def _same_folder(root: Path, folder: Path) -> bool:
    """Whether ``folder`` or a folder above it is ``root`` itself (a bind mount of the tree, say)."""
    try:
        identity = (root.stat().st_dev, root.stat().st_ino)
        return any((p.stat().st_dev, p.stat().st_ino) == identity for p in (folder, *folder.parents))
    except OSError:
        return False


def _tool(name: str) -> str:
    try:
        return require_tool(name)
    except ImageError as exc:
        raise PackError(exc.message, exc.hint) from None


def _report_skipped(skipped: list[tuple[str, str]], strict: bool, log: Callable[[str], None]) -> None:
    if not skipped:
        return
    for rel, why in skipped[:SHOWN_SKIPPED]:
        log(f"pack: skipped {printable(rel)}: {printable(why)}")
    if len(skipped) > SHOWN_SKIPPED:
        log(f"pack: ... and {len(skipped) - SHOWN_SKIPPED} more")
    if strict:
        raise PackError(
            f"{len(skipped)} path(s) of the tree cannot go into the image (listed above)",
            "fix their permissions, names or links, or drop --strict to leave them out",
        )
    log(f"pack: {len(skipped)} path(s) left out of the image and its index")


def _check_space(out: Path, found: Survey) -> None:
    needed = int(found.bytes * OVERHEAD) + PER_FILE_BYTES * (found.files + len(found.tree.folders) + 1)
    free = shutil.disk_usage(out.parent).free
    if needed > free:
        raise PackError(
            f"{printable(out.parent)} has {free / 2**30:.2f} GiB free; the image needs about {needed / 2**30:.2f} GiB",
            "write the image to a file system with more space, or free some",
        )


def _mksquashfs(mksquashfs: str, work: Path, tmp: Path, processors: int | None, progress: bool | None) -> None:
    """One mksquashfs pass over the pseudo file alone (its source is an empty folder: the image's root)."""
    command = [mksquashfs, str(work / "empty"), str(tmp), "-noappend", "-no-xattrs", "-root-mode", "755"]
    command += ["-pf", str(work / "pseudo")]
    if processors:
        command += ["-processors", str(processors)]
    show = sys.stdout.isatty() if progress is None else progress
    if show:
        done = _child(command)
        if done.returncode != 0:
            raise PackError(f"mksquashfs failed writing {printable(tmp)}", "see its message above")
    else:
        _run([*command, "-no-progress"], what="writing the image")


def _run(command: list[str], *, what: str) -> None:
    done = _child(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PackError(
            f"mksquashfs failed {what}: {printable(' / '.join(tail))}", "see the message; is the disk full?"
        )


def _child(command: list[str], **streams: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` of mksquashfs/unsquashfs that a stop signal can never wedge, and that ends with
    pack, even by SIGKILL, so none writes on (``contract/child_process.py``)."""
    proc = start_child(command, **streams)
    with proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            proc.kill()
            raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _verify(image: Path, entries: int) -> None:
    """The new image reads back whole (every inode, by a full listing), with every entry planned and the splits."""
    try:
        read_superblock(image)
        found = count_entries(image)
    except ImageError as exc:
        raise PackError(f"the new image does not check out: {exc.message}", "pack again") from None
    if found != entries:
        raise PackError(f"the new image holds {found} entries, not the {entries} planned", "pack again")
    problems = check_image(image, REQUIRED_SPLITS + (INDEX_NAME,))
    if problems:
        raise PackError(f"the new image does not check out: {problems[0].message}", "pack again")


def _under(rel: str, gone: set[str]) -> bool:
    parts = rel.split("/")
    return any("/".join(parts[:n]) in gone for n in range(1, len(parts) + 1))

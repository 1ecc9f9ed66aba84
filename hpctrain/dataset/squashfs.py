"""What a SquashFS dataset image is and holds, read without mounting it.

A packed dataset (``hpctrain pack``) is one SquashFS file: the ImageFolder tree
(``train/``, ``val/``) plus ``INDEX_NAME``, the scan index of every split, so a
job reads its file list instead of walking the tree. These checks run on the
login node (``validate``, ``doctor``, ``submit``'s preflight) and on the node
that mounts the image: each problem is one line naming the path and the fix.

The superblock (the first 96 bytes, little-endian) says how many bytes the
image uses; a file shorter than that was cut off while it was copied. Which
top-level folders an image holds is asked of ``unsquashfs -l IMAGE NAME``,
reading only its first lines (a full listing of ImageNet is 1.3M lines).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hpctrain.contract.runfiles import printable

MAGIC = b"hsqs"
SUPERBLOCK = struct.Struct("<IIIIIHHHHHHQQQQQQQQ")  # squashfs 4.0 superblock, 96 bytes
INDEX_NAME = ".hpctrain-index.json"
# Under Apptainer the container runtime mounts a packed data.root itself (an image-backed bind,
# rendered by hpctrain.launch.submission) here, and tells the task so in this variable.
APPTAINER_BIND = "/hpctrain-data"
BIND_ENV = "HPCTRAIN_DATA_IMAGE_BIND"
LIST_TIMEOUT_S = 60.0
INSTALL_HINT = {
    "mksquashfs": "install squashfs-tools (`apt install squashfs-tools`, `dnf install squashfs-tools`) "
    "or `module load squashfs-tools`",
    "unsquashfs": "install squashfs-tools (`apt install squashfs-tools`, `dnf install squashfs-tools`) "
    "or `module load squashfs-tools`",
    "squashfuse": "install squashfuse on the compute nodes (`apt install squashfuse fuse3`, "
    "`dnf install squashfuse`, `module load squashfuse`), or set data.root to the unpacked folder",
}


class ImageError(ValueError):
    """An image file that cannot be used; ``hint`` is the fix."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


@dataclass(frozen=True)
class Superblock:
    inodes: int
    block_size: int
    version: tuple[int, int]
    bytes_used: int


def is_image(path: str | Path) -> bool:
    """A regular file that starts with the SquashFS magic (a folder, or anything else, is not)."""
    try:
        if not Path(path).is_file():
            return False
        with open(path, "rb") as handle:
            return handle.read(4) == MAGIC
    except OSError:
        return False


def read_superblock(path: str | Path) -> Superblock:
    """The image's superblock; ``ImageError`` when ``path`` is not a SquashFS 4 image or is cut off."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(SUPERBLOCK.size)
            size = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from exc
    if head[:4] != MAGIC:
        raise ImageError(
            f"{path} is not a SquashFS image (it does not start with 'hsqs')",
            "point data.root at an image written by `hpctrain pack`, or at a dataset folder",
        )
    if len(head) < SUPERBLOCK.size:
        raise ImageError(f"{path} is truncated ({size} bytes, no complete superblock)", "copy or pack it again")
    fields = SUPERBLOCK.unpack(head)
    block = Superblock(inodes=fields[1], block_size=fields[3], version=(fields[9], fields[10]), bytes_used=fields[12])
    if block.version[0] != 4:
        raise ImageError(
            f"{path} is SquashFS version {block.version[0]}.{block.version[1]}; only 4.x is supported",
            "pack it again with a current mksquashfs (`hpctrain pack`)",
        )
    if size < block.bytes_used:
        raise ImageError(
            f"{path} is truncated: {size} bytes on disk, its superblock says {block.bytes_used}",
            "copy it again (the copy was cut off), or pack it again",
        )
    return block


def require_tool(name: str) -> str:
    """The tool's path; ``ImageError`` with how to install it when it is missing."""
    found = shutil.which(name)
    if found is None:
        raise ImageError(f"{name} is not installed (not on PATH)", INSTALL_HINT[name])
    return found


def has_top_entry(path: str | Path, name: str, *, timeout_s: float = LIST_TIMEOUT_S) -> bool:
    """Whether the image holds ``/name``: the first lines of ``unsquashfs -l IMAGE name``, then stop.

    ``ImageError`` naming the image corrupt when unsquashfs cannot read it (its answer is then no
    answer about ``name``: "no train/ folder" would send the user looking for the wrong problem).
    """
    unsquashfs = require_tool("unsquashfs")
    wanted = f"squashfs-root/{name}"
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [unsquashfs, "-l", "-d", "squashfs-root", str(path), name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            errors="replace",
        )
        try:
            assert proc.stdout is not None
            for number, line in enumerate(proc.stdout):
                if line.rstrip("\n") == wanted:
                    return True
                if number >= 2:
                    return False
            code = proc.wait(timeout=timeout_s)  # the listing ended: without name, or unreadable
        finally:
            proc.kill()
            proc.wait(timeout=timeout_s)
        errors.seek(0)
        said = errors.read(4096).decode(errors="replace")
    if code != 0 or "FATAL ERROR" in said:
        raise _corrupt(path, said)
    return False


def count_entries(path: str | Path) -> int:
    """Every entry of the image (its root included), counted from a full ``unsquashfs -l`` listing, streamed.

    Reading every inode is what proves an image whole; ``ImageError`` naming it corrupt when unsquashfs cannot.
    """
    unsquashfs = require_tool("unsquashfs")
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [unsquashfs, "-l", "-d", "R", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
        )
        assert proc.stdout is not None
        count = sum(1 for line in proc.stdout if line == b"R\n" or line.startswith(b"R/"))
        code = proc.wait()
        errors.seek(0)
        said = errors.read(4096).decode(errors="replace")
    if code != 0 or "FATAL ERROR" in said or "failed" in said:
        raise _corrupt(path, said)
    return count


def _corrupt(path: str | Path, said: str) -> ImageError:
    why = " / ".join(line.strip() for line in said.strip().splitlines()[:2])
    return ImageError(
        f"{printable(path)} is corrupt: unsquashfs cannot read it ({printable(why) or 'no reason given'})",
        "copy the image again from where it was packed (the copy was damaged), or pack it again",
    )


def check_image(path: str | Path, splits: tuple[str, ...] = ("train", "val")) -> list[ImageError]:
    """Every problem of the image at ``path`` for a job reading ``splits`` (empty: usable). Never mounts."""
    try:
        read_superblock(path)
        require_tool("unsquashfs")
        missing = [split for split in splits if not has_top_entry(path, split)]
    except ImageError as exc:
        return [exc]
    if missing:
        return [
            ImageError(
                f"{path} has no {' or '.join(f'{m}/' for m in missing)} folder at its top",
                "pack the dataset folder that holds train/ and val/ (`hpctrain pack DATA_ROOT OUT.sqsh`), "
                "or set data.train_dir/val_dir",
            )
        ]
    return []


def mount_problems(dev_fuse: str = "/dev/fuse") -> list[ImageError]:
    """What this machine lacks to mount an image as a user: squashfuse and /dev/fuse."""
    problems = []
    if shutil.which("squashfuse") is None:
        problems.append(ImageError("squashfuse is not installed (not on PATH)", INSTALL_HINT["squashfuse"]))
    if not os.path.exists(dev_fuse):
        problems.append(
            ImageError(
                f"{dev_fuse} does not exist: FUSE mounts are not possible here",
                "ask the admins to enable FUSE on the compute nodes, use data.root as a folder, "
                "or run the job in Apptainer (it mounts images itself)",
            )
        )
    return problems

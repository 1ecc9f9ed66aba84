"""Which file system a path lives on, and whether compute nodes can share it. Torch-free.

A run directory, a dataset or a virtual environment on a login node's local
disk or ``tmpfs`` is invisible to the compute nodes: the job fails after its
queue wait. The mount table (``/proc/self/mounts``) says which file system
holds a path; its type says whether it is shared. Pure over the table's text
except :func:`mount_of`, which reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MOUNTS_FILE = "/proc/self/mounts"

# Network and cluster file systems every node of a cluster can mount.
SHARED_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "cifs",
        "smb3",
        "ceph",
        "cephfs",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "panfs",
        "wekafs",
        "fuse.weka",
        "afs",
        "pvfs2",
        "orangefs",
        "fuse.sshfs",
        "9p",
        "virtiofs",
        "fuse.juicefs",
    }
)
# Memory-backed: gone at reboot, and one copy per machine.
MEMORY_TYPES = frozenset({"tmpfs", "ramfs", "devtmpfs"})

Sharing = Literal["shared", "local", "memory"]


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    device: str

    @property
    def sharing(self) -> Sharing:
        if self.fstype in MEMORY_TYPES:
            return "memory"
        return "shared" if self.fstype in SHARED_TYPES else "local"


def _unescape(field: str) -> str:
    """The mount table writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def parse_mounts(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            mounts.append(Mount(point=_unescape(fields[1]), fstype=fields[2], device=_unescape(fields[0])))
    return mounts


def mount_for(path: str | Path, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path`` (an absolute, resolved path): the longest matching mount point, last wins."""
    target = str(path)
    best: Mount | None = None
    for mount in mounts:
        point = mount.point.rstrip("/") or "/"
        inside = target == point or target.startswith(point + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = mount
    return best


def existing_ancestor(path: str | Path) -> Path:
    """``path`` itself or its nearest existing parent (a run folder is created at submit)."""
    current = Path(os.path.abspath(os.path.expanduser(str(path))))
    while not current.exists() and current != current.parent:
        current = current.parent
    return current.resolve()


def mount_of(path: str | Path, mounts_text: str | None = None) -> Mount | None:
    """The mount holding ``path`` (or the nearest existing parent), from this machine's mount table."""
    if mounts_text is None:
        try:
            mounts_text = Path(MOUNTS_FILE).read_text()
        except OSError:
            return None
    return mount_for(existing_ancestor(path), parse_mounts(mounts_text))

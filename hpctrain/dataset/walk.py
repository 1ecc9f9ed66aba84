"""What a job reads of a dataset tree: the one walk that the job's scan (``index``) and ``hpctrain pack`` share.

The rules (docs/data.md, "The dataset tree"), so that a packed image holds
exactly what a job on the folder would read:

* Symlinks are followed to regular files and to folders, as ImageFolder does
  (a class folder, or a whole split, linked from a shared pool).
* A link back to a folder above it, in the walk or above its top (``loop ->
  .``, ``-> ..`` of the root, ``-> /``), is a loop: cut and named. Within one
  scope (a class: each folder at ``scope_depth``) a real folder is entered
  once; a second link to it is cut and named.
* At most ``MAX_DEPTH`` folders below the top; deeper ones are cut and named.
* Pseudo file systems (``/proc``, ``/sys``, ``/dev``, cgroup, ...: by device,
  from the mount table) are never entered nor read.
* Only regular files are files: a FIFO, a socket, a device (or a link to
  one) and a link that leads nowhere are cut and named.
* A folder that cannot be listed is named in ``unreadable``: the job's scan
  stops on it, ``pack`` leaves it out (or refuses, with ``--strict``).

Nothing but directory listings and one ``stat`` per folder and per link is
done: a regular file is known from its directory entry, as before.
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass, field

MAX_DEPTH = 32  # folders below the walk's top: ImageNet needs 2 below the root
PSEUDO_FILESYSTEMS = frozenset(
    {
        "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore",
        "bpf", "configfs", "fusectl", "mqueue", "hugetlbfs", "autofs", "binfmt_misc", "efivarfs", "selinuxfs",
        "rpc_pipefs", "nsfs",
    }
)  # fmt: skip
MOUNTINFO = "/proc/self/mountinfo"
NOT_A_FILE = "not a regular file"  # how every reason for an entry that is no file or folder ends

Identity = tuple[int, int]


@dataclass
class Tree:
    """One walk: what a job reads below ``top`` (paths relative to it), and what it does not, and why."""

    top: str  # absolute, symlinks resolved
    folders: list[str] = field(default_factory=list)  # entered, parents first; "" (the top) not listed
    files: list[str] = field(default_factory=list)  # regular files (also through links), in ImageFolder's order
    cut: list[tuple[str, str]] = field(default_factory=list)  # (path, why) not followed or not a file
    unreadable: list[tuple[str, OSError]] = field(default_factory=list)  # folders that could not be listed
    links: int = 0  # symlinks followed (to files and folders)
    targets: dict[str, str] = field(default_factory=dict)  # a file or folder that is a link -> its real path

    def below(self, folder: str) -> Tree:
        """The part of this walk under ``folder`` (relative), as if it had been walked from there."""
        prefix = folder + "/"

        def inside(paths: list[str]) -> list[str]:
            return [p[len(prefix) :] for p in paths if p.startswith(prefix)]

        return Tree(
            os.path.join(self.top, folder),
            inside(self.folders),
            inside(self.files),
            [(p[len(prefix) :], why) for p, why in self.cut if p.startswith(prefix)],
            [(p[len(prefix) :], exc) for p, exc in self.unreadable if p.startswith(prefix)],
            self.links,
            {p[len(prefix) :]: target for p, target in self.targets.items() if p.startswith(prefix)},
        )


def walk(top: str | os.PathLike[str], *, scope_depth: int = 1, hidden_top: bool = True) -> Tree:
    """Walk ``top`` under the module's rules; each folder ``scope_depth`` below it is a scope (a class).

    A split is walked with ``scope_depth=1`` (its classes), a dataset root with 2 (its splits' classes).
    ``hidden_top=False`` passes over the top's entries whose names start with a dot (a split's ``.git``
    is no class). ``OSError`` only when ``top`` itself cannot be listed.
    """
    root = os.path.realpath(top)
    tree = Tree(root)
    above_top = _ancestors(root)
    seen: dict[str, set[Identity]] = {}
    pseudo = pseudo_devices()
    stack: list[tuple[str, tuple[Identity, ...]]] = [("", above_top)]
    while stack:
        rel, above = stack.pop()
        path = os.path.join(root, rel) if rel else root
        try:
            with os.scandir(path) as listing:
                entries = sorted(listing, key=_name)
        except OSError as exc:
            if not rel:
                raise
            tree.unreadable.append((rel, exc))
            continue
        if rel:
            tree.folders.append(rel)
        depth = rel.count("/") + 1 if rel else 0
        subfolders: list[tuple[str, tuple[Identity, ...]]] = []
        for entry in entries:
            if not rel and not hidden_top and entry.name.startswith("."):
                continue
            child = f"{rel}/{entry.name}" if rel else entry.name
            kind, info, why = _classify(entry, pseudo)
            if why:
                tree.cut.append((child, why))
            elif kind == "file":
                tree.files.append(child)
                if entry.is_symlink():
                    tree.links += 1
                    tree.targets[child] = os.path.realpath(entry.path)
            elif kind == "folder":
                identity = (info.st_dev, info.st_ino)
                scope = seen.setdefault("/".join(child.split("/")[:scope_depth]), set())
                if identity in above:
                    tree.cut.append((child, "a loop: it leads back to a folder above it"))
                elif identity in scope:
                    tree.cut.append((child, "it leads to a folder already walked here (entered once)"))
                elif depth + 1 > MAX_DEPTH:
                    tree.cut.append((child, f"deeper than {MAX_DEPTH} folders below {root}"))
                else:
                    scope.add(identity)
                    if entry.is_symlink():
                        tree.links += 1
                        tree.targets[child] = os.path.realpath(entry.path)
                    subfolders.append((child, (*above, identity)))
        stack += reversed(subfolders)  # popped in sorted order: depth first, as ImageFolder lists
    return tree


def entry_kind(entry: os.DirEntry) -> str:
    """'dir', 'file' or 'other' under the walk's rules, for the samplers that list a little of a tree
    (``doctor``, ``bench-data``, ``doctor --probe``): a link is followed to a regular file or a
    folder; a FIFO, a device, a link that leads nowhere or onto a pseudo file system is 'other'."""
    kind, _, why = _classify(entry, pseudo_devices())
    return "other" if why else {"file": "file", "folder": "dir"}[kind]


def _name(entry: os.DirEntry) -> str:
    return entry.name


def _classify(entry: os.DirEntry, pseudo: frozenset[int]) -> tuple[str, os.stat_result | None, str | None]:
    """("file" | "folder", its stat for a folder or link, why it is cut or None)."""
    link = entry.is_symlink()
    if not link:
        if entry.is_file(follow_symlinks=False):
            return "file", None, None
        if not entry.is_dir(follow_symlinks=False):
            try:
                return "", None, _not_regular(entry.stat(follow_symlinks=False).st_mode)
            except OSError as exc:
                return "", None, exc.strerror or str(exc)
    try:
        info = os.stat(entry.path)  # follows the link; a folder's identity
    except OSError as exc:
        return "", None, f"a link that leads nowhere ({exc.strerror or exc})" if link else f"{exc.strerror or exc}"
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return "", None, ("through a link, " if link else "") + _not_regular(info.st_mode)
    if info.st_dev in pseudo:
        return "", None, "on a pseudo file system (/proc, /sys, /dev ...): never read"
    return ("folder" if stat.S_ISDIR(info.st_mode) else "file"), info, None


def _not_regular(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device")):
        if test(mode):
            return f"{name}, {NOT_A_FILE}"
    return f"a device, {NOT_A_FILE}" if stat.S_ISBLK(mode) else NOT_A_FILE


def _ancestors(path: str) -> tuple[Identity, ...]:
    """Identities of ``path`` and every folder above it: a link to any of them is a loop."""
    found = []
    while True:
        try:
            info = os.stat(path)
            found.append((info.st_dev, info.st_ino))
        except OSError:
            pass
        parent = os.path.dirname(path)
        if parent == path:
            return tuple(found)
        path = parent


@functools.cache
def pseudo_devices(mountinfo: str = MOUNTINFO) -> frozenset[int]:
    """The ``st_dev`` of every pseudo file system mounted here (from the mount table; /proc, /sys, /dev without it)."""
    found = set()
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as table:
            for line in table:
                fields, _, rest = line.partition(" - ")
                parts = fields.split()
                if len(parts) > 2 and rest.split()[:1] and rest.split()[0] in PSEUDO_FILESYSTEMS:
                    major, _, minor = parts[2].partition(":")
                    if major.isdigit() and minor.isdigit():
                        found.add(os.makedev(int(major), int(minor)))
    except OSError:
        for path in ("/proc", "/sys", "/dev"):
            try:
                found.add(os.stat(path).st_dev)
            except OSError:
                pass
    return frozenset(found)

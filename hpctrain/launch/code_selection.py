"""Which files a code snapshot copies: the entry point's package and what it imports from beside it. Torch-free.

A snapshot holds what the entry point needs to import, and nothing else a
user's tree happens to hold (a dotfiles ``$HOME`` under git holds ``.ssh/``):

* the **root** is the import directory, the ``sys.path`` entry the entry
  point's top-level package (or module) is imported from;
* copied: that top-level package, and every other top-level package or
  module *in the root* that a copied file imports (``import x``, ``from x
  import y``, ``importlib.import_module("x")``), found with ``ast``, nothing
  run: the import closure within the root, one whole top-level package at a
  time (its data files included);
* in a git work tree, only what git lists (tracked files as on disk, plus
  untracked ones git does not ignore);
* never: a symlink (file or folder) that leads out of the root, a hidden
  file or folder (``.ssh``, ``.env``, ``.git``), bytecode, a FIFO, socket or
  device, a folder reached twice (a symlink loop).

The rule is on the **resolved target**, for every file copied: what a name
leads to, all symlinks followed, must lie inside the root with no hidden
folder or file on the way (``keys -> .secrets`` is as hidden as ``.secrets``),
and the root itself, resolved, may not lie in a hidden folder of the home
directory (a script or package that is a symlink into ``~/.ssh`` makes
``~/.ssh`` the root: refused, :func:`root_refusal`). ``code_snapshot.take``
checks each file again as it copies it. Paths are resolved with
``contract.runfiles.real_path``, which never raises: a symlink loop is a
file left out ("a symlink loop"), never a traceback.

What is left out is said (:attr:`Selection.left_out`): ``submit`` prints it
and ``run.json`` records it. A module imported only under a computed name
(``import_module(f"models.{name}")`` of another top-level package) is not
seen; import it by name, or submit with ``--no-snapshot``.
"""

from __future__ import annotations

import ast
import errno
import importlib.machinery
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.contract.runfiles import real_path
from hpctrain.errors import printable

MAX_PARSE_BYTES = 4 << 20  # a larger .py file is copied but not read for imports
_SKIP_NAMES = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclass
class Selection:
    """The files to copy (relative to ``root``), the top-level names they make up, and what was left out."""

    root: Path  # the import directory, symlinks resolved
    files: list[Path] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)
    tops: list[Path] = field(default_factory=list)  # each copied package's folder (or module file), relative
    left_out: list[str] = field(default_factory=list)  # "NAME: why", in the order found
    hidden: int = 0  # hidden files and folders skipped
    ignored: int = 0  # files git ignores

    def notes(self, limit: int = 5) -> list[str]:
        """What was left out, for a person: a few named, the rest counted."""
        named = [printable(note) for note in self.left_out[:limit]]
        rest = len(self.left_out) - len(named)
        notes = [*named, *([f"{rest} more"] if rest else [])]
        if self.hidden:
            notes.append(f"{self.hidden} hidden file{'s' * (self.hidden != 1)} or folder{'s' * (self.hidden != 1)}")
        if self.ignored:
            notes.append(f"{self.ignored} file{'s' * (self.ignored != 1)} git ignores")
        return notes


def select(import_dir: Path, package: str, git_listed: Callable[[Path], set[Path]] | None = None) -> Selection:
    """The import closure of ``package`` within ``import_dir``. In a git work tree ``git_listed(top)`` gives
    what git lists under one top-level package or module (paths relative to ``import_dir``)."""
    chosen = Selection(root=real_path(import_dir))
    queue, seen = [package], set()
    while queue:
        name = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        found = _top_level(chosen.root, name)
        if found is None:
            continue  # the environment's (stdlib, site-packages) or not there: not ours to copy
        why = target_refusal(found, chosen.root)
        if why is not None:
            chosen.left_out.append(f"{_relative(found, chosen.root)}: {why}")
            continue
        new = list(_files(found, chosen))
        if git_listed is not None:
            listed = git_listed(_relative(found, chosen.root))
            chosen.ignored += sum(path not in listed for path in new)
            new = [path for path in new if path in listed]
        chosen.packages.append(name)
        chosen.tops.append(_relative(found, chosen.root))
        chosen.files += new
        for path in new:
            if path.suffix == ".py":
                queue += sorted(imported_names(chosen.root / path) - seen)
    return chosen


def select_folder(
    folder: Path, git_listed: Callable[[Path], set[Path]] | None = None, skip: Iterable[Path] = ()
) -> Selection:
    """Every file of ``folder`` by the same rules (a script's folder: ``launch/script_code.py``), the folder
    its own root; in a git work tree only what ``git_listed(Path("."))`` lists. Nothing under a folder of
    ``skip`` (the run's output directory, should it lie in there: earlier runs are no code)."""
    chosen = Selection(root=real_path(folder))
    new = list(_files(chosen.root, chosen))
    if git_listed is not None:
        listed = git_listed(Path("."))
        chosen.ignored += sum(path not in listed for path in new)
        new = [path for path in new if path in listed]
    chosen.packages.append(chosen.root.name)
    chosen.tops.append(Path("."))
    chosen.files = _outside(new, chosen, skip)
    return chosen


def _outside(files: list[Path], chosen: Selection, skip: Iterable[Path]) -> list[Path]:
    """``files`` less those under a folder of ``skip``, each such folder said once."""
    folders = [real_path(Path(folder).expanduser()) for folder in skip]
    kept = []
    for name in files:
        under = next((f for f in folders if f in real_path(chosen.root / name).parents), None)
        if under is None:
            kept.append(name)
        elif (note := f"{_relative(under, chosen.root)}: the run's output directory") not in chosen.left_out:
            chosen.left_out.append(note)
    return kept


def imported_names(path: Path) -> set[str]:
    """The top-level module names a Python file imports (absolute imports; ``import_module("x.y")`` too)."""
    try:
        if path.stat().st_size > MAX_PARSE_BYTES:
            return set()
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return set()  # copied as it is; the job will say what is wrong with it
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
        elif isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
                names.add(first.value.partition(".")[0])
    return {name for name in names if name.isidentifier()}


def _is_import_call(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def _top_level(root: Path, name: str) -> Path | None:
    """``root/name`` (a package folder) or ``root/name.py`` as Python would find it there; None otherwise."""
    spec = importlib.machinery.PathFinder.find_spec(name, [str(root)])
    if spec is None:
        return None
    if spec.submodule_search_locations:
        locations = list(spec.submodule_search_locations)
        return Path(locations[0]) if locations else None
    if spec.origin and spec.origin.endswith(".py"):
        return Path(spec.origin)
    return None  # an extension module or bytecode: built for this machine, not copied


def _files(top: Path, chosen: Selection) -> Iterable[Path]:
    """Every file of a top-level package (or the module file itself), by the rules of the module docstring."""
    if not top.is_dir():
        yield _relative(top, chosen.root)
        return
    visited = {real_path(top)}
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError as exc:
            chosen.left_out.append(f"{_relative(folder, chosen.root)}: unreadable ({exc.strerror})")
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith("."):
                chosen.hidden += 1
                continue
            if entry.name in _SKIP_NAMES or entry.name.endswith(_SKIP_SUFFIXES):
                continue
            why = _refusal(path, entry, chosen.root)
            if why is not None:
                chosen.left_out.append(f"{_relative(path, chosen.root)}: {why}")
            elif entry.is_dir():
                real = real_path(path)
                if real in visited:
                    chosen.left_out.append(f"{_relative(path, chosen.root)}: a symlink loop (to {real})")
                else:
                    visited.add(real)
                    stack.append(path)
            else:
                yield _relative(path, chosen.root)
    return


def _refusal(path: Path, entry: os.DirEntry[str], root: Path) -> str | None:
    """Why ``path`` is not copied, or None: its target (symlinks resolved) breaks :func:`target_refusal`, or
    it is not a regular file or folder."""
    try:
        if entry.is_symlink() and (why := target_refusal(path, root)) is not None:
            return why
        if entry.is_dir() or entry.is_file():
            return None
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if entry.is_symlink():
        return "a symlink loop" if _loops(path) else "a broken symlink"
    return "not a regular file (a FIFO, socket or device)"


def target_refusal(path: Path, root: Path) -> str | None:
    """Why what ``path`` leads to may not be copied from ``root``, or None (the module docstring's rule):
    outside ``root``, or hidden (a hidden name anywhere between ``root`` and the target)."""
    real = real_path(path)
    if _loops(path):
        return "a symlink loop"
    if not real.is_relative_to(root):
        return f"a symlink to {printable(real)}, outside {printable(root)}"
    hidden = next((part for part in real.relative_to(root).parts if part.startswith(".")), None)
    if hidden is not None:
        return f"leads to {printable(real)}, a hidden file or folder ({printable(hidden)})"
    return None


def root_refusal(folder: Path) -> str | None:
    """Why the folder ``folder`` (resolved) may not be a snapshot's root, or None: it is the home directory
    or a file system's root (everything the user has), a shared world-writable folder such as ``/tmp``
    (everybody's files), or lies in a hidden folder of the home directory (``~/.ssh``)."""
    real = real_path(folder)
    home = real_path(Path.home())
    if real == home:
        return f"{printable(real)} is your home directory"
    if real.parent == real:
        return f"{printable(real)} is a file system's root"
    try:
        mode = real.stat().st_mode
    except OSError:
        mode = 0
    if mode & stat.S_ISVTX and mode & stat.S_IWOTH:
        return f"{printable(real)} is a shared folder everyone writes into (world-writable, like /tmp)"
    if real.is_relative_to(home):
        hidden = next((part for part in real.relative_to(home).parts if part.startswith(".")), None)
        if hidden is not None:
            return f"{printable(real)} lies in the hidden folder {printable(home / hidden)}"
    return None


def _loops(path: Path) -> bool:
    """Whether resolving ``path`` meets a symlink loop."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _relative(path: Path, root: Path) -> Path:
    """``path`` below ``root`` as the copy names it (its place in the tree, not where a symlink leads)."""
    try:
        return path.relative_to(root)
    except ValueError:
        return Path(os.path.relpath(path, root))

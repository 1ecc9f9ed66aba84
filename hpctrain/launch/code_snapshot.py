"""A copy of the user's code in the run directory, taken at submit time. Torch-free.

A job may wait hours in the queue and be requeued days later; without a copy
it would run whatever the user's tree holds at that moment. With ``entrypoint:``
``submit`` copies the code that entry point imports into ``RUN_DIR/code/``:

* the entry point's package lies in a git work tree: every file git tracks
  (as it is on disk now) plus untracked files git does not ignore, so a new
  module the user has not added yet is not lost;
* otherwise: the package directory (or the single module file).

The task launcher puts the copy's import root first on ``sys.path`` before it
imports the entry point, on every attempt (requeues and ``hpctrain resume``
included). ``run.json`` records where it came from: the git commit, whether
the tree was dirty, and how many files and bytes were copied. The built-in
trainer (no ``entrypoint``) is hpctrain's own code and is not copied; its
version is in ``run.json`` already.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from hpctrain.contract.rundir import CODE_DIR, run_home
from hpctrain.errors import UsageError

SNAPSHOT_DIR = CODE_DIR
MAX_SNAPSHOT_BYTES = 200 * 1024 * 1024
_SKIP_PARTS = frozenset({"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
_GIT_TIMEOUT_S = 30


@dataclass(frozen=True)
class CodeSource:
    """Where an entry point's code lies on this machine."""

    package: str  # top-level module name of the entry point
    import_dir: Path  # the sys.path entry it is imported from
    files_root: Path  # what is copied: the git work tree, else the package directory/file's folder
    git_root: Path | None


@dataclass(frozen=True)
class Snapshot:
    """What ``run.json`` records under ``code_snapshot``."""

    path: str  # the copy, relative to the run directory
    import_root: str  # the sys.path entry inside the copy, relative to the run directory
    source: str
    package: str
    files: int
    bytes: int
    git_commit: str | None = None
    git_dirty: bool | None = None

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def locate(entrypoint: str, search_path: Sequence[str] | None = None) -> CodeSource | None:
    """The code behind ``package.module:function``, found as ``python -m`` on a node would find it.

    None when the package is not found from here (it may be installed on the
    nodes only), is hpctrain itself, or belongs to the Python environment
    (site-packages or the standard library: copying ``json`` and putting the copy
    first on ``sys.path`` would shadow the nodes' own).
    """
    package = entrypoint.partition(":")[0].split(".")[0]
    if package == "hpctrain":
        return None
    paths = list(search_path) if search_path is not None else default_search_path()
    spec = importlib.machinery.PathFinder.find_spec(package, paths)
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package (regular or namespace)
        location = Path(next(iter(spec.submodule_search_locations))).resolve()
    elif spec.origin and spec.origin not in ("built-in", "frozen"):
        location = Path(spec.origin).resolve()
    else:
        return None
    import_dir = location.parent
    if in_environment(import_dir):
        return None  # an installed distribution or the standard library: the environment's, not the user's tree
    git_root = git_toplevel(import_dir)
    files_root = git_root if git_root is not None else location
    return CodeSource(package=package, import_dir=import_dir, files_root=files_root, git_root=git_root)


def take(source: CodeSource, run_dir: Path) -> Snapshot:
    """Copy ``source`` into ``run_dir/code`` and describe the copy."""
    target = Path(run_dir) / SNAPSHOT_DIR
    if source.git_root is not None:
        files = git_files(source.git_root)
        base = source.git_root
    elif source.files_root.is_dir():
        base = source.files_root.parent
        files = [path.relative_to(base) for path in _walk(source.files_root)]
    else:
        base = source.files_root.parent
        files = [Path(source.files_root.name)]
    total = _check_size(base, files, source)
    for relative in files:
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(base / relative, destination, follow_symlinks=True)
    import_root = Path(SNAPSHOT_DIR) / source.import_dir.relative_to(base) if source.git_root else Path(SNAPSHOT_DIR)
    commit, dirty = git_state(source.git_root) if source.git_root else (None, None)
    return Snapshot(
        path=SNAPSHOT_DIR,
        import_root=str(import_root),
        source=str(source.files_root),
        package=source.package,
        files=len(files),
        bytes=total,
        git_commit=commit,
        git_dirty=dirty,
    )


def import_root(run_dir: Path, recorded: object) -> Path | None:
    """The copy's sys.path entry from ``run.json``'s ``code_snapshot``, if it is there."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("import_root"), str):
        return None
    run_dir = Path(run_dir).resolve()
    # a sweep's trials share the copy in the sweep's directory, one level up
    home = run_home(run_dir)
    root = (run_dir / recorded["import_root"]).resolve()
    if home not in root.parents and root != home:
        return None  # a hand-edited run.json pointing elsewhere is not followed
    return root


# ------------------------------------------------------------------ git


def git_toplevel(directory: Path) -> Path | None:
    out = _git(directory, "rev-parse", "--show-toplevel")
    return Path(out.strip()).resolve() if out else None


def git_files(root: Path) -> list[Path]:
    """Tracked files (as on disk) and untracked files git does not ignore; deleted files skipped."""
    out = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if out is None:
        return []
    seen: dict[str, None] = dict.fromkeys(name for name in out.split("\0") if name)
    return [Path(name) for name in seen if (root / name).is_file() and not _SKIP_PARTS & set(Path(name).parts)]


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, whether tracked or untracked-unignored files differ from it)."""
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=normal")
    return (commit.strip() if commit else None), (bool(status.strip()) if status is not None else None)


def _git(directory: Path, *args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


# ------------------------------------------------------------------ helpers


def _walk(directory: Path) -> Iterable[Path]:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not _SKIP_PARTS & set(path.relative_to(directory).parts) and path.suffix != ".pyc":
            yield path


def _check_size(base: Path, files: Sequence[Path], source: CodeSource) -> int:
    total = sum((base / name).stat().st_size for name in files)
    if total > MAX_SNAPSHOT_BYTES:
        raise UsageError(
            f"the code snapshot of {source.files_root} would copy {total / 2**20:.0f} MiB "
            f"({len(files)} files) into the run directory",
            hint="keep data and weights out of the repository (or in .gitignore), "
            "or submit with --no-snapshot to run the live tree",
        )
    return total


def in_environment(directory: Path) -> bool:
    """Whether modules imported from ``directory`` belong to the Python environment, not to the
    user's tree: site-packages, or the standard library (stdlib, platstdlib, lib-dynload)."""
    if directory.name in ("site-packages", "dist-packages"):
        return True
    directory = directory.resolve()
    return any(directory == root or root in directory.parents for root in _stdlib_roots())


def _stdlib_roots() -> set[Path]:
    import sysconfig

    paths = sysconfig.get_paths()
    return {Path(paths[key]).resolve() for key in ("stdlib", "platstdlib") if paths.get(key)}


def default_search_path() -> list[str]:
    """Where ``python -m`` on a node started from here looks first: this directory, then ``sys.path``."""
    import sys

    return [os.getcwd(), *(entry for entry in sys.path if entry)]

"""A copy of the user's code in the run directory, taken at submit time. Torch-free.

A job may wait hours in the queue and be requeued days later; without a copy
it would run whatever the user's tree holds at that moment. With ``entrypoint:``
``submit`` copies the code that entry point imports into ``RUN_DIR/code/``:
the entry point's top-level package and what it imports from beside it, in
its import directory, as ``launch/code_selection.py`` chooses (in a git work
tree, only what git lists; never a symlink out of the import directory, a
hidden file, bytecode). What was left out is said at submit and recorded.

The task launcher puts the copy first on ``sys.path`` before it imports the
entry point, on every attempt (requeues and ``hpctrain resume`` included).
``run.json`` records where it came from: the git commit, whether the copied
files differ from it, how many files and bytes were copied, and what was
left out. The built-in trainer (no ``entrypoint``) is hpctrain's own code
and is not copied; its version is in ``run.json`` already.

One decision for ``--dry-run`` and ``submit``: every plan (:func:`plan`,
``script_code.plan``) asks :func:`check_size`, and :func:`take` asks it again,
so a dry run refuses what the submit would (``MAX_SNAPSHOT_FILES``,
``MAX_SNAPSHOT_BYTES``). Each file is copied from its resolved target after a
second check (``code_selection.target_refusal``), through a fresh temporary
file (``contract/file_writes.copy_atomic``).
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpctrain.contract.entrypoint import default_search_path
from hpctrain.contract.file_writes import copy_atomic
from hpctrain.contract.rundir import CODE_DIR, run_home
from hpctrain.contract.runfiles import RunFileError, open_regular, real_path
from hpctrain.errors import UsageError, printable
from hpctrain.launch.code_selection import Selection, root_refusal, select, target_refusal

SNAPSHOT_DIR = CODE_DIR
MAX_SNAPSHOT_BYTES = 200 * 1024 * 1024
MAX_SNAPSHOT_FILES = 20_000
MAX_RECORDED_LEFT_OUT = 20  # run.json names this many left-out files; the rest are counted
_GIT_TIMEOUT_S = 30


@dataclass(frozen=True)
class CodeSource:
    """Where an entry point's code lies on this machine."""

    package: str  # top-level module name of the entry point
    import_dir: Path  # the sys.path entry it is imported from: the root of what is copied
    files_root: Path  # the entry point's package directory (or module file)
    git_root: Path | None


@dataclass(frozen=True)
class Snapshot:
    """What ``run.json`` records under ``code_snapshot``."""

    path: str  # the copy, relative to the run directory
    import_root: str  # the sys.path entry inside the copy, relative to the run directory
    source: str  # the import directory the files were copied from
    package: str
    files: int
    bytes: int
    git_commit: str | None = None
    git_dirty: bool | None = None
    packages: list[str] = field(default_factory=list)  # the top-level packages and modules copied
    left_out: list[str] = field(default_factory=list)  # "NAME: why" (MAX_RECORDED_LEFT_OUT named), then counts
    left_out_count: int = 0  # every file or folder left out: named, hidden, ignored by git
    script_dir: str | None = None  # a script job's: the copy of the script's folder (launch/script_code.py)

    def as_json(self) -> dict[str, object]:
        record = asdict(self)
        if self.script_dir is None:
            del record["script_dir"]
        return record


def locate(entrypoint: str, search_path: Sequence[str] | None = None) -> CodeSource | None:
    """The code behind ``package.module:function``, found as ``python -m`` on a node would find it.

    None when the package is not found from here (it may be installed on the
    nodes only), is hpctrain itself, or belongs to the Python environment
    (site-packages or the standard library: copying ``json`` and putting the copy
    first on ``sys.path`` would shadow the nodes' own). A package folder that is
    a symlink counts where it leads: its import directory is the real folder's.
    """
    package = entrypoint.partition(":")[0].split(".")[0]
    if package == "hpctrain":
        return None
    paths = list(search_path) if search_path is not None else default_search_path()
    spec = importlib.machinery.PathFinder.find_spec(package, paths)
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package (regular or namespace)
        location = real_path(next(iter(spec.submodule_search_locations)))
    elif spec.origin and spec.origin not in ("built-in", "frozen"):
        location = real_path(spec.origin)
    else:
        return None
    import_dir = location.parent
    if in_environment(import_dir):
        return None  # an installed distribution or the standard library: the environment's, not the user's tree
    why = root_refusal(import_dir)
    if why is not None and "hidden" in why:  # a package that leads into ~/.ssh: nothing of it is copied
        raise UsageError(
            f"entrypoint: {package} is imported from {printable(import_dir)}: {why}, and hpctrain never copies "
            "a hidden folder into a run",
            hint="keep your code in a folder of its own (not hidden), or submit with --no-snapshot",
        )
    return CodeSource(package=package, import_dir=import_dir, files_root=location, git_root=git_toplevel(import_dir))


def plan(source: CodeSource) -> Selection:
    """What :func:`take` would copy and leave out (``submit --dry-run`` prints it); a UsageError when it is
    more than a snapshot holds (:func:`check_size`: the one decision, the dry run's and the submit's)."""
    listed = git_lister(source) if source.git_root is not None else None
    chosen = select(source.import_dir, source.package, listed)
    check_size(chosen, source)
    return chosen


def take(source: CodeSource, run_dir: Path, chosen: Selection | None = None) -> Snapshot:
    """Copy ``source`` into ``run_dir/code`` and describe the copy; ``chosen``: another selection of its
    import directory's files than :func:`plan`'s (a script's folder: ``launch/script_code.py``)."""
    chosen = plan(source) if chosen is None else chosen
    total = check_size(chosen, source)
    target = Path(run_dir) / SNAPSHOT_DIR
    for relative in chosen.files:
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        _copy_one(chosen.root, relative, destination)
    commit, dirty = git_state(source.git_root, chosen) if source.git_root else (None, None)
    return Snapshot(
        path=SNAPSHOT_DIR,
        import_root=SNAPSHOT_DIR,
        source=str(chosen.root),
        package=source.package,
        files=len(chosen.files),
        bytes=total,
        git_commit=commit,
        git_dirty=dirty,
        packages=list(chosen.packages),
        left_out=chosen.notes(MAX_RECORDED_LEFT_OUT),
        left_out_count=len(chosen.left_out) + chosen.hidden + chosen.ignored,
    )


def _copy_one(root: Path, relative: Path, destination: Path) -> None:
    """Copy one selected file, its resolved target checked again as it is opened (the tree may have changed
    since it was selected): inside ``root``, not hidden, a regular file (code_selection.py's rule). An error
    writing the copy (a full disk) is the caller's OSError, naming the copy."""
    why = target_refusal(root / relative, root)
    source = None
    if why is None:
        try:
            source = open_regular(root / relative, within=root)
        except (OSError, RunFileError) as exc:
            why = str(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
    if source is None:
        raise UsageError(
            f"the code snapshot cannot copy {printable(root / relative)}: {why}",
            hint="the folder changed while it was being copied; submit again (or with --no-snapshot)",
        )
    with source:
        copy_atomic(source, destination)
    shutil.copystat(real_path(root / relative), destination)


def import_root(run_dir: Path, recorded: object) -> Path | None:
    """The copy's sys.path entry from ``run.json``'s ``code_snapshot``, if it is there."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("import_root"), str):
        return None
    run_dir = real_path(run_dir)
    # a sweep's trials share the copy in the sweep's directory, one level up
    home = run_home(run_dir)
    root = real_path(run_dir / recorded["import_root"])
    if home not in root.parents and root != home:
        return None  # a hand-edited run.json pointing elsewhere is not followed
    return root


def for_trial(record: dict[str, object], sweep_dir: Path, trial_dir: Path) -> dict[str, object]:
    """``run.json``'s record of the copy as seen from one trial's directory (a sweep's trials share the
    sweep's copy); a plain run's own directory is the sweep directory."""
    moved = dict(record)
    for key in ("import_root", "script_dir"):
        value = record.get(key)
        if isinstance(value, str):
            moved[key] = os.path.relpath(Path(sweep_dir) / value, trial_dir)
    return moved


# ------------------------------------------------------------------ git


def git_toplevel(directory: Path) -> Path | None:
    out = _git(directory, "rev-parse", "--show-toplevel")
    return real_path(out.strip()) if out else None


def git_lister(source: CodeSource) -> Callable[[Path], set[Path]]:
    """What git lists under one top-level package or module of the import directory (tracked files as on
    disk, untracked ones it does not ignore), relative to the import directory. Asked per package, so a
    work tree as wide as a dotfiles ``$HOME`` is never listed whole."""

    def listed(top: Path) -> set[Path]:
        out = _git(source.import_dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", str(top))
        return {Path(name) for name in (out or "").split("\0") if name}

    return listed


def git_state(root: Path, chosen: Selection | None = None) -> tuple[str | None, bool | None]:
    """(HEAD commit, whether the copied files -- or, without ``chosen``, the work tree -- differ from it)."""
    commit = _git(root, "rev-parse", "HEAD")
    paths = ["--", *(str(chosen.root / top) for top in chosen.tops)] if chosen else []
    status = _git(root, "status", "--porcelain", "--untracked-files=normal", *paths)
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


def check_size(chosen: Selection, source: CodeSource) -> int:
    """The bytes the selection copies; a UsageError when the files or bytes are more than a snapshot holds
    (``MAX_SNAPSHOT_FILES``, ``MAX_SNAPSHOT_BYTES``). Asked by every plan and again by :func:`take`."""
    total = 0
    for name in chosen.files:
        try:
            total += os.stat(chosen.root / name).st_size
        except OSError:
            continue  # gone since it was listed: take() says so when it copies
        if total > MAX_SNAPSHOT_BYTES:
            break
    if total > MAX_SNAPSHOT_BYTES or len(chosen.files) > MAX_SNAPSHOT_FILES:
        size = f"over {MAX_SNAPSHOT_BYTES / 2**20:.0f}" if total > MAX_SNAPSHOT_BYTES else f"{total / 2**20:.0f}"
        raise UsageError(
            f"the code snapshot of {source.package} ({', '.join(chosen.packages)} in {printable(chosen.root)}) "
            f"would copy {size} MiB ({len(chosen.files)} files; at most {MAX_SNAPSHOT_FILES:,} files and "
            f"{MAX_SNAPSHOT_BYTES / 2**20:.0f} MiB) into the run directory",
            hint="keep data and weights out of the package (or in .gitignore), "
            "or submit with --no-snapshot to run the live tree",
        )
    return total


def in_environment(directory: Path) -> bool:
    """Whether modules imported from ``directory`` belong to the Python environment, not to the
    user's tree: site-packages, or the standard library (stdlib, platstdlib, lib-dynload)."""
    if directory.name in ("site-packages", "dist-packages"):
        return True
    directory = real_path(directory)
    return any(directory == root or root in directory.parents for root in _stdlib_roots())


def _stdlib_roots() -> set[Path]:
    import sysconfig

    paths = sysconfig.get_paths()
    return {real_path(paths[key]) for key in ("stdlib", "platstdlib") if paths.get(key)}

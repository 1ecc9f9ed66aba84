"""The login node's shipped folders and when they go (``hpctrain remote prune``). Torch-free; runs there.

Each remote submit (and resume) leaves a stage, ``~/hpctrain-submits/TOKEN/``:
the shipped project (``tree/``, the big part) and the small record of the
submit-once claim (``claim/``, ``out``, ``err``, ``rc``) that lets a retried
command print the first attempt's answer. The policy, one decision per stage
(:func:`fate_of`, pure):

* in flight (claimed, no exit status, its process alive): kept whole;
* a run still refers to it: kept whole. A run submitted with
  ``--no-snapshot`` has no copy of its code and runs (and resumes) from the
  shipped tree; its stage is kept while its run directory exists. A run
  with its own code snapshot (the default) needs no stage once submitted;
* otherwise, older than ``older_than_s`` (default 7 days): its ``tree/`` goes,
  the record stays (a late retry still answers from the first attempt, never
  submits twice); older than ``RECORD_S`` (30 days) and ``older_than_s``: all
  of it goes. A stage never claimed (its shipping was cut, or a ``plan``
  / ``doctor`` copy left by a dropped connection) goes whole;
* ``reports/TOKEN`` (a report's files not yet fetched) goes once older.

Untrusted content: only folders hpctrain made are looked at (a 24-hex name,
a real folder, not a link, owned by this user, in a ``hpctrain-submits``
that is the same); files are read only when regular and small, opened
without following links and without blocking; removal never follows a link
(``shutil.rmtree``'s fd-based walk); anything else is reported, not touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import UsageError

STAGES_DIR = "hpctrain-submits"
RECORD_S = 30 * 86400.0
DEFAULT_OLDER_THAN_S = 7 * 86400.0
TOKEN = re.compile(r"[0-9a-f]{24}")
READ_LIMIT = 1 << 16
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class Stage:
    """What prune needs to know of one stage (gathered by :func:`survey`; made by hand in tests)."""

    path: Path
    age_s: float  # since its last change: the exit status's, else the folder's
    claimed: bool
    ended: bool  # an exit status is there
    alive: bool  # its claimed process still runs
    has_tree: bool
    referenced_by: str | None  # a run directory that runs from this tree
    report: bool = False  # reports/TOKEN


@dataclass(frozen=True)
class Fate:
    stage: Stage
    action: str  # "keep", "drop-tree", "drop"
    why: str


@dataclass(frozen=True)
class Pruned:
    decisions: tuple[Fate, ...]
    skipped: tuple[str, ...]  # passed over: not hpctrain's, a link, another user's
    failed: tuple[str, ...]
    dry_run: bool

    def freed(self) -> int:
        return sum(1 for d in self.decisions if d.action != "keep")


def parse_age(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w``, or ``0``: seconds. UsageError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(text))
    if match is None or (match.group(2) == "" and float(match.group(1)) != 0):
        raise UsageError(
            f"--older-than {text!r}: expected a number with a unit", hint="e.g. --older-than 7d (s, m, h, d, w)"
        )
    return float(match.group(1)) * UNITS.get(match.group(2), 1)


def fate_of(stage: Stage, older_than_s: float) -> Fate:
    """What prune does with one stage (the module docstring's policy)."""
    if stage.report:
        if stage.age_s >= older_than_s:
            return Fate(stage, "drop", "a report's files never fetched")
        return Fate(stage, "keep", "a report's files, recent")
    if stage.claimed and not stage.ended and stage.alive:
        return Fate(stage, "keep", "its command is still running")
    if stage.referenced_by is not None:
        return Fate(stage, "keep", f"{stage.referenced_by} runs from it (submitted with --no-snapshot)")
    if stage.age_s < older_than_s:
        return Fate(stage, "keep", "recent")
    if not stage.claimed:
        return Fate(stage, "drop", "shipped, never run")
    if stage.age_s >= max(RECORD_S, older_than_s):
        return Fate(stage, "drop", "old: its record too")
    if stage.has_tree:
        return Fate(stage, "drop-tree", "its project copy (the record stays, for a late retry)")
    return Fate(stage, "keep", "only its record is left")


def stages_root(home: Path | None = None) -> Path:
    return (home or Path.home()) / STAGES_DIR


def survey(root: Path, now: float | None = None) -> tuple[list[Stage], list[str]]:
    """The stages under ``root`` and what was passed over (not made by hpctrain, a link, another user's)."""
    now = time.time() if now is None else now
    skipped: list[str] = []
    if not _own_folder(root, skipped):
        return [], skipped
    found: list[Stage] = []
    for entry, is_report in _candidates(root, skipped):
        found.append(_stage(Path(entry.path), now, report=is_report))
    return found, skipped


def prune(older_than_s: float = DEFAULT_OLDER_THAN_S, *, dry_run: bool = False, home: Path | None = None) -> Pruned:
    """Decide for every stage under ``~/hpctrain-submits`` and, unless ``dry_run``, carry it out."""
    found, skipped = survey(stages_root(home))
    decisions = [fate_of(stage, older_than_s) for stage in found]
    failed: list[str] = []
    if not dry_run:
        for decision in decisions:
            try:
                apply(decision)
            except OSError as exc:
                failed.append(f"{decision.stage.path}: {exc.strerror or exc}")
    return Pruned(tuple(decisions), tuple(skipped), tuple(failed), dry_run)


def apply(decision: Fate) -> None:
    """Carry out one decision; never follows a link (the stage was checked; rmtree walks by fd)."""
    target = decision.stage.path / "tree" if decision.action == "drop-tree" else decision.stage.path
    if decision.action == "keep":
        return
    info = os.lstat(target)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        os.unlink(target)  # a link or file where tree/ should be: the link itself goes, never its target
        return
    shutil.rmtree(target)


def _candidates(root: Path, skipped: list[str]) -> Iterator[tuple[os.DirEntry[str], bool]]:
    with os.scandir(root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name == "reports" and _own_folder(Path(entry.path), skipped):
                with os.scandir(entry.path) as reports:
                    for report in sorted(reports, key=lambda e: e.name):
                        if _ours(report, skipped):
                            yield report, True
            elif _ours(entry, skipped):
                yield entry, False


def _ours(entry: os.DirEntry[str], skipped: list[str]) -> bool:
    if not TOKEN.fullmatch(entry.name):
        skipped.append(f"{entry.path}: not a folder hpctrain made")
        return False
    return _own_folder(Path(entry.path), skipped)


def _own_folder(path: Path, skipped: list[str]) -> bool:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        skipped.append(f"{path}: a link or not a folder, left alone")
        return False
    if info.st_uid != os.getuid():
        skipped.append(f"{path}: another user's, left alone")
        return False
    return True


def _stage(path: Path, now: float, *, report: bool) -> Stage:
    rc = _lstat(path / "rc")
    changed = (rc or os.lstat(path)).st_mtime
    claimed = _is_dir(path / "claim")
    pid = _read_small(path / "claim" / "pid").strip()
    alive = pid.isdigit() and int(pid) > 1 and _alive(int(pid))
    tree = _lstat(path / "tree")
    return Stage(
        path=path,
        age_s=max(0.0, now - changed),
        claimed=claimed,
        ended=rc is not None and stat.S_ISREG(rc.st_mode),
        alive=alive,
        has_tree=tree is not None,
        referenced_by=None if report else _run_from_tree(path),
        report=report,
    )


def _run_from_tree(stage: Path) -> str | None:
    """A run directory the submit's answer names (its printed ``run dir:`` / ``study dir:`` lines, or its
    ``--json`` line) whose run has no code snapshot of its own, so runs from this tree."""
    for run_dir in _answered_runs(_read_small(stage / "out")):
        info = _read_small(run_dir / "run.json")
        if info and '"code_snapshot"' not in info:
            return str(run_dir)
    return None


def _answered_runs(out: str) -> Iterator[Path]:
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict):
                runs = [found, *(r for r in found.get("runs", []) if isinstance(r, dict))]
                yield from (Path(r["run_dir"]) for r in runs if isinstance(r.get("run_dir"), str))
        elif "run dir:" in line:
            yield Path(line.split("run dir:", 1)[1].strip())
        elif "study dir:" in line:
            study = Path(line.split("study dir:", 1)[1].strip())
            with contextlib.suppress(OSError):
                yield from sorted(p for p in study.iterdir() if not p.is_symlink() and p.is_dir())


def _read_small(path: Path) -> str:
    """A regular file's first 64 KiB, or "" (a link, a fifo, a device: never opened through)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, READ_LIMIT).decode(errors="replace")
    finally:
        os.close(fd)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _is_dir(path: Path) -> bool:
    info = _lstat(path)
    return info is not None and stat.S_ISDIR(info.st_mode)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

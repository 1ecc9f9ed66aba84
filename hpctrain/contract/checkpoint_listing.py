"""A checkpoints directory as its readers see it: each ``step-N`` folder is complete or it is ignored.

The one listing every reader uses (the trainer and ``hpctrain.task`` on
resume, ``status``, ``cancel``, ``sync``, the healing record, ``jobspec/lead_time``):
a folder counts only when its ``meta.json`` (written last) has this format
version, a known layout, the step its name says, and every file it lists at
the recorded size, inside the run. Its writing side is ``step_folders.py``;
the folder's names are ``rundir.py``'s. Torch-free.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import (
    BEST_FILE,
    META_FILE,
    STATE_FILE,
    checkpoints_dir,
    is_inside,
    read_json_object,
    step_dir_name,
)

CHECKPOINT_FORMAT_VERSION = 1
# a step folder's name: ASCII digits only, whole name (no trailing newline), at most 18 of them (an int64)
_STEP_DIR = re.compile(r"step-([0-9]{1,18})", re.ASCII)
MAX_STEP = 10**18 - 1
# A checkpoint folder's layout, as its meta.json says (absent: the trainer's, from before the key existed).
TRAINER_LAYOUT = "state.pt"  # the built-in trainer: one torch.save file, written by rank 0
DCP_LAYOUT = "dcp"  # hpctrain.task: a torch.distributed.checkpoint folder, written by every rank
CHECKPOINT_LAYOUTS = (TRAINER_LAYOUT, DCP_LAYOUT)
_MAX_CHECKPOINT_FILES = 1 << 16  # a DCP folder holds one file per writing rank and .metadata
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,127}$")


def checkpoint_layout(meta: Mapping[str, Any]) -> str:
    """How a checkpoint folder is laid out (:data:`TRAINER_LAYOUT` or :data:`DCP_LAYOUT`), from its meta."""
    layout = meta.get("layout", TRAINER_LAYOUT)
    return layout if isinstance(layout, str) else ""


def checkpoint_meta(step_dir: Path, layout: str | None = None) -> dict[str, Any] | None:
    """``meta.json`` of a complete checkpoint folder, else None.

    Complete: meta.json (written last) has this format version and a known layout (``layout``
    when given), and every file it lists lies in the folder, regular, with the recorded size.
    The trainer's layout must list its ``state.pt``. File names are plain names, never paths.
    The folder must lie inside the run (``RUN/checkpoints/step-N``'s run directory, symlinks
    resolved): a checkpoint reached through a symlink out of the run is not the run's; its files,
    plain names that are no symlinks, then lie inside too. Its step is meta.json's ``global_step``
    (an int from 0 to :data:`MAX_STEP`); a ``step-N`` folder's name must say the same N: a name is
    never trusted alone (``step-`` and 21 nines is no step of any checkpoint).
    """
    run_dir = Path(step_dir).parent.parent
    meta = read_json_object(Path(step_dir) / META_FILE, within=run_dir)
    if not meta or meta.get("format_version") != CHECKPOINT_FORMAT_VERSION or not is_inside(step_dir, run_dir):
        return None
    step, named = meta.get("global_step"), folder_step(Path(step_dir).name)
    if type(step) is not int or not 0 <= step <= MAX_STEP or (named is not None and named != step):
        return None
    found = checkpoint_layout(meta)
    if found not in CHECKPOINT_LAYOUTS or (layout is not None and found != layout):
        return None
    files = meta.get("files")
    if not isinstance(files, dict) or not 0 < len(files) <= _MAX_CHECKPOINT_FILES:
        return None
    if found == TRAINER_LAYOUT and STATE_FILE not in files:
        return None
    for name, expected in files.items():
        if not isinstance(name, str) or not _PLAIN_NAME.match(name) or name == META_FILE:
            return None
        if not isinstance(expected, dict) or not _has_size(Path(step_dir) / name, expected.get("size")):
            return None
    return meta


def folder_step(name: str) -> int | None:
    """The step a ``step-N`` folder's name says (ASCII digits, the whole name, spelled as
    :func:`step_dir_name` spells it), else None; checked against its meta.json by :func:`checkpoint_meta`."""
    match = _STEP_DIR.fullmatch(name)
    return int(match.group(1)) if match and name == step_dir_name(int(match.group(1))) else None


def _has_size(path: Path, size: Any) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and isinstance(size, int) and info.st_size == size


def step_folders(directory: Path) -> list[Path]:
    """Every folder named ``step-N`` under a checkpoints directory, complete or not, newest (by name) first."""
    if not Path(directory).is_dir():
        return []
    named = [(step, child) for child in Path(directory).iterdir() if (step := folder_step(child.name)) is not None]
    return [child for _, child in sorted(named, reverse=True)]


def complete_checkpoints(directory: Path, layout: str | None = None) -> list[Path]:
    """Complete ``step-N`` folders under a checkpoints directory (of ``layout`` only, if given), oldest first."""
    found = [child for child in step_folders(directory) if child.is_dir() and checkpoint_meta(child, layout)]
    return found[::-1]


def latest_checkpoint(directory: Path, layout: str | None = None) -> Path | None:
    """The newest complete folder, examined newest first (one meta.json read when the newest is complete)."""
    return next((child for child in step_folders(directory) if child.is_dir() and checkpoint_meta(child, layout)), None)


def best_checkpoint(directory: Path) -> Path | None:
    """The folder ``best.json`` points at, if it is complete."""
    pointer = read_json_object(Path(directory) / BEST_FILE, within=Path(directory).parent)
    if not pointer or not isinstance(pointer.get("dir"), str) or folder_step(pointer["dir"]) is None:
        return None  # only a step-N folder beside it, never a path out of the run
    path = Path(directory) / pointer["dir"]
    return path if checkpoint_meta(path) is not None else None


def latest_checkpoint_step(run_dir: Path) -> int | None:
    """Global step of the run's newest complete checkpoint."""
    latest = latest_checkpoint(checkpoints_dir(run_dir))
    return None if latest is None else folder_step(latest.name)  # listed: its meta.json says the same step


def checkpoint_metas(run_dir: Path, *, complete_only: bool = True) -> list[dict[str, Any]]:
    """``meta.json`` of every complete checkpoint of a run, oldest first.

    ``complete_only=False`` also returns the meta of folders whose state file
    is gone or differs: the meta is written last, so it still tells how long
    that write took (``spec/lead_time`` wants every measured save).
    """
    if complete_only:
        return [meta for path in complete_checkpoints(checkpoints_dir(run_dir)) if (meta := checkpoint_meta(path))]
    folders = sorted(checkpoints_dir(run_dir).glob("step-*")) if checkpoints_dir(run_dir).is_dir() else []
    folders = [folder for folder in folders if folder_step(folder.name) is not None]
    metas = (read_json_object(folder / META_FILE, within=run_dir) for folder in folders)
    return [meta for meta in metas if meta]

"""Before a task checkpoint loads: is the folder whole, safe, ours, and does it fit what is registered?

* :func:`metadata_of` reads a step folder's ``meta.json`` and DCP ``.metadata``.
  A folder that is incomplete, damaged or unsafe (a file short or missing,
  metadata without a recorded digest or not matching it, larger than what
  the loop's state can need -- ``dcp_io.metadata_budget``, judged from
  meta.json before a byte of it is read --, that does not unpickle, names
  classes outside DCP's own, or places values outside the folder's files or
  claims sizes its chunks and stored bytes do not back: ``dcp_io.check_storage``) raises
  :class:`DamagedCheckpoint`: the loader skips it and tries the previous one,
  as the built-in trainer does. A folder of another format or kind is an
  error: nothing is loaded from it.
* :func:`check_fits` compares what the registered parts expect -- every key of
  each model and optimizer, its shape, every plain part -- with what the
  folder holds, and raises one error that names what does not match before
  anything is loaded (a folder written by another model or another run).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract import checkpoint_listing, rundir
from hpctrain.contract.checkpoint_listing import DCP_LAYOUT
from hpctrain.contract.rundir import META_FILE
from hpctrain.contract.step_folders import file_digest
from hpctrain.errors import CheckpointError
from hpctrain.task.dcp_io import (
    METADATA_FILE,
    UnsafeCheckpoint,
    check_storage,
    flat_keys,
    load_metadata,
    metadata_budget,
    stored_shape,
)
from hpctrain.task.group import first_line
from hpctrain.task.parts import Part

SHOWN = 6  # keys named per kind of mismatch; the rest are counted


class DamagedCheckpoint(CheckpointError):
    """A checkpoint folder that is incomplete or damaged: skipped in favour of the previous one."""


def metadata_of(folder: Path, fmt: str, keys: Collection[str]) -> tuple[dict[str, Any], Any, int]:
    """(meta.json, DCP metadata, the load's pickle budget) of a complete task checkpoint folder, for a loop
    whose state has ``keys`` (see the module doc for what raises)."""
    meta = checkpoint_listing.checkpoint_meta(folder, DCP_LAYOUT)
    if meta is None:
        found = rundir.read_json_object(folder / META_FILE)
        if (
            found
            and checkpoint_listing.checkpoint_layout(found) != DCP_LAYOUT
            and checkpoint_listing.checkpoint_meta(folder) is not None
        ):
            raise CheckpointError(
                f"{folder} is a checkpoint of the built-in trainer (state.pt), not of hpctrain.task",
                hint="load it with the trainer, or point the Checkpointer at this loop's own folder",
            )
        raise DamagedCheckpoint(f"{folder} is incomplete (its {META_FILE} is missing or a file is short or missing)")
    if meta.get("format") != fmt:
        raise CheckpointError(
            f"{folder} was written in format {meta.get('format')!r}, not {fmt!r}",
            hint="point the Checkpointer at a folder of hpctrain.task checkpoints",
        )
    expected = meta["files"].get(METADATA_FILE, {})
    if not isinstance(expected.get("sha256"), str):
        raise DamagedCheckpoint(
            f"its {META_FILE} records no digest of {METADATA_FILE}, which hpctrain.task always does"
        )
    ranks = saved_ranks(meta)
    budget = metadata_budget(keys, ranks)
    if expected["size"] > budget:
        raise DamagedCheckpoint(
            f"its {METADATA_FILE} is {expected['size']} bytes, more than the {len(keys)} values this loop holds, "
            f"saved by {ranks} ranks, can need ({budget} at most); not read"
        )
    if file_digest(folder / METADATA_FILE)[1] != expected["sha256"]:
        raise DamagedCheckpoint(f"{folder / METADATA_FILE} does not match the digest in its {META_FILE}")
    try:
        metadata = load_metadata(folder / METADATA_FILE, budget)
        check_storage(metadata, meta["files"])
    except UnsafeCheckpoint as exc:
        raise DamagedCheckpoint(f"unsafe: {exc.message}") from exc
    except Exception as exc:  # noqa: BLE001 - a crafted pickle raises what it likes (RecursionError, KeyError, ...)
        why = f"{type(exc).__name__}: {first_line(exc)}"
        raise DamagedCheckpoint(f"{folder / METADATA_FILE} cannot be read: {why}") from exc
    return meta, metadata, budget


MIN_RANK_FILE_BYTES = 4096  # every rank writes a file with at least its RNG state (6.6 KB as torch.save writes it)


def saved_ranks(meta: Mapping[str, Any]) -> int:
    """How many ranks may have written the folder: its recorded world size, but no more than the data files
    that hold what a rank writes at least (a list of empty files does not make the budget grow)."""
    world = meta.get("world_size")
    written = sum(
        1 for name, entry in meta["files"].items() if name != METADATA_FILE and entry["size"] >= MIN_RANK_FILE_BYTES
    )
    return max(1, min(world if type(world) is int else 1, written))


def check_fits(
    folder: Path, parts: list[Part], template: dict[str, Any], metadata: Any, rank: int, same_ranks: bool
) -> None:
    """Raise one error naming every mismatch between the registered parts and ``folder``; None when it fits."""
    stored = metadata.state_dict_metadata
    problems: list[str] = []
    unfit: set[int] = set()  # modules that do not fit: their optimizers' mismatches follow from theirs
    for part in parts:
        if part.kind == "optimizer" and id(part.module) in unfit:
            continue
        if part.kind in ("module", "optimizer"):
            found = _tensor_problems(part.name, flat_keys({part.name: template[part.name]}), stored, metadata)
            if found and part.kind == "module":
                unfit.add(id(part.obj))
            problems += found
        elif (part.kind == "object" or same_ranks) and part.key(rank) not in stored:
            problems.append(f"part {part.name!r} is not in it")
    if not problems:
        return
    saved = sorted({key.split(".", 1)[0].split("/", 1)[0] for key in stored})
    raise CheckpointError(
        f"{folder} does not fit what this loop registered, so nothing was loaded: "
        + "; ".join(problems)
        + f" (the checkpoint holds parts: {', '.join(saved)})",
        hint="it was written by another model or another run: load it with the model that wrote it, or give this "
        "run its own checkpoint folder (move the foreign step-N folders away)",
    )


def _tensor_problems(name: str, expected: dict[str, Any], stored: dict[str, Any], metadata: Any) -> list[str]:
    have = {key for key in stored if key.startswith(name + ".")}
    missing = sorted(set(expected) - have)
    unexpected = sorted(have - set(expected))
    shapes = []
    for key in sorted(set(expected) & have):
        saved = stored_shape(metadata, key)
        shape = getattr(expected[key], "shape", None)
        if saved is not None and shape is not None and tuple(saved) != tuple(shape):
            shapes.append(f"{_short(key, name)} is {list(saved)} there, {list(shape)} here")
    problems = []
    if missing:
        problems.append(f"{name}: missing keys {_listed([_short(k, name) for k in missing])}")
    if unexpected:
        problems.append(f"{name}: unexpected keys {_listed([_short(k, name) for k in unexpected])}")
    if shapes:
        problems.append(f"{name}: shapes differ: {_listed(shapes)}")
    return problems


def _short(key: str, name: str) -> str:
    return key[len(name) + 1 :]


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f" (+{len(items) - SHOWN} more)" if len(items) > SHOWN else "")

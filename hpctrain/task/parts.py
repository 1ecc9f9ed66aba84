"""What a user registers with the checkpointer, and how each kind of part becomes checkpoint state and back.

Four kinds, told apart at registration (anything else is refused there, by name):

* ``module`` (an ``nn.Module``, DDP-wrapped, ``torch.compile``d or FSDP2-sharded):
  its state through ``torch.distributed.checkpoint.state_dict`` -- the plain
  module's keys whatever wraps it, DTensor shards where it is sharded -- so a
  checkpoint resharded onto another number of ranks loads in place;
* ``optimizer`` (a ``torch.optim.Optimizer`` of a registered module's
  parameters): its state keyed by parameter name, sharded like the module;
* ``object`` (anything else with ``state_dict()`` and ``load_state_dict()``:
  an LR scheduler, :class:`hpctrain.task.ElasticLoader`, your own class): its
  state is the same on every rank, saved once as one plain blob;
* ``rank`` (registered with ``per_rank=True``, and the built-in ``rng``): each
  rank's own state, saved under the rank's number and restored to the same rank
  when the number of ranks is unchanged (otherwise kept as the new run made it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from hpctrain.errors import CheckpointError
from hpctrain.task.dcp_io import blob_pickle_bound, flat_keys, from_blob, to_blob
from hpctrain.task.plain_state import PlainState
from hpctrain.task.rng import capture_rng_state, restore_rng_state

log = logging.getLogger(__name__)

Kind = Literal["module", "optimizer", "object", "rank"]
RNG_PART = "rng"
RESERVED_NAMES = frozenset({RNG_PART, "hpctrain"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass
class Part:
    name: str
    obj: Any
    kind: Kind
    module: nn.Module | None = None  # an optimizer's model
    plain: PlainState | None = None  # a module's or optimizer's DCP state (plain_state.py)

    def key(self, rank: int) -> str:
        """The part's top-level key in a checkpoint (a rank part's includes the rank)."""
        return f"{self.name}/rank-{rank:05d}" if self.kind == "rank" else self.name


def classify(name: str, obj: Any, modules: list[Part], *, per_rank: bool = False) -> Part:
    """The part ``obj`` registered as ``name``; a clear error for what cannot be checkpointed."""
    if not isinstance(name, str) or not _NAME.match(name) or name in RESERVED_NAMES:
        raise CheckpointError(
            f"Checkpointer: {name!r} cannot name a part",
            hint="use a Python identifier (letters, digits, _), not 'rng' or 'hpctrain'",
        )
    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        raise CheckpointError(
            f"Checkpointer: {name}={type(obj).__module__}.{type(obj).__qualname__} has no state_dict() and "
            "load_state_dict(), so it cannot be saved and restored",
            hint="register objects that save and restore themselves (a model, an optimizer, an LR scheduler, "
            "hpctrain.task.ElasticLoader, or a class of yours with both methods)",
        )
    if per_rank:
        return Part(name, obj, "rank")
    if isinstance(obj, nn.Module):
        rebuilds = isinstance(obj, nn.parallel.DistributedDataParallel) and not obj.find_unused_parameters
        if rebuilds and torch.are_deterministic_algorithms_enabled():  # bit-exact resume is what the loop asks for
            log.warning(
                "Checkpointer: %s is DistributedDataParallel that rebuilds its gradient buckets after its first "
                "step: a resumed run on more than 2 ranks then sums in another order and its weights differ in the "
                "last bits; wrap it with hpctrain.task.ddp(model) to resume bit for bit",
                name,
            )
        return Part(name, obj, "module", plain=PlainState(obj))
    if isinstance(obj, torch.optim.Optimizer):
        owner = _owner(name, obj, modules)
        return Part(name, obj, "optimizer", module=owner, plain=PlainState(owner, obj))
    return Part(name, obj, "object")


def _owner(name: str, optimizer: torch.optim.Optimizer, modules: list[Part]) -> nn.Module:
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for part in modules:
        if params <= {id(p) for p in part.obj.parameters()}:
            return part.obj
    known = ", ".join(part.name for part in modules) or "none"
    raise CheckpointError(
        f"Checkpointer: optimizer {name!r} updates parameters of no registered model (registered models: {known})",
        hint="register the model it optimizes too, before it: Checkpointer(model=model, optimizer=optimizer)",
    )


# -- saving ------------------------------------------------------------------------------------------------------
def save_state(parts: list[Part], rank: int, device: torch.device) -> dict[str, Any]:
    """Every part's state under its key: what every rank hands to ``dcp.save``."""
    state: dict[str, Any] = {}
    for part in parts:
        if part.plain is not None:
            state[part.name] = part.plain.state()
        else:
            state[part.key(rank)] = to_blob(part.obj.state_dict(), part.name)
    state[f"{RNG_PART}/rank-{rank:05d}"] = to_blob(capture_rng_state(device), RNG_PART)
    return state


# -- loading -----------------------------------------------------------------------------------------------------
def live_state(parts: list[Part], *, guessed: bool = False) -> dict[str, Any]:
    """The live state of the modules and optimizers (their tensors, not copies): what ``dcp.load`` fills.
    ``guessed``: each part's own dictionary where DCP was not asked yet (``PlainState.guess``), for a load
    that confirms it with :func:`guess_fits`."""
    state: dict[str, Any] = {}
    for part in parts:
        if part.plain is not None:
            own = part.plain.guess() if guessed else None
            state[part.name] = own if own is not None else part.plain.state()
    return state


def guess_fits(parts: list[Part], live: dict[str, Any], stored: Collection[str]) -> bool:
    """Whether every module's and optimizer's state in ``live`` has exactly the keys the checkpoint holds for
    it (``stored``: its flat keys, written with DCP's names): then ours names what DCP's would."""
    for part in parts:
        if part.plain is not None:
            prefix = part.name + "."
            if set(flat_keys({part.name: live[part.name]})) != {key for key in stored if key.startswith(prefix)}:
                return False
    return True


def load_template(
    parts: list[Part], rank: int, blob_sizes: dict[str, int], same_ranks: bool, live: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What ``dcp.load`` fills in place: ``live`` (default: :func:`live_state`), empty blobs of saved sizes.

    A rank part (and the RNG) is asked for only when the number of ranks is unchanged (``same_ranks``).
    ``blob_sizes``: the saved size of each blob key; a registered part missing there is left out here
    (the key check reports it).
    """
    template = dict(live_state(parts) if live is None else live)
    for part in [*parts, Part(RNG_PART, None, "rank")]:
        if part.kind == "object" or (part.kind == "rank" and same_ranks):
            key = part.key(rank)
            if key in blob_sizes:
                template[key] = torch.empty(blob_sizes[key], dtype=torch.uint8)
    return template


def held_keys(parts: list[Part], rank: int, live: dict[str, Any] | None = None) -> list[str]:
    """DCP's flat keys of the state this loop holds (what a checkpoint of it can legitimately describe)."""
    keys = list(flat_keys(live_state(parts) if live is None else live))
    return keys + [part.key(rank) for part in [*parts, Part(RNG_PART, None, "rank")] if part.kind in ("object", "rank")]


def decode_blobs(
    parts: list[Part], loaded: dict[str, Any], rank: int, device: torch.device, *, same_ranks: bool
) -> dict[str, Any]:
    """The plain state of every blob this rank restores, unpickled safely (``dcp_io.from_blob``, its pickle
    bounded by the live part's: ``dcp_io.blob_pickle_bound``) before any part is touched: a blob that is
    unsafe or damaged raises ``UnsafeCheckpoint`` with nothing applied."""
    decoded = {}
    for part in [*parts, Part(RNG_PART, None, "rank")]:
        key = part.key(rank)
        if (part.kind == "object" or (part.kind == "rank" and same_ranks)) and key in loaded:
            decoded[key] = from_blob(loaded[key], part.name, blob_pickle_bound(_live_bytes(part, device)))
    return decoded


def _live_bytes(part: Part, device: torch.device) -> int:
    """The bytes of the blob ``part`` would save now (0 when its live state cannot be saved at all)."""
    try:
        return to_blob(capture_rng_state(device) if part.name == RNG_PART else part.obj.state_dict(), part.name).numel()
    except CheckpointError:
        return 0


def apply_loaded(
    parts: list[Part],
    loaded: dict[str, Any],
    decoded: dict[str, Any],
    rank: int,
    device: torch.device,
    asked: dict[str, Any],
) -> list[str]:
    """Hand each part its loaded state (``decoded``: the blobs'; ``asked``: a ``plain_state.snapshot`` of the
    live state before DCP filled it); the names of parts kept as they were (rank parts and the RNG on another
    number of ranks)."""
    kept = []
    for part in parts:
        if part.plain is not None:
            part.plain.set(loaded[part.name], asked[part.name])
        elif part.key(rank) in decoded:
            part.obj.load_state_dict(decoded[part.key(rank)])
        else:
            kept.append(part.name)
    rng_key = f"{RNG_PART}/rank-{rank:05d}"
    if rng_key not in decoded:
        return [*kept, RNG_PART]
    try:
        restore_rng_state(decoded[rng_key], device)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as exc:
        raise CheckpointError(
            f"the checkpoint's random generator state of rank {rank} cannot be restored ({type(exc).__name__}: {exc})",
            hint="it is not a checkpoint hpctrain.task wrote as it is; move it away",
        ) from exc
    return kept

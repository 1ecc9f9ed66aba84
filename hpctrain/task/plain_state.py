"""DCP's state_dict helpers without their cost on every call, for a module and optimizer that are not sharded.

``torch.distributed.checkpoint.state_dict``'s ``get_model_state_dict`` and
``get_optimizer_state_dict`` work out every parameter's name anew on each call
(42 and 33 ms for a ResNet-50 with momentum on one core, against 4 ms for the
module's own ``state_dict()``), and their ``set_`` twins copy every tensor into
itself after DCP already loaded into it (75 and 31 ms): more than a plain
``torch.save``'s whole save (0.16-0.2 s) and load (0.14 s) can absorb
(``benchmarks/task_checkpoint.py``). A DDP or ``torch.compile`` wrapper over a
plain module changes nothing they compute but the names, so :class:`PlainState`
asks DCP once, checks that the module's own state (wrappers stripped) and the
optimizer's (its parameters named as DCP names them) are exactly what DCP gave
-- the same keys in the same order, the same tensors, the same
hyper-parameters -- and from then on builds the same dictionaries itself. After
a load that filled those very tensors in place, only the optimizer's
hyper-parameters are left to set. Anything else (a DTensor, an optimizer
without its state yet, a value DCP replaced instead of filling) goes to DCP's
helpers, as before. A load that comes before any save (a resume) does not ask
DCP either when our dictionary has exactly the keys the checkpoint holds for
the part (:meth:`PlainState.guess`): a save wrote them with DCP's names.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor


def unwrapped(module: nn.Module) -> nn.Module:
    """The plain module inside DDP's and ``torch.compile``'s wrappers."""
    while True:
        inner = getattr(module, "module", None) if isinstance(module, nn.parallel.DistributedDataParallel) else None
        inner = inner or getattr(module, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return module
        module = inner


class PlainState:
    """One registered module, or an optimizer of one: its DCP state, asked of DCP once."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.module, self.optimizer = module, optimizer
        self._trusted: bool | None = None  # whether our own dictionary equals DCP's (decided at the first call)
        self._names: list[str] = []  # the optimizer's parameters in its order, named as DCP names them
        self._own_given = False  # whether the last state handed out was our own (the live tensors themselves)

    def state(self) -> dict[str, Any]:
        """What ``get_model_state_dict`` (or ``get_optimizer_state_dict``) returns."""
        own = self._own() if self._trusted else None
        self._own_given = own is not None
        if own is not None:
            return own
        state = (
            get_model_state_dict(self.module)
            if self.optimizer is None
            else get_optimizer_state_dict(self.module, self.optimizer)
        )
        if self._trusted is None:
            self._name_parameters()
            own = self._own() if all(self._names) else None
            self._trusted = own is not None and _same(own, state)
            if self._trusted:  # the same tensors and values: handed out as ours, so a load can skip setting them
                self._own_given = True
                return own  # type: ignore[return-value]
        return state

    def guess(self) -> dict[str, Any] | None:
        """For a load: our own dictionary, without asking DCP while it is undecided whether ours equals DCP's
        (None when it cannot be built now, or DCP's must be used). A load confirms it against the checkpoint's
        keys, which a save wrote with DCP's names (``parts.guess_fits``), and asks :meth:`state` otherwise."""
        if self._trusted is False:
            return None
        self._name_parameters()
        own = self._own() if all(self._names) else None
        self._own_given = own is not None
        return own

    def _name_parameters(self) -> None:
        if self.optimizer is not None and not self._names:
            named = {id(p): name for name, p in unwrapped(self.module).named_parameters()}
            self._names = [named.get(id(p), "") for group in self.optimizer.param_groups for p in group["params"]]

    def set(self, loaded: dict[str, Any], asked: dict[str, Any]) -> None:
        """After DCP filled ``loaded`` (``asked``: a :func:`snapshot` of the state handed to it before)."""
        if self.optimizer is None:
            if not (self._own_given and _filled_in_place(loaded, asked)):
                set_model_state_dict(self.module, loaded)
            return
        groups = loaded.get("param_groups")
        same_groups = (
            isinstance(groups, list)
            and len(groups) == len(self.optimizer.param_groups)
            and all(isinstance(g, dict) and g.get("params") == n for g, n in zip(groups, self._group_names()))
        )
        if not (self._own_given and same_groups and _filled_in_place(loaded.get("state"), asked.get("state"))):
            set_optimizer_state_dict(self.module, self.optimizer, loaded)
            return
        for group, saved in zip(self.optimizer.param_groups, groups):
            group.update({key: value for key, value in saved.items() if key != "params"})

    def _own(self) -> dict[str, Any] | None:
        if self.optimizer is None:
            state = unwrapped(self.module).state_dict()
            return None if any(isinstance(value, DTensor) for value in state.values()) else state
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if len(params) != len(self._names) or any(p not in self.optimizer.state for p in params):
            return None
        state = {name: dict(self.optimizer.state[p]) for name, p in zip(self._names, params)}
        groups = [
            {**{k: v for k, v in group.items() if k != "params"}, "params": names}
            for group, names in zip(self.optimizer.param_groups, self._group_names())
        ]
        return {"state": state, "param_groups": groups}

    def _group_names(self) -> list[list[str]]:
        assert self.optimizer is not None
        names, grouped = iter(self._names), []
        for group in self.optimizer.param_groups:
            grouped.append([next(names, "") for _ in group["params"]])
        return grouped


def snapshot(state: Any) -> Any:
    """``state``'s dictionaries and lists copied, its values the same objects: what was handed to DCP."""
    if isinstance(state, dict):
        return {key: snapshot(value) for key, value in state.items()}
    if isinstance(state, list):
        return [snapshot(value) for value in state]
    return state


def _same(ours: Any, theirs: Any) -> bool:
    """The same structure, keys in the same order, the same tensor objects' memory, equal plain values."""
    if isinstance(ours, dict):
        return isinstance(theirs, dict) and list(ours) == list(theirs) and all(_same(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, (list, tuple)):
        return type(ours) is type(theirs) and len(ours) == len(theirs) and all(map(_same, ours, theirs))
    if isinstance(ours, torch.Tensor):
        return (
            isinstance(theirs, torch.Tensor)
            and not isinstance(theirs, DTensor)
            and ours.data_ptr() == theirs.data_ptr()
            and ours.shape == theirs.shape
            and ours.dtype == theirs.dtype
            and ours.device == theirs.device
        )
    return type(ours) is type(theirs) and ours == theirs


def _filled_in_place(loaded: Any, asked: Any) -> bool:
    """Whether every tensor of ``loaded`` is the very tensor that was asked for (DCP loaded into it) and
    nothing else was loaded but equal plain values (a tensor DCP replaced, or a changed value: set it)."""
    if isinstance(asked, dict):
        return (
            isinstance(loaded, dict)
            and list(loaded) == list(asked)
            and all(_filled_in_place(loaded[k], asked[k]) for k in asked)
        )
    if isinstance(asked, torch.Tensor):
        return loaded is asked and not isinstance(asked, DTensor)
    return False  # a plain value loaded as bytes: let DCP's helper set it

"""One digest of a model's weights, equal for the same weights however the model is wrapped or sharded.

``weights_sha256`` is how the tests (and a user) prove an interrupted run ended
with the same weights as an uninterrupted one: the built-in trainer writes it
into summary.json, a user's loop can with ``task.set_summary``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

_PREFIXES = ("module.", "_orig_mod.")  # DDP/DP and torch.compile wrappers


def weights_sha256(weights: nn.Module | Mapping[str, Any]) -> str:
    """sha256 over every tensor's name (wrapper prefixes stripped), dtype, shape and bytes, in key order.

    A module's state is read with ``torch.distributed.checkpoint.state_dict``'s full state dict: an
    FSDP2-sharded model is gathered first (collective: call it on every rank).
    """
    if isinstance(weights, nn.Module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights = get_model_state_dict(weights, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    digest = hashlib.sha256()
    for key, value in weights.items():
        if not isinstance(value, torch.Tensor):
            continue
        name = key
        for prefix in _PREFIXES:
            while name.startswith(prefix):
                name = name[len(prefix) :]
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        tensor = value.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{tensor.dtype}:{tuple(value.shape)};".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()

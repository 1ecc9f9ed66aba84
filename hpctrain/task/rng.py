"""Reproducibility: seeding, deterministic kernels, and RNG state that survives a resume.

An exactly resumed run must draw the same random numbers as an uninterrupted
one, so every rank's Python, NumPy, torch and CUDA generator states go into
the checkpoint (gathered to rank 0) and each rank restores its own. States are
stored as tensors, ints and lists only, so checkpoints load with
``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# cuBLAS needs a fixed workspace to be deterministic (CUDA >= 10.2).
CUBLAS_WORKSPACE = ":4096:8"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


@contextlib.contextmanager
def deterministic_mode(enabled: bool) -> Iterator[None]:
    """Deterministic kernels (or cuDNN autotuning) for the duration; the process's flags come back after.

    With ``enabled`` a kernel without a deterministic implementation raises
    instead of silently breaking bit-exact resumes.
    """
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True, warn_only=False)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True  # as the ImageNet references: fixed input shapes
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.deterministic = previous[2]
        torch.backends.cudnn.benchmark = previous[3]


def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """This process's generator states, as checkpoint-safe values."""
    keys, pos, has_gauss, cached_gaussian = np.random.get_state()[1:]
    version, py_state, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {
            "version": int(version),
            "state": torch.tensor(py_state, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
        "cuda": [],
    }
    if device.type == "cuda" and torch.cuda.is_initialized():
        state["cuda"] = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Set this process's generators; the state may have been loaded onto any device."""
    torch.set_rng_state(state["torch"].cpu())
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["keys"].cpu().numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    python_state = state["python"]
    random.setstate((python_state["version"], tuple(python_state["state"].cpu().tolist()), python_state["gauss_next"]))
    cuda_states = state.get("cuda") or []
    if device.type == "cuda" and cuda_states:
        if len(cuda_states) == torch.cuda.device_count():
            for index, cuda_state in enumerate(cuda_states):
                torch.cuda.set_rng_state(cuda_state.cpu(), index)
        else:
            log.warning(
                "checkpoint holds CUDA RNG states for %d devices, this task sees %d; CUDA RNG not restored",
                len(cuda_states),
                torch.cuda.device_count(),
            )


def gather_rng_states(device: torch.device) -> list[dict[str, Any]] | None:
    """Every rank's RNG state, in rank order, on rank 0 (None elsewhere). Collective when distributed."""
    local = capture_rng_state(device)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [local]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return gathered if dist.get_rank() == 0 else None


def restore_rank_rng_state(
    states: list[dict[str, Any]] | None, rank: int, world_size: int, device: torch.device
) -> bool:
    """Restore this rank's entry of a checkpoint's RNG states; False when the layout does not match."""
    if not states or len(states) != world_size:
        log.warning(
            "checkpoint holds RNG states for %s ranks, this run has %d: keeping freshly seeded RNGs "
            "(data order, augmentation and global batch are kept; per-rank randomness such as dropout is not)",
            len(states) if states else 0,
            world_size,
        )
        return False
    restore_rng_state(states[rank], device)
    return True

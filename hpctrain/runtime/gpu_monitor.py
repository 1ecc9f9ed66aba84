"""GPU utilisation and memory of this rank's device, through NVML (``pip install hpctrain[gpu-monitor]``).

The heartbeat thread samples at the heartbeat rate; a sample is two NVML
queries (microseconds, no CUDA context, no sync with the training stream).
Without ``pynvml`` (package nvidia-ml-py) or without a GPU there is simply no
sampler. NVML numbers devices physically; CUDA numbers the visible ones, so
the device is found through ``CUDA_VISIBLE_DEVICES`` (an index or a UUID).
Torch-free.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)


def nvml_device_ref(cuda_index: int, environ: Mapping[str, str]) -> int | str:
    """The NVML index (int) or UUID (str) of CUDA device ``cuda_index`` as this process sees it. Pure."""
    visible = [item.strip() for item in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    if not visible or cuda_index >= len(visible):
        return cuda_index
    ref = visible[cuda_index]
    return int(ref) if ref.isdigit() else ref


def gpu_sampler(cuda_index: int, environ: Mapping[str, str]) -> Callable[[], dict[str, float] | None] | None:
    """A function returning ``{"gpu_util_pct", "gpu_mem_used_mb"}`` for the device, or None without NVML."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        ref = nvml_device_ref(cuda_index, environ)
        handle: Any = (
            pynvml.nvmlDeviceGetHandleByIndex(ref) if isinstance(ref, int) else pynvml.nvmlDeviceGetHandleByUUID(ref)
        )
    except Exception as exc:  # no driver, a MIG slice NVML will not name, ...
        log.warning("GPU monitoring is off: NVML could not open CUDA device %d: %s", cuda_index, exc)
        return None

    def sample() -> dict[str, float] | None:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {"gpu_util_pct": float(util.gpu), "gpu_mem_used_mb": round(memory.used / 2**20, 1)}

    return sample

"""Is the time-limit warning early enough to save a checkpoint?

Slurm sends ``signals.timeout_signal`` ``signals.signal_delay_s`` seconds
before the limit; in that time every rank must finish its step, agree to
stop and rank 0 must write a complete checkpoint. ``hpctrain submit``,
``validate`` and ``resume`` warn when the lead time looks too short: from the
save times measured in the run's own checkpoints when there are any
(``meta.json`` records ``write_s``), else from an estimate of the state size.

Pure and torch-free: it runs on login nodes. Parameter counts of common
torchvision models are tabulated instead of building the model.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.jobspec.archs import ARCH_PARAMS_M
from hpctrain.jobspec.models import JobSpec

UNKNOWN_ARCH_PARAMS_M = 100.0
# A shared cluster file system under load; local NVMe is ~10x faster.
ASSUMED_WRITE_MB_S = 100.0
# Finishing the current step, agreeing to stop, copying the state off the GPU, requeueing.
STOP_OVERHEAD_S = 30.0


def estimated_save_s(spec: JobSpec) -> tuple[float, str]:
    """Seconds to write this spec's checkpoint, and how that was worked out."""
    params_m = ARCH_PARAMS_M.get(spec.trainer.arch, UNKNOWN_ARCH_PARAMS_M)
    copies = 2 if spec.trainer.momentum > 0 else 1  # weights + SGD momentum buffers, float32
    megabytes = params_m * 4 * copies
    known = "" if spec.trainer.arch in ARCH_PARAMS_M else ", size unknown so assumed"
    how = (
        f"{spec.trainer.arch} ~{params_m:.0f}M parameters{known}: ~{megabytes:.0f} MB at {ASSUMED_WRITE_MB_S:.0f} MB/s"
    )
    return megabytes / ASSUMED_WRITE_MB_S, how


def measured_save_s(run_dir: Path) -> float | None:
    """The slowest checkpoint write recorded in a run directory, if any."""
    from hpctrain.contract.checkpoint_listing import checkpoint_metas

    times = []
    for meta in checkpoint_metas(run_dir, complete_only=False):
        try:
            times.append(float(meta["write_s"]))
        except (ValueError, KeyError, TypeError):
            continue
    return max(times) if times else None


def lead_time_warning(spec: JobSpec, run_dir: Path | None = None) -> str | None:
    """A warning when ``signals.signal_delay_s`` looks too short to save; else None."""
    measured = measured_save_s(run_dir) if run_dir is not None else None
    if not spec.runs_trainer and measured is None:
        return None  # what user code (an entry point, a script) saves is known once it saved with hpctrain.task
    if measured is not None:
        save_s, how = measured, "the slowest save measured in this run"
    else:
        save_s, how = estimated_save_s(spec)
    needed = save_s + STOP_OVERHEAD_S
    if spec.signals.signal_delay_s >= needed:
        return None
    suggestion = int(-(-needed * 1.5 // 10) * 10)  # 1.5x, rounded up to 10 s
    return (
        f"signals.signal_delay_s={spec.signals.signal_delay_s} may be too short to checkpoint before the time limit: "
        f"a save takes ~{save_s:.0f} s ({how}) plus ~{STOP_OVERHEAD_S:.0f} s to stop; "
        f"set it to {suggestion} or more (--set signals.signal_delay_s={suggestion})"
    )

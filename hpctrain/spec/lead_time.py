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

from hpctrain.rundir import checkpoint_metas
from hpctrain.spec.models import JobSpec

# Millions of parameters (torchvision's model cards).
ARCH_PARAMS_M: dict[str, float] = {
    "alexnet": 61.1, "convnext_tiny": 28.6, "convnext_small": 50.2, "convnext_base": 88.6, "convnext_large": 197.8,
    "densenet121": 8.0, "densenet161": 28.7, "densenet169": 14.1, "densenet201": 20.0,
    "efficientnet_b0": 5.3, "efficientnet_b3": 12.2, "efficientnet_b7": 66.3, "efficientnet_v2_s": 21.5,
    "efficientnet_v2_m": 54.1, "efficientnet_v2_l": 118.5, "googlenet": 6.6, "inception_v3": 27.2,
    "mobilenet_v2": 3.5, "mobilenet_v3_small": 2.5, "mobilenet_v3_large": 5.5, "regnet_y_16gf": 83.6,
    "regnet_y_32gf": 145.0, "regnet_y_128gf": 644.8, "resnet18": 11.7, "resnet34": 21.8, "resnet50": 25.6,
    "resnet101": 44.5, "resnet152": 60.2, "resnext50_32x4d": 25.0, "resnext101_32x8d": 88.8,
    "resnext101_64x4d": 83.5, "shufflenet_v2_x1_0": 2.3, "squeezenet1_1": 1.2, "swin_t": 28.3, "swin_s": 49.6,
    "swin_b": 87.8, "vgg11": 132.9, "vgg16": 138.4, "vgg19": 143.7, "vit_b_16": 86.6, "vit_b_32": 88.2,
    "vit_l_16": 304.3, "vit_l_32": 306.5, "vit_h_14": 632.0, "wide_resnet50_2": 68.9, "wide_resnet101_2": 126.9,
}  # fmt: skip
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
    times = []
    for meta in checkpoint_metas(run_dir, complete_only=False):
        try:
            times.append(float(meta["write_s"]))
        except (ValueError, KeyError, TypeError):
            continue
    return max(times) if times else None


def lead_time_warning(spec: JobSpec, run_dir: Path | None = None) -> str | None:
    """A warning when ``signals.signal_delay_s`` looks too short to save; else None."""
    if spec.entrypoint is not None:
        return None  # we do not know what a user entry point saves
    measured = measured_save_s(run_dir) if run_dir is not None else None
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

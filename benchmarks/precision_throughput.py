"""Training throughput per precision, as ratios to fp32 measured in the same run.

Runs forward + backward + SGD steps of a torchvision model on synthetic
batches through hpctrain's own ``Precision`` (autocast + GradScaler) and
``to_memory_format`` (channels_last), and prints images/s and the ratio to
the fp32 baseline. On CUDA the default is ResNet-50 at 224 px; on CPU a small
ResNet-18 at 64 px so it finishes in about a minute.

    python benchmarks/precision_throughput.py [--arch resnet50 --batch 128 --steps 30]
"""

from __future__ import annotations

import argparse

import torch
import torchvision

from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.data.pipeline_rates import synthetic_step_rate


def images_per_s(
    arch: str, precision: str, channels_last: bool, device: torch.device, batch: int, size: int, steps: int, warmup: int
) -> float:
    model = torchvision.models.get_model(arch, weights=None)
    return synthetic_step_rate(
        model, precision, channels_last, device, batch=batch, size=size, steps=steps, warmup=warmup
    )


def main() -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet50" if cuda else "resnet18")
    parser.add_argument("--batch", type=int, default=128 if cuda else 32)
    parser.add_argument("--size", type=int, default=224 if cuda else 64)
    parser.add_argument("--steps", type=int, default=30 if cuda else 5)
    parser.add_argument("--warmup", type=int, default=10 if cuda else 2)
    args = parser.parse_args()
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"{args.arch}, batch {args.batch}, {args.size}px, {args.steps} steps on {name} (torch {torch.__version__})")
    configs = [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)]
    if cuda:
        configs += [("fp16", False), ("fp16", True)]
    baseline = None
    print(f"{'precision':<10}{'channels_last':<15}{'images/s':>10}{'x fp32':>9}")
    for precision, channels_last in configs:
        try:
            rate = images_per_s(
                args.arch, precision, channels_last, device, args.batch, args.size, args.steps, args.warmup
            )
        except TrainingConfigError as exc:
            print(f"{precision:<10}{channels_last!s:<15}  skipped: {exc.message}")
            continue
        baseline = baseline or rate
        print(f"{precision:<10}{channels_last!s:<15}{rate:>10.1f}{rate / baseline:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

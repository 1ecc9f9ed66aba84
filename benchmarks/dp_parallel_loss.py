"""How much GPU 0 memory does ``trainer.dp_parallel_loss`` save over plain dp, for a model with a large output?

Plain ``nn.DataParallel`` gathers every GPU's logits onto GPU 0 and computes
the loss there: GPU 0 holds the whole batch's logits, the loss's softmax and
the logits' gradient, B x C floats each, on top of its own share of the
activations. The parallel loss keeps B/n x C of each on every GPU.

For each mode (plain, parallel) and each ``--num-classes``, this trains
``--steps`` SGD steps of ``--arch`` through hpctrain's own wrappers
(``nn.DataParallel`` + the criterion, or ``DataParallelModel`` +
``parallel_loss``) over all visible GPUs, and prints the peak memory of every
GPU (``torch.cuda.max_memory_allocated``) and the step time. The ratio is
parallel / plain of GPU 0's peak, measured in the same run.

Needs at least 2 CUDA devices; with fewer it says so and exits 2 without
measuring. Usage: ``python benchmarks/dp_parallel_loss.py [--num-classes 1000 100000]``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import torch
import torchvision
from torch import nn

from hpctrain.trainer.strategies.dp import dp_device_ids
from hpctrain.trainer.strategies.dp_loss import DataParallelModel, parallel_loss


def measure(args: argparse.Namespace, num_classes: int, parallel: bool) -> dict[str, object]:
    """Peak memory per GPU (MiB) and mean step time (s) of a few dp steps."""
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    module = torchvision.models.get_model(args.arch, num_classes=num_classes).to(device)
    wrapper = DataParallelModel if parallel else nn.DataParallel
    model = wrapper(module, device_ids=dp_device_ids(device), output_device=device)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    gpus = torch.cuda.device_count()
    batch = args.batch_per_gpu * gpus
    images = torch.randn(batch, 3, args.image_size, args.image_size, device=device)
    targets = torch.randint(0, num_classes, (batch,), device=device)

    def train_step() -> None:
        output = model(images)
        loss = parallel_loss(criterion, output, targets)  # one tensor (plain dp): the plain criterion call
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    train_step()  # warm-up: cuDNN autotuning, optimizer state
    for index in range(gpus):
        torch.cuda.synchronize(index)
        torch.cuda.reset_peak_memory_stats(index)
    started = time.perf_counter()
    for _ in range(args.steps):
        train_step()
    for index in range(gpus):
        torch.cuda.synchronize(index)
    step_s = (time.perf_counter() - started) / args.steps
    peaks = [torch.cuda.max_memory_allocated(index) / 2**20 for index in range(gpus)]
    return {"peaks_mib": peaks, "step_s": step_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--num-classes", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--batch-per-gpu", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        print(
            f"dp_parallel_loss benchmark needs >= 2 CUDA devices (this machine has {gpus}): nothing measured. "
            "With one GPU (or none) dp_parallel_loss is plain dp.",
            file=sys.stderr,
        )
        return 2
    print(f"{args.arch}, {gpus} GPUs, {args.batch_per_gpu} images per GPU at {args.image_size} px, {args.steps} steps")
    print(f"{'classes':>8} {'mode':>8} {'GPU 0 peak MiB':>15} {'other GPUs max MiB':>19} {'step s':>8}")
    for num_classes in args.num_classes:
        results = {}
        for mode in ("plain", "parallel"):
            result = measure(args, num_classes, parallel=mode == "parallel")
            gc.collect()  # the model, optimizer and batch of this measurement go before the next one
            torch.cuda.empty_cache()
            results[mode] = result
            peaks = result["peaks_mib"]
            print(f"{num_classes:>8} {mode:>8} {peaks[0]:>15.0f} {max(peaks[1:]):>19.0f} {result['step_s']:>8.4f}")
        ratio = results["parallel"]["peaks_mib"][0] / results["plain"]["peaks_mib"][0]
        print(f"{num_classes:>8} GPU 0 peak parallel / plain: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Your own training loop with hpctrain's exact resume: DDP (or FSDP2) on an ImageFolder, against ``hpctrain.task``.

The complete example of docs/your-own-loop.md, and what the tests run:

* as an entry point, ``entrypoint: hpctrain.examples.own_loop:main`` with
  ``entrypoint_args: {data_root: ...}`` (jobs/own_loop_cpu.yaml);
* as a script, ``python -m hpctrain.examples.own_loop --data-root DIR``: alone,
  under ``torchrun``, or as a ``script:`` job. By hand or under ``torchrun``
  its checkpoints and metrics.jsonl go under ``--run-dir`` (``runs/own_loop``,
  which git ignores); run it again to resume there, or name another folder.

A time limit, a preemption, ``hpctrain cancel``, a node lost inside the
allocation: the loop saves at the step every rank agreed on and stops; the
next attempt loads that checkpoint and continues with the same data order, the
same random augmentation and generator states, so it ends with the weights
of an uninterrupted run (bit for bit on the same number of ranks).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain import task
from hpctrain.contract.script_env import RUN_DIR_VAR

REFERENCE_BATCH = 256  # the learning rate is for this global batch (the linear scaling rule)


def tiny_cnn(num_classes: int) -> nn.Module:
    """A small CNN for the CPU tests; GroupNorm, so that nothing depends on the number of ranks."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.GroupNorm(4, 16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.GroupNorm(8, 32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )


def build_model(arch: str, num_classes: int) -> nn.Module:
    if arch == "tiny":
        return tiny_cnn(num_classes)
    import torchvision

    return torchvision.models.get_model(arch, num_classes=num_classes)


def parallelize(model: nn.Module, parallel: str) -> nn.Module:
    """DDP (every rank holds the whole model) or FSDP2 (each rank a shard of every layer with weights)."""
    if not dist.is_initialized():
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.children():
            if any(True for _ in layer.parameters()):
                fully_shard(layer)
        return fully_shard(model)
    return task.ddp(model)  # DDP that sums as it did before a resume (its first gradient buckets kept)


def main(
    ctx: Any = None,
    *,
    data_root: str,
    arch: str = "tiny",
    epochs: int = 3,
    batch_size: int = 8,
    lr: float = 0.1,
    image_size: int = 32,
    workers: int = 0,
    every_steps: int = 2,
    max_steps: int | None = None,
    seed: int = 0,
    parallel: str = "ddp",
) -> dict[str, Any]:
    """Train ``arch`` on ``data_root``/train; ``ctx`` (an entry point's) is not needed: ``task`` finds it."""
    from torchvision import datasets, transforms

    task.init_process_group()  # every rank in one group: from torchrun's variables, or the launcher's (a no-op alone)
    info = task.context()
    torch.manual_seed(seed)  # the same initial weights on every rank
    torch.use_deterministic_algorithms(True)

    augment = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size, scale=(0.35, 1.0)),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
        ]
    )
    dataset = datasets.ImageFolder(str(Path(data_root) / "train"), transform=augment)
    loader = task.ElasticLoader(dataset, batch_size=batch_size, seed=seed, num_workers=workers)
    steps_per_epoch = loader.steps_per_epoch  # the same on any number of ranks
    total_steps = min(epochs * steps_per_epoch, max_steps or epochs * steps_per_epoch)

    model = parallelize(build_model(arch, len(dataset.classes)).to(info.device), parallel)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * loader.global_batch / REFERENCE_BATCH, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    loss_fn = nn.CrossEntropyLoss()

    parts = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "data": loader}
    ckpt = task.Checkpointer(every_steps=every_steps, **parts)
    start = ckpt.load()  # 0 on a fresh run; else the step the last attempt saved
    done = "already done: nothing to train" if start >= total_steps else "resuming" if start else "starting"
    say(info, f"step {start} of {total_steps}: {done} (checkpoints in {ckpt.directory})")
    task.set_summary(epochs=epochs, steps_per_epoch=steps_per_epoch, total_steps=total_steps)  # status --watch
    for step, batches in loader.steps(start, total_steps):
        if task.should_stop():  # every rank gets the same answer at the same step
            ckpt.save(step)
            return task.stopped()
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=info.device)
        with task.phase("forward_backward"):
            for images, targets in task.accumulate(model, batches):  # several only after a lost node
                loss = loss_fn(model(images.to(info.device)), targets.to(info.device)) / len(batches)
                loss.backward()
                step_loss += loss.detach()
        optimizer.step()
        scheduler.step()
        epoch = step // steps_per_epoch
        task.step(step + 1, epoch)
        if dist.is_initialized():
            dist.all_reduce(step_loss)
            step_loss /= dist.get_world_size()
        task.log(step + 1, epoch=epoch, loss=step_loss, lr=scheduler.get_last_lr()[0])
        ckpt.maybe_save(step + 1)
        if (step + 1) % steps_per_epoch == 0 or step + 1 == total_steps:
            say(info, f"step {step + 1} of {total_steps}: epoch {epoch + 1} of {epochs}, loss {float(step_loss):.4f}")
    if ckpt.step != total_steps:
        ckpt.save(total_steps)
    digest = task.weights_sha256(model)  # the same for DDP and FSDP2 (gathered whole)
    task.set_summary(weights_sha256=digest)
    say(info, f"completed at step {total_steps}; weights sha256 {digest[:12]}...; a new run needs a new run folder")
    return {"status": "completed", "global_step": total_steps, "weights_sha256": digest}


def say(info: task.TaskInfo, line: str) -> None:
    """Progress on rank 0's standard output (one line per epoch)."""
    if info.is_main:
        print(f"own_loop: {line}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, help="an ImageFolder root with a train/ folder")
    parser.add_argument("--arch", default="tiny", help="tiny, or a torchvision model name (resnet50)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8, help="per micro-batch (per rank)")
    parser.add_argument("--lr", type=float, default=0.1, help="for a global batch of 256")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--every-steps", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=None, help="stop earlier (a short demo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument(
        "--run-dir",
        default="runs/own_loop",
        help="where checkpoints/ and metrics.jsonl go by hand or under torchrun (a script: job uses its run)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = vars(parse_args())
    run_dir = Path(args.pop("run_dir"))
    if RUN_DIR_VAR not in os.environ:  # by hand or under torchrun: the run is --run-dir (a script: job has its own)
        args["data_root"] = os.path.abspath(args["data_root"])  # before the chdir below
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chdir(run_dir)  # the task API's run directory outside hpctrain is the working directory
    try:
        main(**args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

"""The ImageNet script of HAL's distributed-training tutorial (PyTorch's ``examples/imagenet/main.py``, condensed),
as a user brings it to hpctrain, with what it takes to survive a time limit or a preemption.

The tutorial starts it by hand on every node, once per node::

    python imagenet_ddp.py -a resnet50 --dist-url 'tcp://MASTER_IP:MASTER_PORT' --dist-backend nccl \\
        --multiprocessing-distributed --world-size 2 --rank 0 /path/to/imagenet

(``--world-size`` counts nodes, ``--rank`` is the node's; the script spawns one
worker per GPU with ``mp.spawn``), or once per GPU under
``python -m torch.distributed.launch``, which passes ``--local_rank`` and sets
RANK/WORLD_SIZE/MASTER_* (then leave out ``--multiprocessing-distributed``).
hpctrain starts it the same ways (``jobs/script_imagenet_hal.yaml``, per node;
``script.per: rank`` with ``--local_rank={local_rank}``) and fills the
rendezvous in. To resume, it keeps ``checkpoint.pth.tar`` in its working
directory (hpctrain's run directory): at every epoch's end, and on the stop
signal hpctrain sends (``HPCTRAIN_STOP_SIGNAL``) at the next batch, with its
place in the epoch; a resumed run skips the batches that epoch already trained.
Without CUDA it trains on the CPU over gloo (``--nproc`` workers per node).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms

STOP = {"asked": False}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ImageNet training (HAL tutorial style)")
    parser.add_argument("data", help="ImageFolder root with train/ (and val/)")
    parser.add_argument("-a", "--arch", default="resnet50")
    parser.add_argument("-j", "--workers", type=int, default=4, help="data-loader workers per process")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("-b", "--batch-size", type=int, default=256, help="per node, shared by its workers")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--resume", default="checkpoint.pth.tar", help="also where checkpoints are written")
    parser.add_argument("--world-size", type=int, default=-1, help="nodes (with --multiprocessing-distributed)")
    parser.add_argument("--rank", type=int, default=-1, help="this node's rank (with --multiprocessing-distributed)")
    parser.add_argument("--dist-url", default="env://")
    parser.add_argument("--dist-backend", default="nccl")
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    parser.add_argument("--nproc", type=int, default=1, help="workers per node without CUDA")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help="torch.distributed.launch")
    return parser.parse_args()


def listen_for_stop() -> None:
    """hpctrain's stop signal (TERM unless script.stop_signal says) only sets a flag, read at a batch boundary."""
    name = os.environ.get("HPCTRAIN_STOP_SIGNAL", "TERM")
    signal.signal(getattr(signal, f"SIG{name}"), lambda signum, frame: STOP.update(asked=True))


def main() -> None:
    args = parse()
    listen_for_stop()  # in the parent too: the signal reaches the whole process group, and it waits for its workers
    if args.multiprocessing_distributed:
        per_node = torch.cuda.device_count() or args.nproc
        args.world_size *= per_node  # from nodes to processes, as the tutorial does
        mp.spawn(worker, nprocs=per_node, args=(per_node, args))
    else:  # one process per rank (torch.distributed.launch, torchrun, or hpctrain per rank)
        args.rank, args.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = args.local_rank if args.local_rank is not None else int(os.environ.get("LOCAL_RANK", 0))
        worker(local, 1, args, ranked=True)


def worker(local: int, per_node: int, args: argparse.Namespace, ranked: bool = False) -> None:
    listen_for_stop()
    rank = args.rank if ranked else args.rank * per_node + local
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = args.dist_backend if cuda else "gloo"
    dist.init_process_group(backend, init_method=args.dist_url, world_size=args.world_size, rank=rank)
    model = torchvision.models.__dict__[args.arch]().to(device)
    model = DDP(model, device_ids=[local] if cuda else None)
    batch = max(1, args.batch_size // per_node)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    augment = transforms.Compose(
        [transforms.RandomResizedCrop(args.image_size), transforms.RandomHorizontalFlip(), transforms.ToTensor()]
    )
    dataset = torchvision.datasets.ImageFolder(os.path.join(args.data, "train"), augment)
    sampler = DistributedSampler(dataset, num_replicas=args.world_size, rank=rank)
    start_epoch, start_batch = 0, 0
    if os.path.isfile(args.resume):
        state = torch.load(args.resume, map_location=device, weights_only=True)
        model.module.load_state_dict(state["state_dict"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, start_batch = state["epoch"], state["batch"]
        print(f"rank {rank}: resumed from {args.resume} at epoch {start_epoch}, batch {start_batch}", flush=True)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        skip = start_batch * batch if epoch == start_epoch else 0  # the same order: skip what was trained
        order = list(itertools.islice(iter(sampler), skip, None))
        loader = DataLoader(
            dataset, batch_size=batch, sampler=order, num_workers=args.workers, pin_memory=cuda, drop_last=True
        )  # a last batch of one image breaks BatchNorm
        started = time.time()
        for index, (images, target) in enumerate(loader, start=skip // batch):
            if stop_agreed(device):
                save(rank, model, optimizer, epoch, index, args.resume)
                dist.destroy_process_group()
                return
            loss = criterion(model(images.to(device)), target.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if index % 10 == 0 and rank == 0:
                print(f"epoch {epoch} batch {index} loss {loss.item():.3f} ({time.time() - started:.0f} s)", flush=True)
        save(rank, model, optimizer, epoch + 1, 0, args.resume)
    dist.destroy_process_group()


def stop_agreed(device: torch.device) -> bool:
    """Every rank stops at the same batch, whichever got the signal first."""
    flag = torch.tensor([1.0 if STOP["asked"] else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def save(rank: int, model: DDP, optimizer: torch.optim.Optimizer, epoch: int, batch: int, path: str) -> None:
    if rank == 0:  # one writer; a temp file renamed into place is complete or absent
        state = {"state_dict": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        torch.save({**state, "batch": batch}, path + ".tmp")
        os.replace(path + ".tmp", path)
        print(f"checkpoint: epoch {epoch}, batch {batch} -> {path}", flush=True)


if __name__ == "__main__":
    main()

"""PyTorch's multi-node DDP tutorial script (``ddp-tutorial-series/multinode.py``), as a user brings it to hpctrain.

Written for ``torchrun``: one process per rank reads ``LOCAL_RANK``/``RANK``
from its environment and resumes from its own ``snapshot.pt``. Under hpctrain
it runs unchanged with ``script.per: rank`` (srun starts the ranks) or
``launcher: torchrun``; two additions make it survive time limits and
preemption: it saves when hpctrain's stop signal (``HPCTRAIN_STOP_SIGNAL``)
arrives, at the next step boundary and on every rank at once, and its
snapshot is written atomically. Its working directory is the run directory,
so the relative ``snapshot.pt`` is found again after a requeue.

    hpctrain submit jobs/script_ddp_cpu.yaml          # 2 nodes x 2 CPU ranks (the test cluster)
    hpctrain submit jobs/script_torchrun_hal.yaml     # HAL: torchrun on 2 nodes x 4 V100
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

STOP = {"asked": False}


class RandomRegression(Dataset):
    """The tutorial's toy data: fixed random inputs and targets."""

    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator)) for _ in range(size)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index]


class Trainer:
    def __init__(self, model: torch.nn.Module, data: DataLoader, snapshot: str, save_every: int) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.device = torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")
        self.model = model.to(self.device)
        self.data, self.snapshot, self.save_every = data, snapshot, save_every
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.epochs_run = 0
        if os.path.exists(snapshot):
            self.load(snapshot)
        ids = [self.local_rank] if self.device.type == "cuda" else None
        self.model = DDP(self.model, device_ids=ids)

    def load(self, path: str) -> None:
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["MODEL_STATE"])
        self.optimizer.load_state_dict(state["OPTIMIZER_STATE"])
        self.epochs_run = state["EPOCHS_RUN"]
        print(f"rank {self.global_rank}: resuming from {path} at epoch {self.epochs_run}", flush=True)

    def save(self, epochs_done: int) -> None:
        if self.global_rank == 0:  # one writer; a temp file renamed into place is complete or absent
            state = {
                "MODEL_STATE": self.model.module.state_dict(),
                "OPTIMIZER_STATE": self.optimizer.state_dict(),
                "EPOCHS_RUN": epochs_done,
            }
            torch.save(state, self.snapshot + ".tmp")
            os.replace(self.snapshot + ".tmp", self.snapshot)
            print(f"epoch {epochs_done}: snapshot saved at {self.snapshot}", flush=True)

    def stop_agreed(self) -> bool:
        """Every rank stops at the same step, whichever got the signal."""
        flag = torch.tensor([1.0 if STOP["asked"] else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self.data.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            for source, targets in self.data:
                if self.stop_agreed():
                    # A whole epoch is the unit here: the interrupted one is trained again on resume.
                    self.save(epoch)
                    return
                self.optimizer.zero_grad()
                loss = F.mse_loss(self.model(source.to(self.device)), targets.to(self.device))
                loss.backward()
                self.optimizer.step()
            print(f"rank {self.global_rank}: epoch {epoch} loss {loss.item():.4f}", flush=True)
            if (epoch + 1) % self.save_every == 0:
                self.save(epoch + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description="multi-node DDP, torchrun style")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--snapshot", default="snapshot.pt")
    args = parser.parse_args()
    stop_signal = getattr(signal, "SIG" + os.environ.get("HPCTRAIN_STOP_SIGNAL", "TERM"))
    signal.signal(stop_signal, lambda signum, frame: STOP.update(asked=True))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dataset = RandomRegression(2048)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    Trainer(torch.nn.Linear(20, 1), loader, args.snapshot, args.save_every).train(args.total_epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

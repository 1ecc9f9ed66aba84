"""Samplers: the train order (resumable mid-epoch, elastic over ranks) and exact evaluation shards.

* ``ResumableDistributedSampler``: DistributedSampler's order, plus skipping the
  samples already consumed in the current epoch, in canonical micro-batches that
  keep each step's global batch whatever the number of ranks (docs/preemption.md).
* ``ExactEvalSampler``: every validation sample is seen exactly once over all
  ranks (DistributedSampler pads by repeating samples, which skews accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sized

import torch
from torch.utils.data import Sampler

from hpctrain.jobspec.batch import micro_batch_positions
from hpctrain.jobspec.shares import Part, SharePlan


class ResumableDistributedSampler(Sampler[int]):
    """DistributedSampler's order (same permutation, padding and striding), resumable mid-epoch and elastic.

    ``consumed_samples`` counts samples of the current epoch's global order already
    trained on by all ranks together. Skipping in global order (before sharding)
    makes a resume yield exactly the uninterrupted tail.

    Each step's global batch is ``micro_batches`` canonical micro-batches of ``batch_size``
    (:func:`~hpctrain.jobspec.batch.micro_batch_positions`), a function of (seed, epoch, step)
    alone; the ranks share them as :class:`~hpctrain.jobspec.shares.SharePlan` says (rank ``r``
    of as many ranks as micro-batches: micro-batch ``r``, DistributedSampler's shard). A run
    resumed on fewer ranks keeps its own and accumulates gradients. :meth:`batches` yields
    each step's parts as lists of indices (see :class:`MicroBatchSampler`), :meth:`step_parts`
    what they are.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        batch_size: int = 1,
        micro_batches: int | None = None,
    ) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.dataset_len = len(dataset)
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.batch_size = batch_size
        self.micro_batches = num_replicas
        self.set_micro_batches(micro_batches or num_replicas)
        self.epoch = 0
        self.consumed_samples = 0

    def set_micro_batches(self, micro_batches: int) -> None:
        """Split every step's global batch into ``micro_batches`` (at least one per rank)."""
        if micro_batches < self.num_replicas:
            raise ValueError(f"{micro_batches} micro-batches cannot be shared by {self.num_replicas} ranks")
        self.micro_batches = micro_batches

    @property
    def plan(self) -> SharePlan:
        """Which parts of every step this rank computes."""
        return SharePlan(self.micro_batches, self.num_replicas, self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order; moving to a new epoch forgets the resume offset."""
        if epoch != self.epoch:
            self.consumed_samples = 0
        self.epoch = epoch

    def set_start_batch(self, batches: int, batch_size: int) -> None:
        """Skip the first ``batches`` steps of ``batch_size`` per micro-batch in the current epoch."""
        self.consumed_samples = batches * batch_size * self.micro_batches

    @property
    def start_index(self) -> int:
        """Index into this rank's shard of the uninterrupted epoch where iteration starts (even shares)."""
        return self.consumed_samples // self.micro_batches * (self.micro_batches // self.num_replicas)

    def state_dict(self, batches_done: int = 0, batch_size: int = 0) -> dict[str, int]:
        """Position after ``batches_done`` steps of ``batch_size`` per micro-batch since ``iter()``."""
        consumed = self.consumed_samples + batches_done * batch_size * self.micro_batches
        return {"epoch": self.epoch, "consumed_samples": consumed, "seed": self.seed, "num_replicas": self.num_replicas}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.consumed_samples = int(state["consumed_samples"])

    def _global_order(self) -> list[int]:
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            return torch.randperm(self.dataset_len, generator=generator).tolist()
        return list(range(self.dataset_len))

    def _remaining(self) -> list[int]:
        """The rest of the epoch's global order, cut to whole micro-batch rows, or padded to whole steps.

        Padded, the last step is full: every micro-batch of every step has ``batch_size`` samples, the
        epoch's first ones again at its end (DistributedSampler repeats them to even out the ranks;
        this repeats up to a step less one sample). A short last micro-batch of one image crashed
        BatchNorm in training wherever a feature map is 1x1 (ResNet below 64 px: 65 images, batch 8),
        at the end of every epoch and on every resume; dp and pipeline cut a loader batch smaller still.
        """
        order = self._global_order()
        remaining = order[self.consumed_samples :]
        if self.drop_last:
            return remaining[: len(remaining) // self.micro_batches * self.micro_batches]
        padding = -len(remaining) % (self.micro_batches * self.batch_size)
        if padding and order:
            remaining += (order * math.ceil(padding / len(order)))[:padding]
        return remaining

    def _step_sizes(self) -> tuple[int, int, int]:
        """(steps left in the epoch, samples per micro-batch in a full step, in the last step)."""
        left = max(0, self.dataset_len - self.consumed_samples)
        if not self.drop_last:  # padded to whole steps (see _remaining): every step full
            return math.ceil(left / (self.micro_batches * self.batch_size)), self.batch_size, self.batch_size
        rows = left // self.micro_batches
        steps = math.ceil(rows / self.batch_size)
        return steps, self.batch_size, rows - (steps - 1) * self.batch_size if steps else 0

    def step_parts(self) -> Iterator[list[Part]]:
        """This rank's parts of every step left in the epoch, in the order :meth:`batches` yields them."""
        steps, full, last = self._step_sizes()
        plan = self.plan
        for step in range(steps):
            yield plan.parts(self.rank, last if step == steps - 1 else full)

    def batches(self) -> Iterator[list[int]]:
        """This rank's parts of every step (micro-batches, or pieces of them) as lists of dataset indices."""
        remaining = self._remaining()
        size, count = self.batch_size, self.micro_batches
        for step, parts in enumerate(self.step_parts()):
            for part in parts:
                positions = micro_batch_positions(
                    step, part.micro_batch, micro_batches=count, batch_size=size, length=len(remaining)
                )
                yield [remaining[p] for p in positions[part.start : part.stop]]

    def steps_len(self) -> int:
        """How many steps are left in the epoch."""
        return self._step_sizes()[0]

    def batches_len(self) -> int:
        """How many lists :meth:`batches` yields."""
        return self._count(lambda parts: len(parts))

    def _count(self, per_step: Callable[[list[Part]], int]) -> int:
        steps, full, last = self._step_sizes()
        if not steps:
            return 0
        plan = self.plan
        return (steps - 1) * per_step(plan.parts(self.rank, full)) + per_step(plan.parts(self.rank, last))

    def __iter__(self) -> Iterator[int]:
        return (index for batch in self.batches() for index in batch)

    def __len__(self) -> int:
        return self._count(lambda parts: sum(part.samples for part in parts))


class MicroBatchSampler(Sampler[list[int]]):
    """The train loader's batch sampler: one canonical micro-batch per loader batch."""

    def __init__(self, sampler: ResumableDistributedSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler.batches()

    def __len__(self) -> int:
        return self.sampler.batches_len()


class ExactEvalSampler(Sampler[int]):
    """A contiguous shard per rank, no padding: the shards partition the dataset exactly.

    Ranks may get different counts (differing by at most one), so the loop must
    all-reduce correct and sample counts rather than average per-rank accuracy.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        total = len(dataset)
        self.start = rank * total // num_replicas
        self.stop = (rank + 1) * total // num_replicas

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start

"""Which rank computes which part of every step's global batch, on any number of ranks up to its micro-batches.

A run's step is ``micro_batches`` (M) canonical micro-batches (``jobspec/batch.py``); on W ranks
(W <= M) rank r computes the whole micro-batches r, r + W, ..., r + (q-1)W (q = M // W), and the
R = M % W left over are each split into pieces over a group of ranks: W // R or W // R + 1
consecutive ranks, at most one per sample. A rank computes its piece first, then its whole
micro-batches, and divides each part's mean loss so that the average over the ranks (DDP's) is
the mean over the whole global batch: part p of a micro-batch of n samples holding c of them has
the divisor (M / W) * (n / c). BatchNorm in a piece takes its statistics over the whole
micro-batch, from every rank of its group (``trainer/split_norm.py``); so a step's gradient is
the uninterrupted run's up to summation order (docs/preemption.md, "Any number of nodes").

With W == M every rank computes its own micro-batch whole, exactly as a run that never changed
shape (no pieces, no groups, divisor 1); with W dividing M, M / W whole micro-batches each.
A step whose micro-batches hold fewer samples than a group has ranks (a sampler that cuts an
epoch to whole rows; the trainer fills its last step up) computes each left-over micro-batch
whole on its group's first rank instead.

Pure and torch-free: the sampler, the trainer, ``validate`` and the benchmarks all ask it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Part:
    """Samples ``start:stop`` (in its order) of canonical micro-batch ``micro_batch``, which holds ``size``."""

    micro_batch: int
    start: int
    stop: int
    size: int
    group: int | None = None  # the split group whose ranks share this micro-batch; None: computed whole

    @property
    def samples(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class SharePlan:
    """How ``ranks`` ranks share ``micro_batches`` canonical micro-batches of up to ``batch_size`` samples."""

    micro_batches: int
    ranks: int
    batch_size: int

    def __post_init__(self) -> None:
        if not 1 <= self.ranks <= self.micro_batches or self.batch_size < 1:
            raise ValueError(f"{self.ranks} ranks cannot share {self.micro_batches} micro-batches")

    @property
    def whole_per_rank(self) -> int:
        """q: the whole micro-batches every rank computes in every step."""
        return self.micro_batches // self.ranks

    @cached_property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The ranks sharing each left-over micro-batch (micro-batch ``q * ranks + index``), consecutive ranks.

        Sizes as even as possible, capped at ``batch_size`` (a piece holds at least one sample of a full step).
        """
        left = self.micro_batches % self.ranks
        if left == 0:
            return ()
        base, extra = divmod(self.ranks, left)
        groups, first = [], 0
        for index in range(left):
            size = min(self.batch_size, base + (index < extra))
            groups.append(tuple(range(first, first + size)))
            first += size
        return tuple(groups)

    @property
    def split(self) -> bool:
        """Whether any micro-batch is split over several ranks (BatchNorm then needs the group's statistics)."""
        return any(len(group) > 1 for group in self.groups)

    def group_of(self, rank: int) -> int | None:
        """The index of the group ``rank`` belongs to; None when it computes only whole micro-batches."""
        for index, group in enumerate(self.groups):
            if rank in group:
                return index
        return None

    def parts(self, rank: int, size: int | None = None) -> list[Part]:
        """``rank``'s parts of a step whose micro-batches hold ``size`` samples (default: ``batch_size``), in order.

        A piece comes first: the last part's backward is the one that all-reduces (DDP), and a piece's
        BatchNorm exchanges statistics inside its group, which must not interleave with that all-reduce.
        """
        size = self.batch_size if size is None else size
        q, ranks = self.whole_per_rank, self.ranks
        whole = [Part(rank + k * ranks, 0, size, size) for k in range(q)]
        index = self.group_of(rank)
        if index is None:
            return whole
        group = self.groups[index]
        micro_batch, place = q * ranks + index, group.index(rank)
        if len(group) == 1 or size < len(group):  # alone, or too few samples to split: its first rank computes it
            return [*whole, Part(micro_batch, 0, size, size)] if place == 0 else whole
        count = len(group)
        piece = Part(micro_batch, place * size // count, (place + 1) * size // count, size, group=index)
        return [piece, *whole]

    def loss_divisor(self, part: Part) -> float:
        """What ``part``'s mean loss is divided by, so that the mean over the ranks is the global batch's mean.

        1 on a run that never changed shape; M / W for a whole micro-batch (as integers divide, exactly).
        """
        per_rank = self.micro_batches / self.ranks
        return per_rank if part.samples == part.size else per_rank * part.size / part.samples

    def step_cost(self) -> float:
        """The slowest rank's samples in a full step, in micro-batches of ``batch_size`` (the step's length).

        1.0 on a run that never changed shape; the throughput on these ranks is 1 / step_cost of that
        run's (the ideal is ranks / micro_batches).
        """
        return max(sum(part.samples for part in self.parts(rank)) for rank in range(self.ranks)) / self.batch_size


def describe_parts(parts: list[Part]) -> str:
    """E.g. ``2 whole micro-batches`` or ``1 whole micro-batch and 3 of the 8 samples of micro-batch 5``."""
    whole = sum(1 for part in parts if part.samples == part.size)
    text = f"{whole} whole micro-batch{'es' * (whole != 1)}"
    for part in parts:
        if part.samples != part.size:
            text += f" and {part.samples} of the {part.size} samples of micro-batch {part.micro_batch}"
    return text

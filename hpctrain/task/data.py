"""A user's dataset in the trainer's exact, elastic order: :class:`ElasticLoader`.

The order is the built-in trainer's (``samplers.py``): every step's global
batch is ``micro_batches`` canonical micro-batches of ``batch_size`` samples,
a function of (seed, epoch, step) alone. Rank ``r`` of ``R`` computes
micro-batches ``r, r + R, ...`` of each step, so on the ranks a run started
with each computes one, and after a resume on fewer ranks (a node lost with
``min_nodes``) each computes several and accumulates their gradients
(:func:`accumulate`): the global batches, and so the weights up to summation
order, are those of the uninterrupted run.

The loader's position is the loop's step: ``steps(start)`` yields
``(step, micro_batches)`` from global step ``start`` on, across epochs, so
resuming is ``loader.steps(checkpointer.load())``. Registered with the
checkpointer, it saves the run's ``micro_batches`` and checks on load that the
dataset and batch are the run's.

``seeded_samples`` (on by default) runs each ``dataset[i]`` with Python's,
NumPy's and torch's generators seeded from (seed, epoch, i): random
augmentation is then the same whatever the worker count, rank layout or resume.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import threading
from collections.abc import Callable, Iterator, Sized
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from hpctrain.contract.script_env import RUN_MICRO_BATCHES_VAR, STOP_SIGNAL_VAR
from hpctrain.errors import CheckpointError
from hpctrain.jobspec.batch import MAX_ACCUMULATION, micro_batch_problem
from hpctrain.runtime.child_stacks import answer_stack_requests
from hpctrain.runtime.stop_signals import obey_only_parent
from hpctrain.runtime.worker_fork import forking_workers
from hpctrain.task.process_group import require_group
from hpctrain.task.samplers import MicroBatchSampler, ResumableDistributedSampler
from hpctrain.task.session import context

_MIX = 0x9E3779B97F4A7C15


class ElasticLoader:
    """A DataLoader over ``dataset`` in the trainer's elastic order, positioned by the loop's step (module doc).

    ``loader_kwargs`` go to ``torch.utils.data.DataLoader`` (``num_workers``, ``pin_memory``,
    ``collate_fn``, ...); ``sampler``, ``batch_size`` and ``shuffle`` are this class's.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        seeded_samples: bool = True,
        micro_batches: int | None = None,
        **loader_kwargs: Any,
    ) -> None:
        require_group("hpctrain.task.ElasticLoader")
        info = context()
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 (got {batch_size})")
        self.dataset_len = len(dataset)  # type: ignore[arg-type]
        self.batch_size, self.seed, self.shuffle, self.drop_last = batch_size, seed, shuffle, drop_last
        run_micro_batches = int(os.environ.get(RUN_MICRO_BATCHES_VAR) or info.world_size)
        self.sampler = ResumableDistributedSampler(
            _Length(self.dataset_len), info.world_size, info.rank, shuffle, seed, drop_last, batch_size=batch_size
        )
        self.set_micro_batches(micro_batches or run_micro_batches)
        self._tags = _TaggedBatches(MicroBatchSampler(self.sampler), tagged=seeded_samples)
        kwargs = {"generator": torch.Generator().manual_seed(seed), **loader_kwargs}
        kwargs["worker_init_fn"] = functools.partial(_init_worker, loader_kwargs.get("worker_init_fn"))
        if kwargs.get("num_workers", 0) > 0:  # forked by name, as the trainer's ForkedLoader (loader_workers.py)
            kwargs.setdefault("multiprocessing_context", "fork")
        source = _SeededSamples(dataset, seed) if seeded_samples else dataset
        self.loader = DataLoader(source, batch_sampler=self._tags, **kwargs)

    # -- shape -------------------------------------------------------------------------------------------------------
    @property
    def micro_batches(self) -> int:
        """Micro-batches in every step's global batch (the run's; kept across a resume on fewer ranks)."""
        return self.sampler.micro_batches

    @property
    def accumulation(self) -> int:
        """Micro-batches this rank computes per step: 1 on the ranks the run started with."""
        return self.sampler.micro_batches // self.sampler.num_replicas

    @property
    def global_batch(self) -> int:
        return self.micro_batches * self.batch_size

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch (the same on any number of ranks)."""
        consumed, self.sampler.consumed_samples = self.sampler.consumed_samples, 0
        try:
            return self.sampler.steps_len()
        finally:
            self.sampler.consumed_samples = consumed

    def epoch_of(self, step: int) -> int:
        """The (0-based) epoch global step ``step`` belongs to."""
        return step // self.steps_per_epoch

    def set_micro_batches(self, micro_batches: int) -> None:
        ranks = self.sampler.num_replicas
        problem = micro_batch_problem(micro_batches, ranks, strategy="ddp")
        if problem is None and micro_batches % ranks:
            # The trainer shares uneven pieces with an exactly weighted reduction (jobspec/shares.py);
            # a user's loop averages whole micro-batches, so each rank must get as many as the others.
            can = ", ".join(str(k) for k in range(1, micro_batches + 1) if micro_batches % k == 0)
            problem = (
                f"{micro_batches} micro-batches cannot be shared equally by {ranks} ranks; rank counts that can: {can}"
            )
        if problem is not None:
            raise CheckpointError(
                f"ElasticLoader: {problem}",
                hint=f"run on a number of ranks that divides {micro_batches}",
            )
        self.sampler.set_micro_batches(micro_batches)

    # -- iterating ---------------------------------------------------------------------------------------------------
    def steps(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, list[Any]]]:
        """``(step, micro_batches)`` for global steps ``start``, ``start + 1``, ... (before ``stop``), across epochs.

        ``micro_batches`` is this rank's share of the step's global batch, as the DataLoader collates
        them: a list of one batch on the ranks the run started with.
        """
        per_epoch, step = self.steps_per_epoch, start
        while stop is None or step < stop:
            epoch, offset = divmod(step, per_epoch)
            self.sampler.set_epoch(epoch)
            self.sampler.set_start_batch(offset, self.batch_size)
            self._tags.epoch = epoch
            with forking_workers(self.loader.num_workers):  # a frozen heap, the stop signals held (worker_fork.py)
                batches = iter(self.loader)
            try:
                for _ in range(per_epoch - offset):
                    yield step, [next(batches) for _ in range(self.accumulation)]
                    step += 1
                    if stop is not None and step >= stop:
                        return
            finally:
                del batches  # shuts its workers down unless they persist

    # -- checkpoint state --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The run's batch shape and order (the position is the loop's step)."""
        return {
            "micro_batches": self.micro_batches,
            "batch_size": self.batch_size,
            "dataset_len": self.dataset_len,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep the checkpoint's global batch; refuse another dataset or batch size (the order would change),
        and a batch shape no run of this loader could have saved (the checkpoint is untrusted input)."""
        if not isinstance(state, dict):
            raise CheckpointError(f"ElasticLoader: the checkpoint's state is a {type(state).__name__}, not a dict")
        changed = [
            f"{key} {state.get(key)!r} -> {getattr(self, key)!r}"
            for key in ("batch_size", "dataset_len", "seed", "shuffle", "drop_last")
            if state.get(key) != getattr(self, key)
        ]
        if changed:
            raise CheckpointError(
                "ElasticLoader: the checkpoint's data order does not continue here: " + ", ".join(changed),
                hint="resume with the dataset, batch size and seed the run started with, or start a new run",
            )
        micro_batches = state.get("micro_batches")
        most = max(MAX_ACCUMULATION * self.sampler.num_replicas, self.micro_batches)
        if type(micro_batches) is not int or not 1 <= micro_batches <= most:
            raise CheckpointError(
                f"ElasticLoader: the checkpoint's micro_batches {micro_batches!r} is not a step this run could "
                f"have taken (1 to {most} on {self.sampler.num_replicas} ranks)",
                hint="it is not this run's checkpoint (or was crafted); move it away",
            )
        self.set_micro_batches(micro_batches)


def accumulate(model: nn.Module, batches: list[Any]) -> Iterator[Any]:
    """Each micro-batch of a step, with the gradient all-reduce only in the last one's backward.

    ``for x, y in task.accumulate(ddp_model, batches): (loss_fn(ddp_model(x), y) / len(batches)).backward()``
    -- dividing by ``len(batches)`` keeps the gradient the mean over the global batch (DDP averages over ranks).
    Works with DDP (``no_sync``) and FSDP2 (``set_requires_gradient_sync``); other models just iterate.
    """
    for index, batch in enumerate(batches):
        last = index == len(batches) - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
            yield batch
        else:
            sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
            with sync:
                yield batch


def worker_init(worker_id: int) -> None:
    """A data-loader worker drops the job's stop signal (its process decides when workers end).

    Slurm and hpctrain signal a task's whole process group; a worker that died of the signal would
    make the loop fail before it saves. Its process's SIGTERM (the loader's ``terminate()`` of a
    slow worker, and ``multiprocessing``'s at the process's exit, which then waits for the worker)
    still ends it, and it exits with its parent. Workers are forked with the stop signals held
    (``ElasticLoader.steps``), so one sent before this ran is judged here too. A hung rank's watchdog
    asks its workers for their stacks (SIGQUIT: ``runtime/child_stacks.py``), as the trainer's.
    """
    name = os.environ.get(STOP_SIGNAL_VAR, "TERM").strip().upper().removeprefix("SIG")
    answer_stack_requests()  # the hang watchdog's request: this worker's stacks into the task's log
    obey_only_parent({signal.SIGTERM, getattr(signal, f"SIG{name}", signal.SIGTERM)})
    parent = os.getppid()

    def exit_with_parent() -> None:  # what torch's own SIGTERM handling did for a dead parent
        while True:
            if os.getppid() != parent:
                os._exit(0)
            threading.Event().wait(5.0)

    threading.Thread(target=exit_with_parent, name="exit-with-parent", daemon=True).start()


def _init_worker(then: Callable[[int], None] | None, worker_id: int) -> None:
    worker_init(worker_id)
    if then is not None:  # the caller's own worker_init_fn, after ours
        then(worker_id)


class _Length(Sized):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


class _TaggedBatches(Sampler[list[Any]]):
    """The micro-batch sampler's index lists, each index as ``(epoch, index)`` when samples are seeded."""

    def __init__(self, batches: MicroBatchSampler, *, tagged: bool) -> None:
        self.batches, self.tagged, self.epoch = batches, tagged, 0

    def __iter__(self) -> Iterator[list[Any]]:
        for batch in self.batches:
            yield [(self.epoch, index) for index in batch] if self.tagged else batch

    def __len__(self) -> int:
        return len(self.batches)


class _SeededSamples(Dataset):
    """``dataset[i]`` with every generator seeded from (seed, epoch, i); the caller's generators are restored."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        seed = (self.seed * _MIX + epoch * 1_000_003 + index) % (2**63)
        python, numpy = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
            try:
                return self.dataset[index]
            finally:
                random.setstate(python)
                np.random.set_state(numpy)

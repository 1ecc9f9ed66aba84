"""ImageFolder datasets and loaders: fast, resumable order and augmentation, exact evaluation.

The package: ``augment`` (crop boxes, pure functions), ``index`` (one scan of the
tree per job), ``decode`` (header size, DCT-scaled decode), ``datasets`` (train
and val samples as uint8, bad files replaced and counted), ``device_input``
(uint8 -> normalised float on the device). This module wires them to loaders.
What differs from the pytorch/examples ImageNet loader, so that a requeued job
continues exactly where it stopped and evaluation is exact:

* ``TrainImages``: each sample's random crop/flip is a pure function of
  (seed, epoch, sample index), whatever the worker count or rank layout.
* ``ResumableDistributedSampler``: DistributedSampler's order, plus skipping the
  samples already consumed in the current epoch, in canonical micro-batches that
  keep each step's global batch whatever the number of ranks (docs/preemption.md).
* ``ExactEvalSampler``: every validation sample is seen exactly once over all
  ranks (DistributedSampler pads by repeating samples, which skews accuracy).

Call ``Loaders.set_epoch(epoch)`` before iterating each epoch.
"""

from __future__ import annotations

import functools
import math
import os
import random
import signal
import threading
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torchvision import transforms

from hpctrain.dataset import mount, squashfs
from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.batch import micro_batch_positions, rank_micro_batches
from hpctrain.jobspec.models import Data, Trainer
from hpctrain.trainer.data.datasets import TrainImages, ValImages
from hpctrain.trainer.data.decode import jpeg_decoder
from hpctrain.trainer.data.device_decode import (
    DeviceBackend,
    EncodedCollate,
    EncodedTrainImages,
    EncodedValImages,
    resolve_decoder,
)
from hpctrain.trainer.data.index import DatasetIndex, IndexError_, cached_index, shared_index, torch_broadcast
from hpctrain.trainer.data.staging import resolve_stage_dir, stage_dataset, staged_index

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_MAKE_DATASET_HINT = (
    "point data.root at an ImageFolder dataset (ROOT/train/<class>/*.jpg and ROOT/val/<class>/*.jpg), "
    "or create a small test dataset with `hpctrain make-dataset DIR`"
)


def train_transform(image_size: int) -> transforms.Compose:
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def val_transform(image_size: int, resize: int) -> transforms.Compose:
    return transforms.Compose(
        [
            transforms.Resize(resize),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


class ResumableDistributedSampler(Sampler[int]):
    """DistributedSampler's order (same permutation, padding and striding), resumable mid-epoch and elastic.

    ``consumed_samples`` counts samples of the current epoch's global order already
    trained on by all ranks together. Skipping in global order (before sharding)
    makes a resume yield exactly the uninterrupted tail.

    Each step's global batch is ``micro_batches`` canonical micro-batches of ``batch_size``
    (:func:`~hpctrain.jobspec.batch.micro_batch_positions`), a function of (seed, epoch, step)
    alone; rank ``r`` of ``num_replicas`` takes micro-batches ``r, r + num_replicas, ...``
    of every step. ``micro_batches`` defaults to ``num_replicas`` (one each: DistributedSampler's
    shards); a run resumed on fewer ranks keeps its own and accumulates gradients.
    :meth:`batches` yields the micro-batches as lists of indices (see :class:`MicroBatchSampler`).
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
        """Split every step's global batch into ``micro_batches`` (a multiple of the ranks)."""
        if micro_batches < 1 or micro_batches % self.num_replicas:
            raise ValueError(f"{micro_batches} micro-batches cannot be shared by {self.num_replicas} ranks")
        self.micro_batches = micro_batches

    @property
    def per_rank(self) -> int:
        """Micro-batches this rank computes per step (gradient accumulation when more than one)."""
        return self.micro_batches // self.num_replicas

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
        """Index into this rank's shard of the uninterrupted epoch where iteration starts."""
        return self.consumed_samples // self.micro_batches * self.per_rank

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
        """The rest of the epoch's global order, cut or padded to whole micro-batch rows."""
        order = self._global_order()
        remaining = order[self.consumed_samples :]
        if self.drop_last:
            return remaining[: len(remaining) // self.micro_batches * self.micro_batches]
        padding = -len(remaining) % self.micro_batches
        if padding and order:
            remaining += (order * math.ceil(padding / len(order)))[:padding]
        return remaining

    def batches(self) -> Iterator[list[int]]:
        """This rank's micro-batches, step by step, each step's in micro-batch order."""
        remaining = self._remaining()
        mine = rank_micro_batches(self.rank, self.num_replicas, self.micro_batches)
        size, count = self.batch_size, self.micro_batches
        for step in range(math.ceil(len(remaining) / (count * size))):
            for j in mine:
                positions = micro_batch_positions(step, j, micro_batches=count, batch_size=size, length=len(remaining))
                yield [remaining[p] for p in positions]

    def batches_len(self) -> int:
        """How many micro-batches :meth:`batches` yields."""
        rows = len(self) * self.num_replicas // self.micro_batches  # samples per micro-batch over the epoch's rest
        return math.ceil(rows / self.batch_size) * self.per_rank

    def __iter__(self) -> Iterator[int]:
        return (index for batch in self.batches() for index in batch)

    def __len__(self) -> int:
        remaining = max(0, self.dataset_len - self.consumed_samples)
        if self.drop_last:
            return remaining // self.micro_batches * self.per_rank
        return math.ceil(remaining / self.micro_batches) * self.per_rank


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


def build_datasets(
    data_spec: Data,
    *,
    train: bool = True,
    seed: int = 0,
    is_leader: bool = True,
    broadcast: object | None = None,
) -> tuple[TrainImages | None, ValImages]:
    """(train, val); train is None when ``train`` is False (evaluate-only).

    ``train[i]`` is one sample as the trainer consumes it: (uint8 CHW tensor, label).
    With ``broadcast`` (see ``index.shared_index``) only the leader scans the tree.
    """
    root = _dataset_root(data_spec)
    jpeg_decoder()  # HPCTRAIN_JPEG_DECODER names a decoder this machine has, or the task stops here with the fix
    packed = None
    if squashfs.is_image(root):
        root = packed = _open_image(root, data_spec)
    if data_spec.val_resize < data_spec.image_size:
        raise TrainingConfigError(
            f"data.val_resize: {data_spec.val_resize} is smaller than data.image_size {data_spec.image_size}",
            hint=f"set data.val_resize >= data.image_size (the reference uses 256 for 224, i.e. "
            f"{round(data_spec.image_size * 256 / 224)})",
        )
    share = {"is_leader": is_leader, "broadcast": broadcast, "cache_dir": data_spec.index_cache_dir, "packed": packed}
    val_index = _split_index(root, data_spec.val_dir, "data.val_dir", share)
    train_index = _split_index(root, data_spec.train_dir, "data.train_dir", share) if train else None
    if data_spec.stage == "node" and packed is None:
        val_index, train_index = _stage(root, data_spec, val_index, train_index)
    limit = data_spec.max_image_pixels
    val = ValImages(val_index, data_spec.image_size, data_spec.val_resize, max_pixels=limit)
    if train_index is None:
        return None, val
    if train_index.classes != val_index.classes:
        only_train = sorted(set(train_index.classes) - set(val_index.classes))[:5]
        only_val = sorted(set(val_index.classes) - set(train_index.classes))[:5]
        raise TrainingConfigError(
            f"data.val_dir: the class folders of {root / data_spec.val_dir} differ from {root / data_spec.train_dir} "
            f"(only in train: {only_train}, only in val: {only_val})",
            hint="train and val need the same class folders, or labels would not match",
        )
    return TrainImages(train_index, data_spec.image_size, seed, max_pixels=limit), val


def build_val_loader(
    val_dataset: Dataset,
    data_spec: Data,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    device_is_cuda: bool,
    seed: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> DataLoader:
    """Validation over the whole val set, sharded without padding (see ExactEvalSampler)."""
    sampler = ExactEvalSampler(val_dataset, world_size, rank)
    kwargs = _loader_kwargs(data_spec, device_is_cuda, seed)
    return DataLoader(val_dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn, **kwargs)


@dataclass
class Loaders:
    """What the training loop needs from the data side."""

    train_loader: DataLoader | None
    val_loader: DataLoader
    train_sampler: ResumableDistributedSampler | None
    train_dataset: TrainImages | None
    num_classes: int
    class_names: list[str]

    def skipped_samples(self) -> int:
        """Samples this process (and its workers) skipped because their file could not be decoded
        (replaced in training, left out of validation)."""
        datasets = [self.train_dataset, getattr(self.val_loader, "dataset", None)]
        return sum(d.skipped_samples for d in datasets if d is not None and hasattr(d, "skipped_samples"))

    def set_epoch(self, epoch: int) -> None:
        """Call before iterating an epoch: picks its shuffle order and augmentation."""
        if self.train_sampler is not None:
            self.train_sampler.set_epoch(epoch)
        if self.train_dataset is not None:
            self.train_dataset.set_epoch(epoch)


def build_loaders(
    data_spec: Data,
    trainer_spec: Trainer,
    *,
    rank: int,
    world_size: int,
    device_is_cuda: bool,
    epoch_seed: int,
    batch_size: int,
    train_shard: tuple[int, int] | None = None,
) -> Loaders:
    """Train and val loaders for one rank.

    ``epoch_seed`` seeds the shuffle order, the augmentation and the worker RNGs
    (pass ``trainer.seed``); it is the same on every rank. ``batch_size`` is the
    per-process batch (``BatchLayout.per_process``), for train and val alike.
    ``train_shard`` (shard, shards) splits the train set other than over the
    ranks (ps: over the worker tasks only); validation is always over all ranks.
    """
    broadcast = torch_broadcast if world_size > 1 and _in_process_group(rank, world_size) else None
    train_ds, val_ds = build_datasets(
        data_spec, train=not trainer_spec.evaluate_only, seed=epoch_seed, is_leader=rank == 0, broadcast=broadcast
    )
    device = torch.device("cuda") if device_is_cuda else torch.device("cpu")
    collate = val_collate = None
    if (decoder := resolve_decoder(data_spec.decode, device)) != "cpu":
        train_ds, val_ds, collate, val_collate = encoded_datasets(train_ds, val_ds, data_spec, decoder)
    elif rank == 0:
        print(f"hpctrain: data: loader workers decode JPEGs with {jpeg_decoder()}", flush=True)
    val_loader = build_val_loader(
        val_ds,
        data_spec,
        rank=rank,
        world_size=world_size,
        batch_size=batch_size,
        device_is_cuda=device_is_cuda,
        seed=epoch_seed + 1,
        collate_fn=val_collate,
    )
    class_names = list((train_ds or val_ds).classes)
    if train_ds is None:
        return Loaders(None, val_loader, None, None, len(class_names), class_names)
    shard, shards = train_shard if train_shard is not None else (rank, world_size)
    sampler = ResumableDistributedSampler(train_ds, shards, shard, shuffle=True, seed=epoch_seed, batch_size=batch_size)
    train_loader = DataLoader(
        train_ds,
        batch_sampler=MicroBatchSampler(sampler),
        collate_fn=collate,
        **_loader_kwargs(data_spec, device_is_cuda, epoch_seed),
    )
    return Loaders(train_loader, val_loader, sampler, train_ds, len(class_names), class_names)


def encoded_datasets(
    train: TrainImages | None, val: ValImages, data_spec: Data, decoder: DeviceBackend
) -> tuple[EncodedTrainImages | None, EncodedValImages, EncodedCollate, EncodedCollate]:
    """The same samples and crops, as bytes + boxes for decoding on the device (data.decode gpu/dali)."""
    val_encoded = EncodedValImages(val.index, val.image_size, val.resize, val.seed, val.max_pixels)
    train_encoded = (
        None if train is None else EncodedTrainImages(train.index, train.image_size, train.seed, train.max_pixels)
    )
    limit = data_spec.max_image_pixels
    train_collate = EncodedCollate(data_spec.image_size, decoder, max_pixels=limit)
    val_collate = EncodedCollate(data_spec.image_size, decoder, resize=data_spec.val_resize, max_pixels=limit)
    return train_encoded, val_encoded, train_collate, val_collate


def seed_worker(worker_id: int) -> None:
    """Seed Python and NumPy from the per-worker torch seed the DataLoader chose; keep Slurm's SIGTERM out."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)
    obey_only_parent_sigterm()


def obey_only_parent_sigterm() -> None:
    """In a data-loader worker: exit on the parent's SIGTERM, as torch does, and ignore anyone else's.

    Slurm's proctrack/linuxproc (and pgid) sends a job's SIGTERM (scancel,
    ``hpctrain cancel``, preemption, time limit) to every process of a task,
    workers included. torch's worker handler dies of a SIGTERM its parent did
    not send, and the main process then raises "DataLoader worker ... is
    killed by signal: Terminated" wherever it is, before it can save its stop
    checkpoint. The main process decides when its workers end: it shuts them
    down (terminating a slow one), or they exit when it is gone.
    """
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # never fatal, whichever thread gets it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit the mask

    def filter_sigterm() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
                os._exit(0)

    threading.Thread(target=filter_sigterm, name="sigterm-filter", daemon=True).start()


def _loader_kwargs(data_spec: Data, device_is_cuda: bool, seed: int) -> dict[str, Any]:
    generator = torch.Generator()
    generator.manual_seed(seed)
    kwargs: dict[str, Any] = {
        "num_workers": data_spec.workers,
        "pin_memory": data_spec.pin_memory and device_is_cuda,
        "generator": generator,
        "worker_init_fn": seed_worker,
    }
    if data_spec.workers > 0:
        kwargs["persistent_workers"] = data_spec.persistent_workers
        kwargs["prefetch_factor"] = data_spec.prefetch_factor
    return kwargs


def _dataset_root(data_spec: Data) -> Path:
    if data_spec.root is None:
        raise TrainingConfigError(
            "data.root: no dataset root is set (neither in the spec nor in the cluster profile)",
            hint=_MAKE_DATASET_HINT,
        )
    root = Path(data_spec.root).expanduser()
    if not root.is_dir() and not squashfs.is_image(root):
        raise TrainingConfigError(f"data.root: {root} does not exist or is not a directory", hint=_MAKE_DATASET_HINT)
    return root


def _open_image(image: Path, data_spec: Data) -> Path:
    """Where the packed image's tree is: Apptainer's image-backed bind, else the node's squashfuse mount."""
    bound = os.environ.get(squashfs.BIND_ENV)
    if bound and Path(bound).is_dir():
        print(f"hpctrain: data: reading the image {image} bound by the container at {bound}", flush=True)
        return Path(bound)
    try:
        point = mount.open_image(
            image,
            resolve_stage_dir(data_spec.stage_dir, os.environ),
            is_node_leader=int(os.environ.get("LOCAL_RANK", "0")) == 0,
            stage=data_spec.stage == "node",
        )
    except squashfs.ImageError as exc:
        raise TrainingConfigError(f"data.root: {exc.message}", hint=exc.hint) from exc
    print(f"hpctrain: data: reading the image {image} mounted at {point}", flush=True)
    return point


def _stage(
    root: Path, data_spec: Data, val_index: DatasetIndex, train_index: DatasetIndex | None
) -> tuple[DatasetIndex, DatasetIndex | None]:
    """Both splits read from the node-local copy (see ``staging``)."""
    splits = [(data_spec.val_dir, val_index)] + ([(data_spec.train_dir, train_index)] if train_index else [])
    staged = stage_dataset(
        root,
        splits,
        resolve_stage_dir(data_spec.stage_dir, os.environ),
        is_node_leader=int(os.environ.get("LOCAL_RANK", "0")) == 0,
        readers=data_spec.stage_readers,
    )
    print(f"hpctrain: data: reading the staged copy in {staged}", flush=True)
    val_staged = staged_index(val_index, staged / data_spec.val_dir)
    return val_staged, staged_index(train_index, staged / data_spec.train_dir) if train_index else None


def _in_process_group(rank: int, world_size: int) -> bool:
    """True when (rank, world_size) are the default group's: hogwild's worker processes have their own."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return dist.get_world_size() == world_size and dist.get_rank() == rank


def _split_index(root: Path, subdir: str, key: str, share: dict[str, Any]) -> DatasetIndex:
    path = root / subdir
    if not path.is_dir():
        raise TrainingConfigError(
            f"{key}: {path} does not exist (data.root is {root}, data.{key.split('.')[1]} is {subdir!r})",
            hint=_MAKE_DATASET_HINT,
        )
    packed, share = share.get("packed"), {k: v for k, v in share.items() if k != "packed"}
    if packed is not None:  # the leader reads the index stored in the image: nothing to list
        share["load"] = lambda: _packed_split(packed, subdir) or cached_index(path, share["cache_dir"])
    try:
        return shared_index(path, **share)
    except IndexError_ as exc:
        raise TrainingConfigError(
            f"{key}: {path} is not a usable ImageFolder: {exc}", hint=exc.hint or _MAKE_DATASET_HINT
        ) from None


@functools.cache
def _packed_splits(point: Path) -> dict[str, Any]:
    try:
        return (mount.packed_index(point) or {}).get("splits", {})
    except squashfs.ImageError as exc:  # every rank must raise it (see shared_index), not only the leader
        raise IndexError_(exc.message, hint=exc.hint) from exc


def _packed_split(point: Path, subdir: str) -> DatasetIndex | None:
    split = _packed_splits(point).get(subdir)
    if split is None:
        return None
    samples = [(rel, int(label)) for rel, label in split["samples"]]
    return DatasetIndex(str(point / subdir), list(split["classes"]), samples, list(split.get("empty_classes", [])))

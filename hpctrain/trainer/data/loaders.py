"""Loaders for one rank: datasets, samplers and worker settings wired together.

Call ``Loaders.set_epoch(epoch)`` before iterating each epoch. With
``data.decode: gpu``/``dali`` the datasets hand over bytes and crop boxes
(:func:`encoded_datasets`) that the batch decodes on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from hpctrain.jobspec.models import Data, Trainer
from hpctrain.task.samplers import ExactEvalSampler, MicroBatchSampler, ResumableDistributedSampler
from hpctrain.trainer.data.datasets import TrainImages, ValImages
from hpctrain.trainer.data.decode import jpeg_decoder
from hpctrain.trainer.data.device_decode import (
    DeviceBackend,
    EncodedCollate,
    EncodedTrainImages,
    EncodedValImages,
    resolve_decoder,
)
from hpctrain.trainer.data.index import torch_broadcast
from hpctrain.trainer.data.loader_workers import ForkedLoader, seed_worker
from hpctrain.trainer.data.sources import build_datasets


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
    return ForkedLoader(val_dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn, **kwargs)


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
    train_loader = ForkedLoader(
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


def _in_process_group(rank: int, world_size: int) -> bool:
    """True when (rank, world_size) are the default group's: hogwild's worker processes have their own."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return dist.get_world_size() == world_size and dist.get_rank() == rank

"""Datasets, samplers and loaders: layout errors, exact evaluation, resumable order and augmentation."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import data_spec
from torch.utils.data import DistributedSampler

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import Data, Trainer
from hpctrain.trainer.data import (
    ExactEvalSampler,
    ResumableDistributedSampler,
    build_datasets,
    build_loaders,
    build_val_loader,
)
from hpctrain.trainer.data.datasets import TrainImages

# --- datasets and layout errors ---------------------------------------------------------------


def test_datasets_hand_over_uint8_crops(root: Path) -> None:
    train, val = build_datasets(data_spec(root))
    assert isinstance(train, TrainImages)
    assert train.classes == val.classes == ["class_00", "class_01", "class_02"]
    assert len(train) == 24 and len(val) == 15
    image, label = train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8 and label == 0  # normalised on the device
    val_image, _ = val[0]
    assert torch.equal(val_image, val[0][0])  # validation is deterministic
    assert val_image.shape == (3, 32, 32)


def test_evaluate_only_needs_no_train_dir(root: Path, tmp_path: Path) -> None:
    only_val = tmp_path / "only_val"
    shutil.copytree(root / "val", only_val / "val")
    train, val = build_datasets(data_spec(only_val), train=False)
    assert train is None and len(val) == 15


def test_missing_root_names_the_key_the_path_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(TrainingConfigError) as info:
        build_datasets(data_spec(missing))
    assert info.value.message.startswith("data.root:") and str(missing) in info.value.message
    assert "hpctrain make-dataset DIR" in info.value.hint


def test_unset_root_is_a_config_error() -> None:
    with pytest.raises(TrainingConfigError, match="data.root"):
        build_datasets(Data())


def test_missing_split_names_the_exact_path(root: Path, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    shutil.copytree(root / "train", partial / "train")
    with pytest.raises(TrainingConfigError) as info:
        build_datasets(data_spec(partial))
    assert info.value.message.startswith("data.val_dir:")
    assert str(partial / "val") in info.value.message and "make-dataset" in info.value.hint


def test_class_folder_without_images_keeps_its_label(root: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    for image in (broken / "train" / "class_01").iterdir():
        image.unlink()
    train, val = build_datasets(data_spec(broken))
    assert train.classes == val.classes and len(train) == 16 and 1 not in train.targets


def test_split_without_any_image_is_a_config_error(tmp_path: Path) -> None:
    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
    with pytest.raises(TrainingConfigError, match="data.val_dir: .* not a usable ImageFolder"):
        build_datasets(data_spec(tmp_path))


def test_train_and_val_classes_must_agree(root: Path, tmp_path: Path) -> None:
    odd = tmp_path / "odd"
    shutil.copytree(root, odd)
    shutil.rmtree(odd / "val" / "class_02")
    with pytest.raises(TrainingConfigError, match=r"only in train: \['class_02'\]"):
        build_datasets(data_spec(odd))


def test_val_resize_below_image_size_is_refused(root: Path) -> None:
    with pytest.raises(TrainingConfigError, match="data.val_resize"):
        build_datasets(Data(root=str(root), image_size=64, val_resize=32))


# --- exact evaluation -------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("total", [0, 1, 4, 7, 23, 50])
def test_eval_shards_cover_every_sample_exactly_once(world_size: int, total: int) -> None:
    data = range(total)
    shards = [list(ExactEvalSampler(data, world_size, rank)) for rank in range(world_size)]
    assert sorted(i for shard in shards for i in shard) == list(range(total))
    assert [len(s) for s in shards] == [len(ExactEvalSampler(data, world_size, r)) for r in range(world_size)]
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_distributed_sampler_would_double_count() -> None:
    """Why ExactEvalSampler exists: DistributedSampler repeats samples to even out the shards."""
    padded = [i for rank in range(3) for i in DistributedSampler(range(10), num_replicas=3, rank=rank, shuffle=False)]
    assert len(padded) == 12 and len(set(padded)) == 10


def test_val_loaders_over_ranks_see_the_whole_val_set(root: Path) -> None:
    _, val = build_datasets(data_spec(root))
    for world_size in (1, 2, 4):
        labels = []
        for rank in range(world_size):
            loader = build_val_loader(
                val, data_spec(root), rank=rank, world_size=world_size, batch_size=4, device_is_cuda=False
            )
            labels += [int(t) for _, targets in loader for t in targets]
        assert sorted(labels) == sorted(val.targets)


# --- resumable train order --------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_fresh_order_matches_distributed_sampler(world_size: int, drop_last: bool) -> None:
    data = range(23)
    for epoch in (0, 3):
        for rank in range(world_size):
            ours = ResumableDistributedSampler(data, world_size, rank, seed=7, drop_last=drop_last)
            theirs = DistributedSampler(data, world_size, rank, shuffle=True, seed=7, drop_last=drop_last)
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_skipping_k_batches_yields_exactly_the_tail(world_size: int, drop_last: bool) -> None:
    data, batch = range(37), 3
    for rank in range(world_size):
        full = ResumableDistributedSampler(data, world_size, rank, seed=1, drop_last=drop_last)
        full.set_epoch(2)
        uninterrupted = list(full)
        for k in range(len(uninterrupted) // batch + 2):
            resumed = ResumableDistributedSampler(data, world_size, rank, seed=1, drop_last=drop_last)
            resumed.load_state_dict(full.state_dict(batches_done=k, batch_size=batch))
            resumed.set_epoch(2)  # the loop calls this on resume: same epoch keeps the offset
            assert list(resumed) == uninterrupted[k * batch :]
            assert len(resumed) == len(uninterrupted[k * batch :])
            assert resumed.start_index == k * batch


@pytest.mark.parametrize("ranks, micro_batches", [(1, 1), (2, 2), (3, 3), (2, 4), (3, 4)])
def test_every_micro_batch_is_full_so_none_is_one_image(ranks: int, micro_batches: int) -> None:
    """65 images, batch 8: the last step used to hold one image per micro-batch, which crashes BatchNorm in
    training where the last feature map is 1x1 (ResNet below 64 px), at every epoch's end and every resume."""
    data, batch = range(65), 8
    for epoch in (0, 5):
        seen: list[int] = []
        for rank in range(ranks):
            sampler = ResumableDistributedSampler(data, ranks, rank, seed=2, batch_size=batch)
            sampler.set_micro_batches(micro_batches)
            sampler.set_epoch(epoch)
            batches = list(sampler.batches())
            parts = [part for step in sampler.step_parts() for part in step]  # 3 of 4: pieces of full ones
            assert {part.size for part in parts} == {batch} and [part.samples for part in parts] == list(
                map(len, batches)
            )
            assert len(batches) == sampler.batches_len()
            assert len(sampler) == sum(map(len, batches))
            seen += [i for b in batches for i in b]
        assert set(seen) == set(data) and len(seen) == math.ceil(65 / (batch * micro_batches)) * batch * micro_batches
        for rank in range(ranks):  # a resume before the last step gets the same full last step
            full = ResumableDistributedSampler(data, ranks, rank, seed=2, batch_size=batch)
            full.set_micro_batches(micro_batches)
            full.set_epoch(epoch)
            resumed = ResumableDistributedSampler(data, ranks, rank, seed=2, batch_size=batch)
            resumed.set_micro_batches(micro_batches)
            resumed.load_state_dict(full.state_dict(batches_done=1, batch_size=batch))
            resumed.set_epoch(epoch)
            assert list(resumed.batches()) == list(full.batches())[len(full.plan.parts(rank)) :]


def test_resume_on_another_world_size_visits_the_rest_once() -> None:
    data, batch = range(40), 4
    before = [ResumableDistributedSampler(data, 2, rank, seed=3) for rank in range(2)]
    done = {i for s in before for i in list(s)[: 2 * batch]}  # two batches per rank, then the job stops
    state = before[0].state_dict(batches_done=2, batch_size=batch)
    after = []
    for rank in range(3):
        sampler = ResumableDistributedSampler(data, 3, rank, seed=3)
        sampler.load_state_dict(state)
        after.append(list(sampler))
    rest = [i for shard in after for i in shard]
    assert done.isdisjoint(rest[: 40 - len(done)]) and set(rest) | done == set(data)
    assert len(set(rest)) == 40 - len(done) and len({len(s) for s in after}) == 1  # ranks stay in step


def test_a_new_epoch_forgets_the_resume_offset() -> None:
    sampler = ResumableDistributedSampler(range(10), 1, 0, seed=0)
    sampler.set_start_batch(2, 3)
    assert len(list(sampler)) == 4
    sampler.set_epoch(1)
    assert len(list(sampler)) == 10
    order_epoch1 = list(sampler)
    sampler.set_epoch(2)
    assert sorted(list(sampler)) == list(range(10)) and list(sampler) != order_epoch1


# --- seeded augmentation ----------------------------------------------------------------------


def test_augmentation_is_a_pure_function_of_seed_epoch_and_index(root: Path) -> None:
    train, _ = build_datasets(data_spec(root), seed=11)
    train.set_epoch(4)
    first = train[5][0]
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    expected_next = (torch.rand(1), random.random(), np.random.rand())
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    again = train[5][0]
    assert (torch.rand(1), random.random(), np.random.rand()) == expected_next  # global RNGs untouched
    assert torch.equal(first, again)

    train.set_epoch(5)
    assert not torch.equal(first, train[5][0])
    other_seed, _ = build_datasets(data_spec(root), seed=12)
    other_seed.set_epoch(4)
    assert not torch.equal(first, other_seed[5][0])


def _epochs(root: Path, workers: int, epochs: range, start_batch: int = 0) -> list[list[torch.Tensor]]:
    data = data_spec(root, workers=workers, persistent_workers=True, prefetch_factor=2)
    loaders = build_loaders(
        data, Trainer(batch_size=4), rank=0, world_size=1, device_is_cuda=False, epoch_seed=9, batch_size=4
    )
    out = []
    for epoch in epochs:
        loaders.set_epoch(epoch)
        if start_batch and epoch == epochs[0]:
            loaders.train_sampler.set_start_batch(start_batch, 4)
        out.append([images for images, _ in loaders.train_loader])
    return out


def test_augmented_batches_do_not_depend_on_workers_and_survive_resume(root: Path) -> None:
    serial = _epochs(root, workers=0, epochs=range(2))
    parallel = _epochs(root, workers=2, epochs=range(2))  # persistent workers must still see set_epoch
    for a, b in zip(serial, parallel, strict=True):
        assert len(a) == len(b) == 6
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(serial[0][0], serial[1][0])  # each epoch has its own order and crops

    resumed = _epochs(root, workers=2, epochs=range(1, 2), start_batch=2)
    assert len(resumed[0]) == 4
    assert all(torch.equal(x, y) for x, y in zip(resumed[0], serial[1][2:], strict=True))


def test_loader_settings_follow_the_spec(root: Path) -> None:
    data = data_spec(root, workers=2, prefetch_factor=3, pin_memory=True)
    loaders = build_loaders(
        data, Trainer(batch_size=4), rank=1, world_size=2, device_is_cuda=False, epoch_seed=0, batch_size=6
    )
    train = loaders.train_loader
    assert [len(batch) for batch in train.batch_sampler][:1] == [6] and loaders.val_loader.batch_size == 6
    assert train.num_workers == 2 and train.prefetch_factor == 3 and train.persistent_workers
    assert not train.pin_memory  # only pinned for CUDA
    assert train.generator is not None and train.worker_init_fn is not None
    assert loaders.num_classes == 3 and loaders.class_names == ["class_00", "class_01", "class_02"]
    assert loaders.train_sampler.rank == 1 and loaders.train_sampler.num_replicas == 2
    assert len(loaders.train_sampler) == 12

    zero = build_loaders(
        data_spec(root), Trainer(), rank=0, world_size=1, device_is_cuda=True, epoch_seed=0, batch_size=256
    )
    assert zero.train_loader.num_workers == 0 and not zero.train_loader.persistent_workers
    assert zero.train_loader.pin_memory


def test_evaluate_only_builds_no_train_loader(root: Path) -> None:
    loaders = build_loaders(
        data_spec(root),
        Trainer(evaluate_only=True),
        rank=0,
        world_size=1,
        device_is_cuda=False,
        epoch_seed=0,
        batch_size=4,
    )
    assert loaders.train_loader is None and loaders.train_sampler is None and loaders.num_classes == 3
    loaders.set_epoch(1)  # harmless without a train side

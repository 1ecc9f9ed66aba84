"""Where a job's samples come from: data.root as a folder, a packed image or a node-local copy.

:func:`build_datasets` finds the tree (mounting a packed image, staging a copy
when ``data.stage: node``), indexes each split once per job (the leader scans,
the others receive the index) and returns the train and val datasets; every
way data.root can be wrong is a ``TrainingConfigError`` with the fix.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from hpctrain.dataset import mount, packed_index, squashfs
from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import Data
from hpctrain.trainer.data.datasets import TrainImages, ValImages
from hpctrain.trainer.data.decode import jpeg_decoder
from hpctrain.trainer.data.index import DatasetIndex, IndexError_, cached_index, shared_index
from hpctrain.trainer.data.staging import resolve_stage_dir, stage_dataset, staged_index

_MAKE_DATASET_HINT = (
    "point data.root at an ImageFolder dataset (ROOT/train/<class>/*.jpg and ROOT/val/<class>/*.jpg), "
    "or create a small test dataset with `hpctrain make-dataset DIR`"
)


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
def _packed_document(point: Path) -> dict[str, Any] | None:
    return packed_index.read_packed(point)


def _packed_split(point: Path, subdir: str) -> DatasetIndex | None:
    """The split's index as the image stores it (``packed_index``: bounded, checked, never followed out)."""
    try:
        document = _packed_document(point)
        return None if document is None else packed_index.packed_split(point, document, subdir)
    except squashfs.ImageError as exc:  # every rank must raise it (see shared_index), not only the leader
        raise IndexError_(exc.message, hint=exc.hint) from exc

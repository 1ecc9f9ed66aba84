"""``data:``: the ImageFolder dataset and how it is read (loader workers, staging, decoding, image limits).

Whether the folders exist is asked by ``hpctrain doctor`` (``diagnose/path_checks.py``), not here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from hpctrain.jobspec.fields import safe_path
from hpctrain.jobspec.section import Section

Decode = Literal["cpu", "gpu", "dali", "auto"]

MAX_IMAGE_PIXELS = 2**27  # data.max_image_pixels' default: 2.8x ImageNet's largest image (about 48 MP)


class Data(Section):
    """An ImageFolder dataset: ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``."""

    root: Annotated[
        str | None,
        Field(
            description="Dataset root: a folder, or a SquashFS image of it written by `hpctrain pack` (each node "
            "mounts it once; docs/data.md). Default: the profile's data root."
        ),
    ] = None
    train_dir: Annotated[str, Field(description="Training split folder under data.root.")] = "train"
    val_dir: Annotated[str, Field(description="Validation split folder under data.root.")] = "val"
    workers: Annotated[int, Field(ge=0, le=128, description="Data-loader workers per task.")] = 4
    pin_memory: Annotated[bool, Field(description="Pin host memory for faster host-to-GPU copies (GPU jobs only).")] = (
        True
    )
    persistent_workers: Annotated[bool, Field(description="Keep data-loader workers alive between epochs.")] = True
    prefetch_factor: Annotated[int, Field(ge=1, description="Batches each worker loads ahead.")] = 2
    image_size: Annotated[int, Field(ge=8, description="Crop size fed to the model.")] = 224
    val_resize: Annotated[
        int, Field(ge=8, description="Validation images are resized to this, then center-cropped to image_size.")
    ] = 256
    index_cache_dir: Annotated[
        str | None,
        Field(
            description="Folder for the dataset index cache (file list + labels, keyed by the split's path and "
            "folder mtimes), so a requeued job does not walk the tree again. Default: no cache file; rank 0 "
            "still scans once per job and shares the list with every rank."
        ),
    ] = None
    stage: Annotated[
        Literal["none", "node"],
        Field(
            description="node: one task per node copies the dataset to node-local disk (data.stage_dir) with "
            "parallel readers before training (a packed image: as one file, then mounted from there), the "
            "node's other tasks wait, and all read the copy; a complete copy is reused after a requeue. none: "
            "read data.root directly."
        ),
    ] = "none"
    stage_dir: Annotated[
        str | None,
        Field(
            description="Node-local folder for data.stage: node and a packed image's mount; may contain {node} "
            "(the node's name) and $VARS; must exist (never created). Default: the first existing of "
            "$SLURM_TMPDIR, $TMPDIR and /tmp."
        ),
    ] = None
    stage_readers: Annotated[int, Field(ge=1, le=256, description="Parallel file copies while staging.")] = 16
    decode: Annotated[
        Decode,
        Field(
            description="Where JPEGs are decoded and augmented. cpu: the data-loader workers; gpu: workers read "
            "bytes, the task's GPU decodes with nvJPEG (torchvision) and crops/resizes there; dali: an NVIDIA DALI "
            "pipeline on the GPU (pip extra 'dali'), fed by hpctrain's sampler; auto: cpu on CPU jobs, else dali "
            "when installed, else gpu. Crops are the same pure function of (seed, epoch, index) in every mode.",
        ),
    ] = "auto"

    max_image_pixels: Annotated[
        int,
        Field(
            ge=1,
            le=2**34,
            description="Largest image (width x height) a loader decodes; larger ones, and progressive JPEGs "
            "whose coefficients (W x H x components x 2 bytes) exceed 3 bytes x this, are skipped, counted and "
            "named in the log, so one file cannot exhaust a worker's memory. Default 2**27 (134 MP, 16384 x 8192).",
        ),
    ] = MAX_IMAGE_PIXELS

    @field_validator("root", "train_dir", "val_dir")
    @classmethod
    def _paths(cls, value: str | None) -> str | None:
        return safe_path(value)

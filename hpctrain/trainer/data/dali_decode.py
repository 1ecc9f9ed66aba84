"""``data.decode: dali``: decode, crop and resize a batch with an NVIDIA DALI pipeline.

The pipeline has no reader of its own: hpctrain's sampler and loader workers
choose the files and draw each crop (the same pure function of (seed, epoch,
index) as every other mode), and feed the pipeline through
``fn.external_source``. So order, augmentation and exact resume stay ours;
``fn.decoders.image_random_crop`` would draw its own crops and break them.
The boxes go in as ``fn.decoders.image_slice`` anchors and shapes, so only
the crop region is decoded (ROI decoding).

DALI is an optional extra (``pip install 'hpctrain[dali]'``), imported only
when this mode runs. On a CPU device the same graph runs with DALI's CPU
operators, which is how it is tested without a GPU.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.data.decode import crop_resize_flip

_PIPELINES: dict[tuple[Any, ...], Any] = {}
DALI_HINT = (
    "pip install 'hpctrain[dali]' (nvidia-dali-cuda120; nvidia-dali-cuda130 for CUDA 13), or set data.decode: gpu"
)


def dali_decode_batch(
    payloads: list[torch.Tensor], boxes: torch.Tensor, image_size: int, device: torch.device, resize: int | None
) -> torch.Tensor:
    """An encoded batch (``device_decode.EncodedBatch``'s fields) as uint8 NCHW on ``device``;
    files decoded in the worker (PNG, CMYK) take the torch path."""
    out = torch.empty((len(payloads), 3, image_size, image_size), dtype=torch.uint8, device=device)
    encoded = [i for i, payload in enumerate(payloads) if payload.dim() == 1]
    if encoded:
        out[encoded] = run_pipeline(
            [payloads[i].numpy() for i in encoded], boxes[encoded].numpy(), image_size, resize, device
        )
    for i, payload in enumerate(payloads):
        if payload.dim() == 3:
            out[i] = crop_resize_flip(payload.to(device), boxes[i].tolist(), image_size, whole=resize is not None)
    return out


def run_pipeline(
    jpegs: list[np.ndarray], boxes: np.ndarray, image_size: int, resize: int | None, device: torch.device
) -> torch.Tensor:
    """Run one batch through the (cached) pipeline; returns a copy DALI will not overwrite."""
    pipe = _pipeline(len(jpegs), image_size, resize, device)
    pipe.feed_input("jpegs", jpegs)
    if resize is None:  # train_crop: whole pixels, decoded as a region of interest
        pipe.feed_input("anchor", [np.rint(box[:2]).astype(np.int32) for box in boxes])
        pipe.feed_input("shape", [np.rint(box[2:4]).astype(np.int32) for box in boxes])
        pipe.feed_input("flip", [np.array(box[4], dtype=np.int32) for box in boxes])
    else:  # val_crop: a fractional box, resized as one step like the CPU path
        pipe.feed_input("roi_start", [box[:2].astype(np.float32) for box in boxes])
        pipe.feed_input("roi_end", [(box[:2] + box[2:4]).astype(np.float32) for box in boxes])
    (images,) = pipe.run()
    dense = images.as_tensor()
    out = torch.empty(tuple(dense.shape()), dtype=torch.uint8, device=device)
    from nvidia.dali.plugin.pytorch import feed_ndarray

    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    feed_ndarray(dense, out, cuda_stream=stream)
    return out


def _pipeline(batch_size: int, image_size: int, resize: int | None, device: torch.device) -> Any:
    index = (
        device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else None)
    )
    for (key_device, key_size, key_resize, max_batch), pipe in _PIPELINES.items():
        if (key_device, key_size, key_resize) == (index, image_size, resize) and max_batch >= batch_size:
            return pipe
    pipe = build_pipeline(batch_size, image_size, resize, index)
    _PIPELINES[(index, image_size, resize, batch_size)] = pipe
    return pipe


def build_pipeline(max_batch_size: int, image_size: int, resize: int | None, device_id: int | None) -> Any:
    """Training (``resize`` None): decode each box, resize to image_size, flip. Validation:
    decode, resize the (fractional) val_crop box to image_size. CHW uint8 out.
    ``device_id`` None: CPU operators only."""
    try:
        from nvidia.dali import fn, pipeline_def, types
    except ImportError as exc:
        raise TrainingConfigError(
            f"data.decode: 'dali', but NVIDIA DALI cannot be imported ({exc})", hint=DALI_HINT
        ) from None
    decoder_device = "cpu" if device_id is None else "mixed"

    @pipeline_def(
        batch_size=max_batch_size,
        num_threads=max(1, min(8, len(os.sched_getaffinity(0)))),
        device_id=device_id,
        prefetch_queue_depth=1,
    )
    def pipeline() -> Any:
        jpegs = fn.external_source(name="jpegs", dtype=types.UINT8, ndim=1)
        if resize is None:
            anchor = fn.external_source(name="anchor", dtype=types.INT32, ndim=1)
            shape = fn.external_source(name="shape", dtype=types.INT32, ndim=1)
            flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
            images = fn.decoders.image_slice(
                jpegs, anchor, shape, device=decoder_device, output_type=types.RGB, axis_names="HW"
            )
            images = fn.resize(images, size=[image_size, image_size], interp_type=types.INTERP_LINEAR, antialias=True)
            images = fn.flip(images, horizontal=flip)
        else:
            roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1)
            roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1)
            images = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB)
            images = fn.resize(
                images,
                size=[image_size, image_size],
                roi_start=roi_start,
                roi_end=roi_end,
                interp_type=types.INTERP_LINEAR,
                antialias=True,
            )
        return fn.transpose(images, perm=[2, 0, 1])

    pipe = pipeline()
    pipe.build()
    return pipe

"""The measurements of ``hpctrain bench-data`` that need torch: decode + augment images/s per
core for a decoder, the GPU's own decode rate, and one GPU's training images/s on synthetic data.

Imported only by the bench-data command, after the spec is loaded.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from hpctrain.jobspec.models import JobSpec
from hpctrain.trainer.data.decode import jpeg_decoder
from hpctrain.trainer.data.device_decode import EncodedCollate
from hpctrain.trainer.data.loaders import encoded_datasets
from hpctrain.trainer.data.sources import build_datasets


def decode_rate(spec: JobSpec, decoder: str, *, max_images: int = 200, max_s: float = 10.0) -> tuple[float, str]:
    """(images/s on one core, what that covers) for what one loader worker does per sample."""
    train, val = build_datasets(spec.data, seed=spec.trainer.seed)
    assert train is not None
    dataset = train if decoder == "cpu" else encoded_datasets(train, val, spec.data, decoder)[0]  # type: ignore[arg-type]
    assert dataset is not None
    note = (
        f"read + JPEG decode ({jpeg_decoder()}, DCT-scaled) + crop + resize + flip in a loader worker"
        if decoder == "cpu"
        else "a loader worker reads the file and draws the crop; decoding happens on the GPU"
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        count = min(len(dataset), max_images)
        stride = max(1, len(dataset) // count)
        deadline = time.monotonic() + max_s
        start, done = time.perf_counter(), 0
        for index in range(0, stride * count, stride):
            dataset[index]
            done += 1
            if time.monotonic() > deadline:
                break
        rate = done / (time.perf_counter() - start)
        if dataset.skipped_samples:
            note += f"; {dataset.skipped_samples} unreadable or oversized images skipped (named in the log)"
        return rate, note
    finally:
        torch.set_num_threads(threads)


def gpu_decode_rate(spec: JobSpec, decoder: str, device: torch.device, *, batches: int = 5) -> float | None:
    """Images/s the GPU decodes, crops and resizes (gpu/dali), or None where there is nothing to measure."""
    if decoder == "cpu" or device.type != "cuda":
        return None
    train, val = build_datasets(spec.data, seed=spec.trainer.seed)
    dataset = encoded_datasets(train, val, spec.data, decoder)[0]  # type: ignore[arg-type]
    assert dataset is not None
    size = min(len(dataset), spec.trainer.batch_size)
    batch, _ = EncodedCollate(spec.data.image_size, decoder)([dataset[i] for i in range(size)])  # type: ignore[arg-type]
    batch.decode(device)  # warm-up: nvJPEG handles, DALI pipeline
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(batches):
        batch.decode(device)
    torch.cuda.synchronize(device)
    return size * batches / (time.perf_counter() - start)


def training_rate(spec: JobSpec, device: torch.device, *, steps: int = 20, warmup: int = 5) -> float:
    """Images/s of forward + backward + SGD for the spec's arch, precision, memory format and per-GPU batch."""
    from hpctrain.trainer.models import build_model

    cfg, size = spec.trainer, spec.data.image_size
    model = build_model(cfg, 1000, image_size=size)
    return synthetic_step_rate(
        model, cfg.precision, cfg.channels_last, device, batch=cfg.batch_size, size=size, steps=steps, warmup=warmup
    )


def synthetic_step_rate(
    model: nn.Module,
    precision: str,
    channels_last: bool,
    device: torch.device,
    *,
    batch: int,
    size: int,
    steps: int,
    warmup: int,
) -> float:
    """Images/s of ``model``'s forward + backward + SGD step on one synthetic batch, through hpctrain's
    ``Precision`` and memory format (also what benchmarks/precision_throughput.py times)."""
    from hpctrain.trainer.precision import Precision, to_memory_format

    model = to_memory_format(model.to(device), channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    amp = Precision(precision, device)
    model, optimizer = amp.prepare(model, optimizer)
    loss_fn = nn.CrossEntropyLoss()
    images = to_memory_format(torch.randn(batch, 3, size, size, device=device), channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = loss_fn(model(images), labels)
        amp.backward(loss, optimizer)
        amp.step(optimizer)

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return batch * steps / (time.perf_counter() - start)

"""The burn-in's probes, run by every rank of a training step before it trains (``healing/burn_in.py``).

* :func:`compute_probe`: forward+backward passes of the run's own model on
  synthetic data (a matrix product for an entry point or a script), in
  ``plain_probes.compute_probe``'s rounds, over torch's all-reduce.
* :func:`ring_allreduce` and :func:`pairwise_allreduce`: the DDP bucket size
  (25 MB) all-reduced over every rank, then between the first ranks of pairs
  of nodes (``scores.pair_rounds``), on the run's backend.
* ``plain_probes.read_probe``: one rank per node reads the dataset (or its
  packed image) for a bounded time (no torch: a CPU script's burn-in runs it too).
* :func:`gpu_problems`: NVML's word on this rank's GPU (ECC, retired or
  remapped memory, clocks held down) and, on a node's first rank, the GPU count.

A burn-in with one process per node (a torchrun job's node task, a script's
``per: node`` wrapper) probes every GPU of its node (:func:`node_devices`):
the compute workload runs on each of them at once (:func:`on_every_device`:
a pass ends when the slowest GPU's has), and NVML looks at each.

:class:`TorchGroup` and :class:`TorchKit` are what ``healing/burn_in.py``
runs these with (``plain_group.PlainGroup`` and ``plain_probes.PlainKit``
without torch). Every probe stops at its deadline; collectives agree on their
repeat counts first (all-reduce MIN), so no rank waits for one that gave up.
Task side: torch.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.healing import plain_probes
from hpctrain.healing.plain_group import BUCKET_MB
from hpctrain.healing.plain_probes import Rounds
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.context import TaskContext

log = logging.getLogger(__name__)

ROUNDS = 3  # all-reduce repeats
PAIR_REPEATS = 5
MODEL_STRATEGIES = ("ddp", "single", "dp")  # others: the matrix-product probe


def agree_min(value: float, device: torch.device, op: str = "MIN") -> float:
    """The smallest (``op="MAX"``: largest) ``value`` over every rank (itself without a process group)."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return float(tensor.item())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -------------------------------------------------------------------------------------------- compute


MATMUL_MAX_BATCH = 4096  # the matrix product's batch is rows / 8: any size the calibration asks for


def compute_workload(spec: JobSpec, device: torch.device) -> tuple[Callable[[int], None], int]:
    """One forward+backward pass at a given batch, and the largest batch it may take: the run's model (up to
    its per-process batch), or a matrix product for user code (an entry point, a script: their trainer section
    is defaults they never read)."""
    cfg = spec.trainer
    if spec.entrypoint is None and spec.script is None and cfg.strategy in MODEL_STRATEGIES:
        from hpctrain.trainer.models import build_model

        model = build_model(cfg, cfg.num_classes or 1000, image_size=spec.data.image_size).to(device).train()
        size = spec.data.image_size
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)

        def run_model(batch: int) -> None:
            images = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=fmt)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None and device.type == "cuda"):
                loss = model(images).float().logsumexp(dim=1).mean()
            loss.backward()
            model.zero_grad(set_to_none=True)

        return run_model, max(2, cfg.batch_size)
    side = 2048 if device.type == "cuda" else 256
    weights = torch.randn(side, side, device=device, requires_grad=True)

    def run_matmul(batch: int) -> None:
        out = torch.randn(batch * 8, side, device=device) @ weights
        out.square().mean().backward()
        weights.grad = None

    return run_matmul, MATMUL_MAX_BATCH


def node_devices(device: torch.device, processes_on_node: int, device_count: int) -> list[torch.device]:
    """The devices this process probes: its own, or every GPU of the node when it is the node's only
    process (its GPUs are then all of the node's it can see). Pure."""
    if device.type != "cuda" or processes_on_node != 1 or device_count <= 1:
        return [device]
    first = device.index or 0
    return [torch.device("cuda", first), *(torch.device("cuda", i) for i in range(device_count) if i != first)]


def on_every_device(works: Sequence[Callable[[int], None]], devices: Sequence[torch.device]) -> Callable[[int], None]:
    """One pass of each device's workload, started on all of them before any is waited for: the pass ends
    (``compute_probe`` syncs ``devices[0]``) once every device has finished its own."""
    if len(works) == 1:
        return works[0]

    def run_all(batch: int) -> None:
        for work in works:
            work(batch)  # queued on its device: CUDA returns before the kernels ran
        for device in devices[1:]:
            _sync(device)

    return run_all


def compute_probe(work: Callable[[int], None], device: torch.device, deadline: float, max_batch: int) -> list[float]:
    """``plain_probes.compute_probe`` on ``device``, its rounds agreed over the default group."""
    return plain_probes.compute_probe(
        work, deadline, max_batch, agree=lambda value, op: agree_min(value, device, op), sync=lambda: _sync(device)
    )


def pass_batch(work: Callable[[int], None], device: torch.device, max_batch: int) -> int:
    """``plain_probes.pass_batch`` on ``device``."""
    return plain_probes.pass_batch(work, max_batch, sync=lambda: _sync(device))


# -------------------------------------------------------------------------------------------- all-reduce


def _timed_allreduce(tensor: torch.Tensor, repeats: int, group: Any = None) -> float:
    """Best seconds of ``repeats`` all-reduces of ``tensor`` (after one warm-up)."""
    dist.all_reduce(tensor, group=group)
    _sync(tensor.device)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        _sync(tensor.device)
        best = min(best, time.perf_counter() - started)
    return best


def bucket(device: torch.device, megabytes: float = BUCKET_MB) -> torch.Tensor:
    return torch.ones(int(megabytes * (1 << 20) // 4), dtype=torch.float32, device=device)


def ring_allreduce(tensor: torch.Tensor, deadline: float) -> float:
    """The whole job's all-reduce bus bandwidth, MB/s (NCCL-tests' busbw: 2(n-1)/n x size / time)."""
    world = dist.get_world_size()
    started = time.perf_counter()
    dist.all_reduce(tensor)
    _sync(tensor.device)
    one = time.perf_counter() - started
    repeats = int(
        agree_min(float(max(1, min(ROUNDS, (deadline - time.perf_counter()) / max(one, 1e-3)))), tensor.device)
    )
    seconds = _timed_allreduce(tensor, repeats)
    size_mb = tensor.numel() * 4 / (1 << 20)
    return round(2 * (world - 1) / world * size_mb / seconds, 1)


def pairwise_allreduce(
    tensor: torch.Tensor,
    leaders: Sequence[int],
    rounds: Sequence[Sequence[tuple[int, int]]],
    deadline: float,
    *,
    one_at_a_time: bool = False,
) -> dict[int, float]:
    """node index -> its best pair's all-reduce bandwidth, MB/s; ``leaders``: each node's first rank.

    Every rank creates every pair's group (``new_group`` is collective) and waits at a barrier after
    each round; only the two leaders of a pair all-reduce in it. ``one_at_a_time``: every pair alone,
    so that no pair shares a link or a switch (or, on the test bed, the CPU) with another: the
    confirmation pass, after a first pass flagged a node.
    """
    if one_at_a_time:
        rounds = [[pair] for one in rounds for pair in one]
    rank = dist.get_rank()
    groups = {pair: dist.new_group([leaders[pair[0]], leaders[pair[1]]]) for one in rounds for pair in one}
    left = max(0.0, deadline - time.perf_counter())
    repeats = int(agree_min(float(max(1, min(PAIR_REPEATS, left / max(1, len(rounds)) / 0.2))), tensor.device))
    mine: dict[int, float] = {}
    size_mb = tensor.numel() * 4 / (1 << 20)
    for one in rounds:
        for pair in one:
            if rank in (leaders[pair[0]], leaders[pair[1]]):
                seconds = _timed_allreduce(tensor, repeats, groups[pair])
                for node in pair:
                    mine[node] = max(mine.get(node, 0.0), round(size_mb / seconds, 1))
        dist.barrier()
    for group in groups.values():
        dist.destroy_process_group(group)
    return mine


# -------------------------------------------------------------------------------------------- GPU


def gpu_problems(device: torch.device, expected_gpus: int, first_on_node: bool) -> list[str]:
    """What NVML says is wrong with this rank's GPU (and, on a node's first rank, the node's GPU count)."""
    if device.type != "cuda":
        return []
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return []
    from hpctrain.runtime.gpu_monitor import nvml_device_ref

    found = []
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if first_on_node and expected_gpus and count < expected_gpus:
            found.append(f"NVML sees {count} GPUs, the job asked for {expected_gpus}")
        ref = nvml_device_ref(device.index or 0, os.environ)
        handle = (
            pynvml.nvmlDeviceGetHandleByIndex(ref) if isinstance(ref, int) else pynvml.nvmlDeviceGetHandleByUUID(ref)
        )
        found += _nvml_checks(pynvml, handle)
    except Exception as exc:  # NVML missing or refusing: no verdict, not a failure
        log.info("burn-in: NVML checks skipped: %s", exc)
    return [f"GPU {device.index}: {problem}" for problem in found]


def _nvml_checks(nvml: Any, handle: Any) -> list[str]:
    found = []
    checks: list[tuple[str, Callable[[], Any]]] = [
        (
            "ecc",
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        ),
        ("pending", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)),
        ("remapped", lambda: nvml.nvmlDeviceGetRemappedRows(handle)),
        ("throttle", lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
    ]
    for name, query in checks:
        try:
            value = query()
        except Exception:  # not supported on this GPU or driver
            continue
        if name == "ecc" and value:
            found.append(f"{value} uncorrected ECC errors since the driver loaded")
        elif name == "pending" and value:
            found.append("retired memory pages pending (needs a reset)")
        elif name == "remapped" and isinstance(value, tuple) and len(value) >= 4 and (value[2] or value[3]):
            found.append("row remapping pending or failed (needs a reset)")
        elif name == "throttle":
            reasons = _throttle_names(nvml, int(value))
            if reasons:
                found.append("clocks held down: " + ", ".join(reasons))
    return found


def _throttle_names(nvml: Any, mask: int) -> list[str]:
    names = {
        "nvmlClocksThrottleReasonHwSlowdown": "hardware slowdown",
        "nvmlClocksThrottleReasonHwThermalSlowdown": "hardware thermal",
        "nvmlClocksThrottleReasonSwThermalSlowdown": "software thermal",
        "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": "power brake",
    }
    return [label for attribute, label in names.items() if mask & int(getattr(nvml, attribute, 0))]


# -------------------------------------------------------------------------------------------- the kit


class TorchGroup:
    """The burn-in's collectives over the default process group (``plain_group.PlainGroup``'s, with torch)."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()

    def all_gather(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, value)
        return gathered

    def broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()


class TorchKit:
    """What ``healing/burn_in.py``'s prober runs with torch: the run's model (or a matrix product) on this
    rank's device, or on every GPU of the node when this is its only process (a torchrun node task, a
    ``per: node`` task); the all-reduces on the run's backend; NVML."""

    def __init__(self, ctx: TaskContext) -> None:
        self.ctx = ctx
        self.devices: list[torch.device] = [ctx.device]
        self.work: Callable[[int], None] | None = None
        self.max_batch = 2

    def setup(self) -> None:
        """Build the workload (the run's model: imports torchvision, which the trainer pays anyway)."""
        device = self.ctx.device
        count = torch.cuda.device_count() if device.type == "cuda" else 1
        self.devices = node_devices(device, self.ctx.env.local_world_size, count)
        built = [compute_workload(self.ctx.spec, one) for one in self.devices]
        self.work = on_every_device([work for work, _ in built], self.devices)
        self.max_batch = min(largest for _, largest in built)

    def gpu_problems(self, first_on_node: bool) -> list[str]:
        expected = self.ctx.spec.resources.gpus_per_node or 0
        return [
            problem
            for number, one in enumerate(self.devices)
            for problem in gpu_problems(one, expected, first_on_node and number == 0)
        ]

    def compute(self, deadline: float) -> list[float]:
        assert self.work is not None
        return compute_probe(self.work, self.ctx.device, deadline, self.max_batch)

    def ring(self, deadline: float) -> float | None:
        return ring_allreduce(bucket(self.ctx.device), deadline)

    def pairs(
        self, leaders: Sequence[int], rounds: Rounds, deadline: float, *, one_at_a_time: bool
    ) -> dict[int, float]:
        return pairwise_allreduce(bucket(self.ctx.device), leaders, rounds, deadline, one_at_a_time=one_at_a_time)

    def close(self) -> None:
        self.work = None
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()  # the probe's model copy and buckets: the trainer's memory now

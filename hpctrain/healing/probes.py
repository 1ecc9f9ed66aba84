"""The burn-in's probes, run by every rank of a training step before it trains (``healing/burn_in.py``).

* :func:`compute_probe`: forward+backward passes of the run's own model on
  synthetic data (a matrix product for an entry point or a script), at a batch every rank
  agrees on, each pass long enough (>= :data:`MIN_PASS_S` on the fastest
  rank) that a CPU quota or a throttled GPU shows, in rounds every rank starts
  together; the median round counts, so a passing hiccup (or a lucky round)
  does not.
* :func:`ring_allreduce` and :func:`pairwise_allreduce`: the DDP bucket size
  (25 MB) all-reduced over every rank, then between the first ranks of pairs
  of nodes (``scores.pair_rounds``), on the run's backend.
* :func:`read_probe`: one rank per node reads the dataset (or its packed
  image) for a bounded time, different files on each node, dropping them from
  the page cache first where the kernel allows.
* :func:`gpu_problems`: NVML's word on this rank's GPU (ECC, retired or
  remapped memory, clocks held down) and, on a node's first rank, the GPU count.

A burn-in with one process per node (a torchrun job's node task, a script's
``per: node`` wrapper) probes every GPU of its node (:func:`node_devices`):
the compute workload runs on each of them at once (:func:`on_every_device`:
a pass ends when the slowest GPU's has), and NVML looks at each.

Every probe stops at its deadline; collectives agree on their repeat counts
first (all-reduce MIN), so no rank waits for one that gave up. Task side: torch.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.jobspec.models import JobSpec

log = logging.getLogger(__name__)

BUCKET_MB = 25.0  # DistributedDataParallel's default bucket_cap_mb: what each all-reduce of a step moves
MIN_PASS_S = 0.3  # CFS quotas act per 100 ms period: a shorter pass could slip between throttles
CALIBRATION_GROWTH = 4  # the batch's factor from one calibration pass to the next (pass_batch)
ROUNDS = 3  # all-reduce repeats
COMPUTE_ROUNDS = 8  # compute passes at most, as many as the deadline allows
STEADY_ROUNDS = 4  # ... and fewer once every rank's first rounds agree within STEADY_SPREAD (steady_enough)
STEADY_SPREAD = 1.3
PAIR_REPEATS = 5
READ_CHUNK = 4 << 20
READ_MAX_BYTES = 256 << 20
MIN_READ_S = 0.5  # the read probe gets at least this long, even when the others used up the budget
MIN_READ_BYTES = 4 << 20  # less than this says more about opening files than about reading them: no number
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
    """Milliseconds of each pass of ``work`` at the agreed batch: up to :data:`COMPUTE_ROUNDS` rounds, each
    started on every rank together, so that they share the machine alike (collective: every rank calls it),
    :data:`STEADY_ROUNDS` when every rank's agree (:func:`steady_enough`). Their median is the node's number:
    a lucky or unlucky round moves it little."""
    # the fastest rank's pass must last MIN_PASS_S: a slow rank's own choice would make everyone's passes short
    batch = int(agree_min(float(pass_batch(work, device, max_batch)), device, op="MAX"))
    times: list[float] = []
    while True:  # every round starts on every rank at once (the all-reduce)
        more = len(times) < COMPUTE_ROUNDS and (not times or time.perf_counter() + max(times) / 1000 < deadline)
        if not agree_min(1.0 if more else 0.0, device):
            break
        if len(times) >= STEADY_ROUNDS and not agree_min(0.0 if steady_enough(times) else 1.0, device, op="MAX"):
            break  # every rank measured the same pass again and again: more rounds would say it again
        started = time.perf_counter()
        work(batch)
        _sync(device)
        times.append(round((time.perf_counter() - started) * 1000, 3))
    return times


def pass_batch(work: Callable[[int], None], device: torch.device, max_batch: int) -> int:
    """The batch at which a pass of ``work`` lasts :data:`MIN_PASS_S` here (at most ``max_batch``), measured at
    a batch that grows :data:`CALIBRATION_GROWTH`-fold until a pass lasts half of that: a pass of two samples
    is mostly fixed costs (the call, autograd's graph, waking threads), and a loaded machine stretches those
    most. Scaled from it, CI #53's matrix-product passes came out at 3-8 ms, where one time slice given to
    another process doubled a pass and a healthy node of two was flagged at 2.9x. Every pass after the first
    (allocations, kernels, the first autograd graph) is timed; the last one counts."""
    largest = max(2, max_batch)
    work(2)  # the warm-up; batch norm wants two samples
    _sync(device)
    batch = 2
    while True:
        started = time.perf_counter()
        work(batch)
        _sync(device)
        seconds = max(time.perf_counter() - started, 1e-6)
        if seconds >= MIN_PASS_S / 2 or batch >= largest:
            break
        batch = min(largest, batch * CALIBRATION_GROWTH)
    return max(2, min(largest, round(batch * MIN_PASS_S / seconds)))


def steady_enough(rounds_ms: Sequence[float]) -> bool:
    """Whether a rank's rounds agree (slowest / fastest within :data:`STEADY_SPREAD`): its median would not move
    with more. A CPU quota is steady too (every round slowed alike), so a slow node is flagged as before; a
    machine whose load comes and goes runs every round the deadline allows. Pure."""
    return len(rounds_ms) >= STEADY_ROUNDS and max(rounds_ms) <= STEADY_SPREAD * max(min(rounds_ms), 1e-6)


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


# -------------------------------------------------------------------------------------------- read


def _drop_cache(fd: int, length: int) -> None:
    try:
        os.posix_fadvise(fd, 0, length, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):
        pass


def read_targets(root: Path, train_dir: str, node_index: int, nodes: int, limit: int = 4096) -> list[Path]:
    """Files this node reads: the packed image itself, or every ``nodes``-th file of the train split from
    ``node_index`` on, class folder by class folder (at most ``limit`` names listed)."""
    if root.is_file():
        return [root]
    split = root / train_dir
    if not split.is_dir():
        return []
    found: list[Path] = []
    with os.scandir(split) as classes:
        folders = sorted(entry.path for entry in classes if entry.is_dir(follow_symlinks=False))
    for folder in folders:
        with os.scandir(folder) as files:
            found += sorted(Path(e.path) for e in files if e.is_file(follow_symlinks=False))
        if len(found) >= limit:
            break
    return found[node_index::nodes]


def read_probe(targets: Sequence[Path], node_index: int, deadline: float) -> float | None:
    """MB/s reading ``targets`` until the deadline (a packed image: chunks from this node's own offset)."""
    done, started = 0, time.perf_counter()
    for path in targets:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            offset = 0 if len(targets) > 1 else (node_index * 37 * READ_CHUNK) % max(size, 1)
            _drop_cache(fd, size)
            os.lseek(fd, offset, os.SEEK_SET)
            while done < READ_MAX_BYTES and time.perf_counter() < deadline:
                block = os.read(fd, READ_CHUNK)
                if not block:
                    if len(targets) > 1 or offset == 0:
                        break
                    os.lseek(fd, 0, os.SEEK_SET)  # wrapped around the image
                    offset = 0
                    continue
                done += len(block)
        finally:
            os.close(fd)
        if done >= READ_MAX_BYTES or time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - started
    if done < MIN_READ_BYTES or elapsed <= 0:
        return None
    return round(done / (1 << 20) / elapsed, 1)


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

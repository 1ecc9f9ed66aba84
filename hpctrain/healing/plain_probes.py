"""The burn-in's probes that need no torch: the compute probe's rounds, the read probe, and a CPU workload.

``healing/probes.py`` runs these with torch's collectives and devices (the
trainer's ranks, a torchrun node task, a GPU script's children); a CPU
script's burn-in runs them over ``healing/plain_group.py`` with
:class:`HashWork` as its workload, and imports no torch.

* :func:`compute_probe`: passes of a workload, each long enough (>=
  :data:`MIN_PASS_S` on the fastest rank) that a CPU quota or a throttled
  GPU shows, in rounds every rank starts together; the median round counts,
  so a passing hiccup (or a lucky round) does not.
* :func:`read_probe`: one rank per node reads the dataset (or its packed
  image) for a bounded time, different files on each node, dropping them from
  the page cache first where the kernel allows.

Every probe stops at its deadline; collectives agree on their repeat counts
first (``agree``: MIN or MAX over every rank), so no rank waits for one that
gave up.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpctrain.healing.plain_group import PAIR_BYTES, PlainGroup

MIN_PASS_S = 0.3  # CFS quotas act per 100 ms period: a shorter pass could slip between throttles
CALIBRATION_GROWTH = 4  # the batch's factor from one calibration pass to the next (pass_batch)
COMPUTE_ROUNDS = 8  # compute passes at most, as many as the deadline allows
STEADY_ROUNDS = 4  # ... and fewer once every rank's first rounds agree within STEADY_SPREAD (steady_enough)
STEADY_SPREAD = 1.3
READ_CHUNK = 4 << 20
READ_MAX_BYTES = 256 << 20
MIN_READ_S = 0.5  # the read probe gets at least this long, even when the others used up the budget
MIN_READ_BYTES = 4 << 20  # less than this says more about opening files than about reading them: no number
HASH_UNIT = 64 << 10  # one "sample" of the CPU workload: hashed in ~0.1 ms by one core
HASH_MAX_BATCH = 1 << 16
PAIR_REPEATS = 5

Agree = Callable[[float, str], float]  # (value, "MIN" | "MAX") -> the same answer on every rank
Rounds = Sequence[Sequence[tuple[int, int]]]  # rounds of disjoint node pairs (scores.pair_rounds)


def _no_sync() -> None:
    pass


# -------------------------------------------------------------------------------------------- compute


class HashWork:
    """A CPU workload without torch: SHA-256 over a buffer, split over ``threads`` threads (hashlib lets go of
    the GIL for buffers this size), as the matrix product the torch probe runs is split over its threads. A
    CPU quota throttles it as it throttles any work; its rate on a healthy node is what the others are
    compared with, not any absolute number."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._block = bytes(HASH_UNIT)
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    def __call__(self, batch: int) -> None:
        shares = [batch // self.threads + (1 if i < batch % self.threads else 0) for i in range(self.threads)]
        if self._pool is None:
            self._hash(batch)
        else:
            list(self._pool.map(self._hash, shares))

    def _hash(self, units: int) -> None:
        digest = hashlib.sha256()
        for _ in range(units):
            digest.update(self._block)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def probe_threads(environ: dict[str, str] | os._Environ[str]) -> int:
    """How many threads the workload uses: ``OMP_NUM_THREADS`` as the wrapper set it (a task's share of its
    node's cores; a node's member: all of its tasks'), else the cores this process may run on."""
    told = environ.get("OMP_NUM_THREADS", "")
    if told.isdigit() and int(told) > 0:
        return int(told)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def compute_probe(
    work: Callable[[int], None],
    deadline: float,
    max_batch: int,
    *,
    agree: Agree,
    sync: Callable[[], None] = _no_sync,
) -> list[float]:
    """Milliseconds of each pass of ``work`` at the agreed batch: up to :data:`COMPUTE_ROUNDS` rounds, each
    started on every rank together, so that they share the machine alike (collective: every rank calls it),
    :data:`STEADY_ROUNDS` when every rank's agree (:func:`steady_enough`). Their median is the node's number:
    a lucky or unlucky round moves it little. ``sync``: waits for the device's queued work."""
    # the fastest rank's pass must last MIN_PASS_S: a slow rank's own choice would make everyone's passes short
    batch = int(agree(float(pass_batch(work, max_batch, sync=sync)), "MAX"))
    times: list[float] = []
    while True:  # every round starts on every rank at once (the agreement)
        more = len(times) < COMPUTE_ROUNDS and (not times or time.perf_counter() + max(times) / 1000 < deadline)
        if not agree(1.0 if more else 0.0, "MIN"):
            break
        if len(times) >= STEADY_ROUNDS and not agree(0.0 if steady_enough(times) else 1.0, "MAX"):
            break  # every rank measured the same pass again and again: more rounds would say it again
        started = time.perf_counter()
        work(batch)
        sync()
        times.append(round((time.perf_counter() - started) * 1000, 3))
    return times


def pass_batch(work: Callable[[int], None], max_batch: int, *, sync: Callable[[], None] = _no_sync) -> int:
    """The batch at which a pass of ``work`` lasts :data:`MIN_PASS_S` here (at most ``max_batch``), measured at
    a batch that grows :data:`CALIBRATION_GROWTH`-fold until a pass lasts half of that: a pass of two samples
    is mostly fixed costs (the call, autograd's graph, waking threads), and a loaded machine stretches those
    most. Scaled from it, CI #53's matrix-product passes came out at 3-8 ms, where one time slice given to
    another process doubled a pass and a healthy node of two was flagged at 2.9x. Every pass after the first
    (allocations, kernels, the first autograd graph) is timed; the last one counts."""
    largest = max(2, max_batch)
    work(2)  # the warm-up; batch norm wants two samples
    sync()
    batch = 2
    while True:
        started = time.perf_counter()
        work(batch)
        sync()
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


# -------------------------------------------------------------------------------------------- links


def pair_rates(
    group: PlainGroup, leaders: Sequence[int], rounds: Rounds, deadline: float, *, one_at_a_time: bool = False
) -> dict[int, float]:
    """node index -> its best pair's rate, MB/s (``probes.pairwise_allreduce``'s numbers, over TCP):
    rounds of disjoint pairs, every member at a barrier after each round. Collective."""
    if one_at_a_time:
        rounds = [[pair] for one in rounds for pair in one]
    left = max(0.0, deadline - time.perf_counter())
    repeats = int(group.agree(float(max(1, min(PAIR_REPEATS, left / max(1, len(rounds)) / 0.2)))))
    mine: dict[int, float] = {}
    size_mb = PAIR_BYTES / (1 << 20)
    for one in rounds:
        for a, b in one:
            if group.rank in (leaders[a], leaders[b]):
                peer = leaders[b] if group.rank == leaders[a] else leaders[a]
                seconds = group.exchange(peer, repeats, deadline)
                if seconds:
                    for node in (a, b):
                        mine[node] = max(mine.get(node, 0.0), round(size_mb / seconds, 1))
        group.barrier()
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


# -------------------------------------------------------------------------------------------- the kit


class PlainKit:
    """What ``healing/burn_in.py``'s prober runs on a CPU script's burn-in: :class:`HashWork` in
    :func:`compute_probe`'s rounds and :func:`pair_rates` over the :class:`PlainGroup`; no ring
    all-reduce (a script's collectives are its own) and no GPU. The torch kit: ``probes.TorchKit``."""

    def __init__(self, group: PlainGroup) -> None:
        self.group = group
        self.work: HashWork | None = None

    def setup(self) -> None:
        self.work = HashWork(probe_threads(os.environ))

    def gpu_problems(self, first_on_node: bool) -> list[str]:
        return []

    def compute(self, deadline: float) -> list[float]:
        assert self.work is not None
        return compute_probe(self.work, deadline, HASH_MAX_BATCH, agree=self.group.agree)

    def ring(self, deadline: float) -> float | None:
        return None

    def pairs(
        self, leaders: Sequence[int], rounds: Rounds, deadline: float, *, one_at_a_time: bool
    ) -> dict[int, float]:
        return pair_rates(self.group, leaders, rounds, deadline, one_at_a_time=one_at_a_time)

    def close(self) -> None:
        if self.work is not None:
            self.work.close()

"""Reading ranks' heartbeats: who is where, who is slow, who stopped first. Torch-free.

Every rank of a run writes ``heartbeats/rank-NNNNN.json`` (atomically, at a low
rate) with the fields of :class:`Heartbeat`. ``status``, ``status --watch``,
``report`` and the hang watchdog read them here. A missing, half-written or
mistyped file is skipped, never raised.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hpctrain.contract.rundir import heartbeats_dir, read_json_object, run_home

STRAGGLER_FACTOR = 1.3  # a rank whose median step time is > 1.3x the others' is a straggler

# What a heartbeat's compute times measure: a step's own compute (forward, backward up to the last gradient
# bucket's hand-over, optimizer: DDP) or the forward of the rank's module alone (no DDP comm hook to split at).
COMPUTE_KINDS = ("step", "forward")

# What a rank is doing, in the order of a training step (plus the rest of its life).
PHASES = ("setup", "burn-in", "data", "forward_backward", "allreduce", "optimizer", "checkpoint", "validation", "done")


class Heartbeat(BaseModel):
    """One rank's last heartbeat; the file's keys are a contract (docs/hangs.md)."""

    model_config = ConfigDict(extra="allow", defer_build=True, allow_inf_nan=False)

    rank: int = Field(ge=0)
    node: str = Field("", max_length=255)
    pid: int | None = None
    job_id: str | None = None
    epoch: int | None = None
    step: int = 0  # global optimizer step the rank is working on
    phase: str = Field("setup", max_length=64)
    phase_since: float = 0.0  # unix time the rank entered ``phase``
    last_progress: float = 0.0  # unix time ``step`` last advanced or a beat (or the rank started)
    step_time_median_s: float | None = None
    recent_step_times_s: list[float] = []
    # the rank's own work, without the collective waits every step time has: per ``compute_kind``
    compute_time_median_s: float | None = None
    recent_compute_times_s: list[float] = []
    compute_count: int = 0  # samples timed by this process
    compute_kind: str | None = Field(None, max_length=16)  # one of COMPUTE_KINDS; None (older files): forward
    time: float = 0.0  # unix time the file was written
    interval_s: float | None = None  # how often the rank's heartbeat thread writes (None: older files)
    gpu_util_pct: float | None = None
    gpu_mem_used_mb: float | None = None

    def age_s(self, now: float) -> float:
        """Seconds since the rank last wrote a heartbeat."""
        return max(0.0, now - self.time)


def read_heartbeats(run_dir: Path) -> list[Heartbeat]:
    """Every readable heartbeat of the run, ordered by rank."""
    folder = heartbeats_dir(run_dir)
    if not folder.is_dir():
        return []
    beats: dict[int, Heartbeat] = {}
    for path in sorted(folder.glob("rank-*.json")):
        data = read_json_object(path, within=run_home(run_dir))
        if data is None:
            continue
        try:
            beat = Heartbeat.model_validate(data)
        except ValidationError:
            continue
        beats[beat.rank] = beat
    return [beats[rank] for rank in sorted(beats)]


def find_stragglers(beats: Iterable[Heartbeat], factor: float = STRAGGLER_FACTOR) -> list[Heartbeat]:
    """Ranks whose median step time is more than ``factor`` x the median of the other ranks' medians.

    Needs at least two ranks with a measured median; a single rank is never a straggler.
    """
    return [beat for beat, _typical in straggler_medians(beats, factor)]


def straggler_medians(beats: Iterable[Heartbeat], factor: float = STRAGGLER_FACTOR) -> list[tuple[Heartbeat, float]]:
    """Each straggler with the median of the other ranks' medians it was compared with.

    One sort, then O(log n) per rank: ``status --watch`` polls this for
    every rank of a job of thousands.
    """
    timed = [beat for beat in beats if beat.step_time_median_s]
    if len(timed) < 2:
        return []
    values = sorted(beat.step_time_median_s or 0.0 for beat in timed)
    slow = []
    for beat in timed:
        own = beat.step_time_median_s or 0.0
        others = _median_without(values, own)
        if others > 0 and own > factor * others:
            slow.append((beat, others))
    return slow


def _median_without(values: Sequence[float], value: float) -> float:
    """The median of sorted ``values`` less one occurrence of ``value`` (which it holds)."""
    gone = bisect.bisect_left(values, value)
    count = len(values) - 1

    def at(index: int) -> float:
        return values[index if index < gone else index + 1]

    middle = count // 2
    return at(middle) if count % 2 else (at(middle - 1) + at(middle)) / 2


def first_stopped(beats: Iterable[Heartbeat]) -> Heartbeat | None:
    """The rank that stopped making progress first: the lowest step, then the oldest progress (entering its
    phase, or its last beat: a validation batch).

    In a hang the healthy ranks wait in a collective of a later step (or entered
    it later, or made progress in it later) than the rank that is stuck, so the
    laggard is the culprit. Progress counts, not only the phase's start: every rank
    of a hung validation is in phase ``validation`` at the same step, and the one
    that entered it first may be the one whose batches went on.
    """
    candidates = [beat for beat in beats if beat.phase != "done"]
    if not candidates:
        return None
    return min(candidates, key=lambda beat: (beat.step, max(beat.phase_since, beat.last_progress), beat.rank))

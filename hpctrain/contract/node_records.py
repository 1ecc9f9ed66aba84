"""What a run records about its nodes: node events, burn-in scores, evictions, and the supervisor's record.

``summary.json`` keeps three lists, carried over by every later attempt
(``trainer/reporting.py``):

* ``node_failures``: one :class:`NodeEvent` per decision about a node (lost,
  flagged by burn-in, evicted as slow): what happened, and what the run did
  (keep, swap for a spare, drop, requeue without it, fail);
* ``burn_in``: one :class:`BurnIn` per step start that ran the burn-in: each
  node's :class:`NodeScore` (compute ms, all-reduce MB/s, read MB/s, GPU
  problems) and who was flagged;
* ``evictions``: one :class:`Eviction` per slow node taken out during training.

``.hpctrain/supervisor.json`` is a healing job's :class:`SupervisorRecord`.

Every reader goes through :func:`records`, which reads these as
``rundir.Summary`` reads the summary: bounded (the last :data:`KEEP` entries),
and tolerant (an entry that is not a record is skipped, never raised). The
writers keep at most :data:`KEEP` entries too. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hpctrain.contract.rundir import read_json_object, supervisor_record_path, write_json_atomic

KEEP = 50  # entries kept per list in summary.json: a run that loses more has a bigger problem than its records

BURN_IN_KEY = "burn_in"
EVICTIONS_KEY = "evictions"
NODE_EVENTS_KEY = "node_failures"


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True, allow_inf_nan=False)


class NodeEvent(_Record):
    """One decision about a node (summary.json ``node_failures``)."""

    node: str = Field(max_length=255)
    kind: str = Field("lost", max_length=32)  # lost, burn-in, slow
    step: int | None = None  # the step it happened at (None: before the first)
    checkpoint_step: int | None = None  # the run's newest complete checkpoint then
    reason: str = Field("", max_length=2000)
    action: str = Field("", max_length=32)  # keep, swap, drop, requeue, fail (continue: older runs)
    why: str | None = Field(None, max_length=2000)  # why this action (a keep, a requeue, a failure)
    nodes: list[str] = []  # where the next step runs
    job_id: str | None = None
    time: float | None = None


class NodeScore(_Record):
    """One node's burn-in: its numbers, and whether (and why) it was flagged."""

    node: str = Field(max_length=255)
    compute_ms: float | None = None  # one forward+backward pass of the probe, best round
    allreduce_mb_s: float | None = None  # its best pairwise all-reduce bandwidth
    read_mb_s: float | None = None  # reading the dataset (or the packed image)
    gpu_problems: list[str] = []
    flagged: bool = False
    reason: str | None = None


class BurnIn(_Record):
    """One burn-in, at the start of one training step (summary.json ``burn_in``)."""

    job_id: str | None = None
    step_id: str | None = None  # the supervisor's id of the step (JOB.RESTART.ATTEMPT), when supervised
    nodes: list[str] = []
    seconds: float | None = None  # the probes' wall time
    phases_s: dict[str, float] = {}  # rank 0's time in each probe: setup, compute, ring, pairwise, read
    passes: int | None = None  # 2: something was flagged after the first, and measured again
    ring_mb_s: float | None = None  # the whole job's ring all-reduce bandwidth
    bucket_mb: float | None = None
    scores: list[NodeScore] = []
    flagged: list[str] = []
    action: str | None = None  # what the run did about the flagged nodes
    time: float | None = None


class Eviction(_Record):
    """A slow node taken out during training (summary.json ``evictions``)."""

    node: str = Field(max_length=255)
    step: int | None = None
    checkpoint_step: int | None = None
    node_ms: float | None = None  # its median compute time, of ``compute_kind``
    compute_kind: str | None = Field(None, max_length=16)  # step, forward (None: older records, forward)
    others_ms: float | None = None  # the median of the other nodes' medians
    ratio: float | None = None
    slow_for_s: float | None = None  # how long it had been this slow
    action: str = ""
    nodes: list[str] = []
    job_id: str | None = None
    time: float | None = None


class SupervisorRecord(_Record):
    """``.hpctrain/supervisor.json``: which start of a healing job runs where; its ``time`` says it is alive."""

    job_id: str | None = None
    restart: int | None = None
    batch_node: str | None = None
    ended: bool = False
    nodes: list[str] = []
    time: float | None = None


R = TypeVar("R", bound=_Record)


def records(kind: type[R], value: Any, keep: int = KEEP) -> list[R]:
    """The last ``keep`` entries of a summary list that are ``kind`` records; anything else is skipped."""
    if not isinstance(value, list):
        return []
    found = []
    for item in value[-keep:]:
        if not isinstance(item, dict):
            continue
        try:
            found.append(kind.model_validate(item))
        except ValidationError:
            continue
    return found


def appended(value: Any, record: Mapping[str, Any], keep: int = KEEP) -> list[dict[str, Any]]:
    """A summary list with ``record`` added last, its non-records dropped, at most ``keep`` long."""
    kept = [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
    return [*kept, dict(record)][-keep:]


def read_supervisor_record(run_dir: Path) -> SupervisorRecord | None:
    data = read_json_object(supervisor_record_path(run_dir), within=run_dir)
    if data is None:
        return None
    try:
        return SupervisorRecord.model_validate(data)
    except ValidationError:
        return None


def write_supervisor_record(run_dir: Path, record: SupervisorRecord) -> None:
    write_json_atomic(supervisor_record_path(run_dir), record.model_dump(mode="json"))

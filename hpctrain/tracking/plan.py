"""What to send to a tracker, from ``metrics.jsonl``, the run's summary and a cursor. Pure, torch-free.

The rule for steps redone after a hard kill: ``metrics.jsonl`` keeps every
attempt's lines, and a later start repeats the steps after its checkpoint.
The **last** line of a step is the one that counts, and a step is sent only
once it is **settled**, i.e. no start can redo it any more:

* steps up to the run's latest complete checkpoint (a restart resumes from
  it, so it never redoes them), and
* every step, once the run has ended (summary.json's status is final).

So a tracker shows the run up to its last checkpoint while it trains, and
each step exactly once, with the value of the attempt that kept it. A step
that shows up again after it was sent (a restart that fell back to an
older checkpoint because the newest was damaged) is not sent twice: it is
counted in ``late_steps`` and the ``hpctrain.late_redone_steps`` tag.

Attempt boundaries come from the run's starts (``contract/starts.py``:
every start of the run writes a line, also a requeue or a preemption that
resumed exactly where the last start stopped): restart N at the first step
that start trained. Steps redone after a hard kill are found in the metric
lines: a ``train_step`` whose step is not past the one logged just before
it begins a repeat (:class:`Restart`); a run without a starts file (written
before it existed) gets its restarts from those repeats alone. Lost nodes
and evictions come from the summary's records
(``contract/node_records.py``'s fields), each with its step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpctrain.contract.metrics import parse_metric_line
from hpctrain.contract.starts import Start
from hpctrain.contract.summary import Summary

# Each record kind's metric prefix; a kind not named here (a newer writer's) is not sent.
PREFIX = {"train_step": "train", "epoch": "epoch", "val": "val", "gpu": "gpu", "step_split": "split"}
OWN_FIELDS = frozenset({"kind", "time", "global_step", "epoch", "step", "rank"})
RESTART_METRIC = "hpctrain/restart"  # the attempt number, at the first step of each new attempt
REDONE_METRIC = "hpctrain/redone_steps"  # how many steps that attempt repeated
NODE_LOST_METRIC = "hpctrain/node_lost"
EVICTION_METRIC = "hpctrain/eviction"


@dataclass
class StepValues:
    """One step's metrics as a tracker gets them: ``train/loss``, ``val/top1``, ``hpctrain/restart``...

    ``time``: the step's own time, its ``train_step`` line's (the first line a step gets; a step without
    one: its first line's). ``times``: each value's own line's time. Neither changes when another line of
    the step is appended later (its ``step_split``, ``val``...), so a batch sent again after a sync was killed
    before its cursor's write carries the same (key, step, time, value) as the first and MLflow keeps it once.
    """

    step: int
    time: float
    values: dict[str, float] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)

    def time_of(self, key: str) -> float:
        """The time a tracker records for ``key``'s value at this step."""
        return self.times.get(key, self.time)


@dataclass(frozen=True)
class Restart:
    number: int  # 1 for the first restart
    step: int  # the first step the new attempt logged
    redone: int  # steps it repeated (0 when it started right after the last one logged)


@dataclass
class History:
    """What the lines of metrics.jsonl after a cursor hold (whole lines only)."""

    steps: dict[int, StepValues]  # the last values of each step after ``after_step``
    restarts: list[Restart]
    max_step: int | None  # the highest step of any record
    size: int  # bytes of whole lines read
    late: list[int]  # steps <= after_step that lines after ``sent_bytes`` repeat


def read_history(lines: Iterable[bytes], *, after_step: int = -1, sent_bytes: int = 0) -> History:
    """The steps after ``after_step`` (their last values), every restart, and the late repeats.

    ``lines``: metrics.jsonl from its start, each with its newline; a last line without one is
    being written and is left for the next read.
    """
    steps: dict[int, StepValues] = {}
    restarts: list[Restart] = []
    late: set[int] = set()
    offset, last_train, highest_train, max_step = 0, None, None, None
    for line in lines:
        if not line.endswith(b"\n"):
            break
        start, offset = offset, offset + len(line)
        record, _ = parse_metric_line(line)
        if record is None or not isinstance(step := record.get("global_step"), int):  # every kind has it
            continue
        max_step = step if max_step is None else max(max_step, step)
        if record["kind"] == "train_step":
            if last_train is not None and highest_train is not None and step <= last_train:
                restarts.append(Restart(len(restarts) + 1, step, highest_train - step + 1))
            last_train, highest_train = step, step if highest_train is None else max(highest_train, step)
        if step <= after_step:
            if start >= sent_bytes and sent_bytes:
                late.add(step)
            continue
        prefix = PREFIX.get(record["kind"])
        if prefix is None:
            continue
        values = {
            f"{prefix}/{key}": float(value)
            for key, value in record.items()
            if key not in OWN_FIELDS and isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        if not values:
            continue
        entry = steps.setdefault(step, StepValues(step, 0.0))
        entry.values.update(values)  # a later line of the same step wins
        when = record.get("time")
        if isinstance(when, (int, float)) and not isinstance(when, bool):
            entry.times.update(dict.fromkeys(values, float(when)))
            if record["kind"] == "train_step" or not entry.time:  # else the step has its time already
                entry.time = float(when)
    return History(steps, restarts, max_step, offset, sorted(late))


def step_times(lines: Iterable[bytes], steps: Iterable[int]) -> dict[int, float]:
    """Each of ``steps``' own time (:class:`StepValues`' ``time``) as the whole of ``lines`` has it: for
    an event at a step a sync sent before (its time must not depend on when it is sent)."""
    wanted = set(steps)
    history = read_history(lines) if wanted else None
    return {s: history.steps[s].time for s in wanted if history is not None and s in history.steps}


def settled_step(history: History, checkpoint_step: int | None, final: bool) -> int | None:
    """The last step no start can redo: every step once the run ended, else its latest checkpoint's."""
    if final:
        return history.max_step
    if checkpoint_step is None or history.max_step is None:
        return None
    return min(checkpoint_step, history.max_step)


@dataclass(frozen=True)
class Event:
    key: str  # unique within the run: what the cursor records as sent
    step: int
    metric: str
    value: float
    text: str
    time: float | None = None  # its record's own time; None: its step's time


def restart_steps(starts: Iterable[Start]) -> list[tuple[int, int]] | None:
    """(restart number, the first step it trained) of every restart the starts record, in order; None when
    they do not begin with the run's first start (no file, or only its newest lines were read). An event
    is sent once its step is settled, like the step's values."""
    found = list(starts)
    if not found or not found[0].first:
        return None
    steps = []
    for number, start in enumerate(found[1:], 1):
        step = start.first_step  # its first step done, as its heartbeat recorded it
        if step is None and start.step_before is not None:
            step = start.step_before + 1  # none recorded (yet): the step after the run's when it began
        if step is not None and step >= 1:
            steps.append((number, step))
    return steps


def run_events(history: History, summary: Summary | None, starts: Iterable[Start] = ()) -> list[Event]:
    """Restarts (from the run's starts; else from the lines' repeats), redone steps (from the lines), lost
    nodes and evictions (from the summary), each at its step."""
    boundaries = restart_steps(starts)
    if boundaries is None:
        boundaries = [(r.number, r.step) for r in history.restarts]
    events = [
        Event(f"restart-{number}", step, RESTART_METRIC, float(number), f"restart {number} at step {step}")
        for number, step in boundaries
    ]
    events += [
        Event(f"redone-{r.number}", r.step, REDONE_METRIC, float(r.redone), f"{r.redone} steps redone")
        for r in history.restarts
    ]
    for name, metric, records in (
        ("node-lost", NODE_LOST_METRIC, (summary.node_failures if summary else None) or []),
        ("eviction", EVICTION_METRIC, (summary.evictions if summary else None) or []),
    ):
        for index, record in enumerate(records):
            step = record.get("step") if isinstance(record, Mapping) else None
            if isinstance(step, int) and not isinstance(step, bool):
                node = str(record.get("node") or record.get("nodes") or "?")
                when = record.get("time")
                when = float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None
                events.append(Event(f"{name}-{index}", step, metric, 1.0, f"{name} {node} at step {step}", when))
    return events


@dataclass
class Batch:
    """What one sync sends: the newly settled steps (events merged in), in step order."""

    steps: list[StepValues]
    events: list[Event]  # the events among them (for the cursor)
    through: int  # the cursor's sent_step afterwards


def plan_batch(
    history: History, events: list[Event], *, after_step: int, settled: int | None, sent: Iterable[str]
) -> Batch:
    """The steps in (``after_step``, ``settled``] and the events not yet sent that belong to them.

    An event at a step already sent (a lost node recorded after its step settled) is not
    here: see :func:`late_events` (MLflow takes it at its step; W&B only as a tag).
    """
    if settled is None or settled <= after_step:
        return Batch([], [], after_step)
    done = set(sent)
    chosen = {s: history.steps[s] for s in sorted(history.steps) if after_step < s <= settled}
    fresh = [event for event in events if event.key not in done and after_step < event.step <= settled]
    for event in fresh:
        entry = chosen.setdefault(event.step, StepValues(event.step, event.time or 0.0))
        entry.values[event.metric] = event.value
        entry.times[event.metric] = event.time if event.time is not None else entry.time
    return Batch([chosen[s] for s in sorted(chosen)], fresh, settled)


def late_events(events: list[Event], *, after_step: int, sent: Iterable[str]) -> list[Event]:
    """Events at steps already sent and not sent themselves (recorded after their step settled)."""
    done = set(sent)
    return [event for event in events if event.key not in done and event.step <= after_step]


def run_tags(summary: Summary | None, history: History, late: list[int]) -> dict[str, str]:
    """The run's facts as tags: status, stop reason, restarts, lost and evicted nodes, late redone steps."""
    tags: dict[str, str] = {"hpctrain.restarts": str(len(history.restarts))}
    if summary is not None:
        for key in ("status", "stop_reason", "error", "failed_node", "failed_reason"):
            value = getattr(summary, key)
            if value is not None:
                tags[f"hpctrain.{key}"] = str(value)[:5000]
        if summary.restarts is not None:
            tags["hpctrain.restarts"] = str(summary.restarts)
        lost = [str(r.get("node")) for r in summary.node_failures or [] if isinstance(r, Mapping)]
        if lost:
            tags["hpctrain.lost_nodes"] = ", ".join(lost)[:5000]
        evicted = [str(r.get("node")) for r in summary.evictions or [] if isinstance(r, Mapping)]
        if evicted:
            tags["hpctrain.evicted_nodes"] = ", ".join(evicted)[:5000]
    if late:
        tags["hpctrain.late_redone_steps"] = json.dumps(late[:200])
    return tags


def flat_params(spec: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """The resolved spec as ``section.key: value`` strings (tracker parameters); lists and maps as JSON."""
    params: dict[str, str] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and name.count(".") < 3:
            params.update(flat_params(value, f"{name}."))
        else:
            params[name[:250]] = (value if isinstance(value, str) else json.dumps(value, default=str))[:6000]
    return params


FINAL_NUMBERS = (
    "global_step",
    "epochs_completed",
    "train_loss",
    "train_top1",
    "val_loss",
    "val_top1",
    "val_top5",
    "best_val_top1",
    "train_images_per_s",
    "data_wait_fraction",
    "wall_s",
)


def final_numbers(summary: Summary) -> dict[str, float]:
    """The summary's numbers a tracker shows at the end (``summary/val_top1``...)."""
    numbers = {}
    for key in FINAL_NUMBERS:
        value = getattr(summary, key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers[f"summary/{key}"] = float(value)
    return numbers

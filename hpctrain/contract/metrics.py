"""``metrics.jsonl``: its record format, its one writer and its one reader. Torch-free.

Rank 0's reporter (``trainer/reporting.py``: train_step, epoch and val
records) and its heartbeat thread (``runtime/heartbeat.py``: gpu samples)
append one JSON object per line through :class:`MetricsAppender`, one ``write``
of one whole line on an ``O_APPEND`` descriptor, so their lines never interleave.
Every record has a ``kind``, the field that says which step or epoch it is
(:data:`KEYS`) and a ``time``.

Readers (``status --watch``'s :class:`MetricsTail`, the report) parse lines
with :func:`parse_metric_lines` under one set of rules: regular files only,
bounded reads and lines, a line that is not a record of a known kind (torn,
garbage, a foreign kind, no step or time) is skipped, and a number hpctrain
could not have written (NaN, inf, beyond +-1e18, text where a number goes)
becomes None.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from sys import intern
from typing import Any

from hpctrain.contract.file_writes import open_append
from hpctrain.contract.rundir import metrics_path
from hpctrain.contract.runfiles import MAX_MAGNITUDE, RunFileError, load_json, open_regular

# Each kind of record and the field that says which step or epoch it is.
KEYS = {
    "train_step": "global_step",
    "epoch": "epoch",
    "val": "epoch",
    "gpu": "global_step",
    "step_split": "global_step",
}
KINDS = tuple(KEYS)
COUNTERS = ("epoch", "step", "global_step", "rank")  # whole numbers; every other field but "kind" is a number
RATE_WINDOW = 20  # train_step records the live step rate (and so the ETA) is measured over
FIRST_READ_BYTES = 1 << 20  # the first look of a tail reads only the end of metrics.jsonl


# ------------------------------------------------------------------ writing


def metrics_line(record: Mapping[str, Any], now: float) -> bytes:
    """One record as its line: ``record`` with ``time`` = ``now``. Values JSON cannot hold become text."""
    return (json.dumps({**record, "time": now}, default=str) + "\n").encode()


class MetricsAppender:
    """The run's metrics.jsonl held open for appending (rank 0 only): one ``write`` of one whole line per record."""

    def __init__(self, run_dir: Path) -> None:
        self._fd: int | None = open_append(metrics_path(run_dir))

    def append(self, record: Mapping[str, Any], *, now: float) -> None:
        if self._fd is not None:
            os.write(self._fd, metrics_line(record, now))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def append_metrics(run_dir: Path, record: Mapping[str, Any], *, now: float) -> None:
    """Append one record to the run's metrics.jsonl, opening and closing it (an occasional writer)."""
    appender = MetricsAppender(run_dir)
    try:
        appender.append(record, now=now)
    finally:
        appender.close()


# ------------------------------------------------------------------ reading


def _clean(key: str, value: Any) -> Any:
    """``value`` if it has the field's type and is plausible (finite, within +-1e18), else None. Hot: per field."""
    kind = type(value)
    if kind is int:
        return value if -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE else None
    if kind is float:
        return value if key not in COUNTERS and -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE else None  # not NaN/inf
    return value if key == "kind" else None


def parse_metric_line(line: bytes | str) -> tuple[dict[str, Any] | None, int]:
    """One line -> (its record with implausible values as None, or None when it is no record; values dropped).

    A record is a JSON object of a known ``kind`` that says which step or epoch it is.
    """
    try:
        record = load_json(line, raw_numbers=True)
    except ValueError:
        return None, 0
    if not isinstance(record, dict) or record.get("kind") not in KEYS:
        return None, 0
    clean = {intern(key): _clean(key, value) for key, value in record.items()}  # one key object per name
    if clean.get(KEYS[record["kind"]]) is None:  # a record must say which step/epoch it is
        return None, 0
    return clean, sum(1 for key in record if clean[key] is None and record[key] is not None)


def parse_metric_lines(
    lines: Iterable[bytes], kinds: Collection[str] = KINDS, *, timed: bool = True
) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of ``kinds`` in metrics.jsonl's ``lines`` (each with its newline), and notes on what was skipped.

    ``timed``: a record without a plausible ``time`` is unreadable (the report orders by it; the
    live tail does not need it). A last line without its newline that does not parse is being
    written right now: not counted.
    """
    records, bad, nonfinite, torn = [], 0, 0, False
    for line in lines:
        torn = False
        if not line.strip():
            continue
        record, dropped = parse_metric_line(line)
        if record is None or (timed and record.get("time") is None):
            bad += 1
            torn = not line.endswith(b"\n")
            continue
        if record["kind"] in kinds:
            nonfinite += dropped
            records.append(record)
    bad -= torn
    notes = []
    if bad:
        notes.append(f"metrics.jsonl: skipped {bad} unreadable line{'s' if bad != 1 else ''}")
    if nonfinite:
        notes.append(
            f"metrics.jsonl: {nonfinite} non-finite value{'s' if nonfinite != 1 else ''} "
            "(NaN/inf, beyond +-1e18, text) left out"
        )
    return records, notes


class MetricsTail:
    """The recent ``train_step`` records and the last ``epoch`` record of ``metrics.jsonl``, read incrementally.

    Each :meth:`read` continues from the byte offset where the last one stopped;
    a last line without its newline is left for the next read. A file that
    shrank (replaced) is read again from the start; of more than
    ``first_read_bytes`` new since the last read (a long run's file, a burst)
    only the end is read. Records after a resume repeat steps; the rate
    window restarts when ``global_step`` goes back.
    """

    def __init__(
        self,
        path: Path,
        window: int = RATE_WINDOW,
        first_read_bytes: int = FIRST_READ_BYTES,
        *,
        within: Path | None = None,
    ) -> None:
        self.path = Path(path)
        self.within = within  # the run's home: the file may not lead out of it
        self.offset = 0
        self.first_read_bytes = first_read_bytes
        self.steps: deque[dict[str, Any]] = deque(maxlen=window)
        self.last_epoch: dict[str, Any] | None = None
        self.last_split: dict[str, Any] | None = None  # the newest step_split record (contract/step_split.py)

    def read(self) -> None:
        try:
            with open_regular(self.path, within=self.within) as handle:
                size = handle.seek(0, 2)
                if size < self.offset:
                    self.offset, self.last_epoch, self.last_split = 0, None, None
                    self.steps.clear()
                skip_partial = size - self.offset > self.first_read_bytes
                if skip_partial:  # a long run's file (or a burst since the last poll): only its end matters
                    self.offset = size - self.first_read_bytes
                handle.seek(self.offset)
                chunk = handle.read(size - self.offset)
        except (OSError, RunFileError):
            return
        if skip_partial:
            start = chunk.find(b"\n") + 1
            chunk, self.offset = chunk[start:], self.offset + start
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        records, _ = parse_metric_lines(
            complete.splitlines(keepends=True), kinds=("train_step", "epoch", "step_split"), timed=False
        )
        for record in records:
            self._take(record)

    def _take(self, record: dict[str, Any]) -> None:
        if not isinstance(record.get("global_step"), int):
            return
        if record["kind"] == "epoch":
            self.last_epoch = record
            return
        if record["kind"] == "step_split":
            self.last_split = record
            return
        if self.steps and record["global_step"] <= self.steps[-1]["global_step"]:
            self.steps.clear()  # a resume replays the steps since its checkpoint
        self.steps.append(record)

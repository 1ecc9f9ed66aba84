"""The numbers of a report: per-run series summaries and the scaling table. Pure functions.

Definitions (docs/studies-and-reports.md repeats them):

* **img/s** of a run: the median ``images_per_s`` of the steady-state
  train_step records of its last attempt. Steady state leaves out the first
  record of every epoch (data-loader start, the first steps' warm-up, a
  checkpoint written between epochs) and every record of the attempt's first
  epoch when the attempt logged later ones (cudnn autotuning, torch.compile, caches
  filling). When nothing is left, all train_step records of the last attempt
  are used, then summary.json's ``train_images_per_s``; the ``source`` column
  says which. ``images_per_s`` is images per second over all ranks.
* **devices**: GPUs (nodes x gpus_per_node) when the run used GPUs, else
  processes (the world size); ``device_kind`` says which.
* **scaling efficiency** = (img/s / devices) / (img/s / devices of the
  smallest point), the smallest point being the row with the fewest devices
  that has an img/s.
* **time per epoch**: the median over complete epochs of the training time
  the train_step records account for (sum of step_s x steps); validation and
  checkpoints are not in it. With no complete epoch, it is extrapolated from
  the logged steps (``epoch_estimated``).
* **time to target**: training time (wall time from the first metric record,
  without the time between attempts) until the first validation whose top-1
  reached ``trainer.desired_acc``.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from hpctrain.contract.runfiles import plausible
from hpctrain.contract.scaling_model import run_devices
from hpctrain.observe.report.load import RunData


@dataclass
class Row:
    """One line of the scaling table."""

    label: str
    nodes: int | None
    devices: int | None
    device_kind: str  # "GPU" or "process"
    global_batch: int | None
    images_per_s: float | None
    source: str  # how images_per_s was measured
    images_per_s_per_device: float | None = None
    efficiency: float | None = None
    epoch_s: float | None = None
    epoch_estimated: bool = False
    best_top1: float | None = None
    target_top1: float | None = None
    time_to_target_s: float | None = None
    restarts: int = 0
    status: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(value: Any) -> float | None:
    return float(value) if plausible(value) else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and plausible(value) else None


def steady_images_per_s(run: RunData) -> tuple[float | None, str]:
    """The run's throughput and where it came from (module docstring)."""
    if run.train:
        last = max(record["attempt"] for record in run.train)
        records = [
            r
            for r in run.train
            if r["attempt"] == last
            and _num(r.get("images_per_s")) is not None
            and _whole(r.get("global_step")) is not None
        ]
        first_step: dict[int, int] = {}  # epoch -> its first logged global step (one pass: 1M records are common)
        for r in records:
            epoch = r.get("epoch")
            if isinstance(epoch, int) and r["global_step"] < first_step.get(epoch, r["global_step"] + 1):
                first_step[epoch] = r["global_step"]
        epochs, first_of_epoch = sorted(first_step), set(first_step.values())
        steady = [
            r
            for r in records
            if r["global_step"] not in first_of_epoch and (len(epochs) < 2 or r.get("epoch") != epochs[0])
        ]
        if steady:
            median = statistics.median(r["images_per_s"] for r in steady)
            return median, f"median of {len(steady)} steady-state train_step records"
        if records:
            median = statistics.median(r["images_per_s"] for r in records)
            return median, f"median of all {len(records)} train_step records (too few for a steady state)"
    value = _num(run.summary.get("train_images_per_s"))
    if value is not None:
        return value, "summary.json train_images_per_s"
    return None, "no throughput logged"


def epoch_seconds(run: RunData) -> tuple[float | None, bool]:
    """Median training seconds per epoch, and whether it was extrapolated from a partial epoch."""
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for record in sorted(run.train, key=lambda r: r.get("global_step") or 0):
        if isinstance(record.get("epoch"), int):
            by_epoch.setdefault(record["epoch"], []).append(record)
    spans: dict[int, tuple[float, int]] = {}
    for epoch, records in by_epoch.items():
        seconds, previous = 0.0, 0
        for record in records:
            step = record.get("step") if isinstance(record.get("step"), int) else previous + 1
            seconds += (_num(record.get("step_s")) or 0.0) * max(0, step - previous)
            previous = step
        spans[epoch] = (seconds, previous)
    complete = [spans[e][0] for e in (r.get("epoch") for r in run.epochs) if e in spans and spans[e][0] > 0]
    if complete:
        return statistics.median(complete), False
    per_epoch = run.steps_per_epoch
    partial = [(s, n) for s, n in spans.values() if n > 0 and s > 0]
    if partial and per_epoch:
        seconds, steps = partial[-1]
        return seconds / steps * per_epoch, True
    return None, False


def _percent(value: Any) -> float | None:
    """A top-1/top-5 accuracy in percent, or None when it cannot be one."""
    number = _num(value)
    return number if number is not None and 0.0 <= number <= 100.0 else None


def best_top1(run: RunData) -> float | None:
    values = [v for v in (_percent(r.get("top1")) for r in run.vals) if v is not None]
    if values:
        return max(values)
    return _percent(run.summary.get("best_val_top1"))


def time_to_target(run: RunData, target: float | None) -> float | None:
    if target is None:
        return None
    for record in run.vals:
        top1 = _percent(record.get("top1"))
        if top1 is not None and top1 >= target:
            return run.active_s(record["time"])
    return None


def resources(run: RunData) -> tuple[int | None, int | None, str, int | None]:
    """(nodes, devices, device kind, global batch) from the study point, summary.json and spec.yaml."""
    point, summary = run.point or {}, run.summary
    spec_res = run.spec.get("resources")
    spec_res = spec_res if isinstance(spec_res, dict) else {}
    nodes = _whole(point.get("nodes")) or _whole(summary.get("num_nodes")) or _whole(spec_res.get("nodes"))
    world = _whole(point.get("world_size")) or _whole(summary.get("world_size"))
    gpn = _whole(point.get("gpus_per_node"))
    if gpn is None:
        gpn = _whole(spec_res.get("gpus_per_node"))
    device = summary.get("device")
    on_cpu = isinstance(device, str) and device.startswith("cpu")
    devices, kind = run_devices(nodes, gpn, world, on_cpu)
    batch = _whole(point.get("global_batch")) or _whole(summary.get("global_batch_size"))
    return nodes, devices, kind, batch


def run_row(run: RunData) -> Row:
    nodes, devices, kind, batch = resources(run)
    ips, source = steady_images_per_s(run)
    epoch_s, estimated = epoch_seconds(run)
    target = run.desired_acc
    return Row(
        label=run.label,
        nodes=nodes,
        devices=devices,
        device_kind=kind,
        global_batch=batch,
        images_per_s=ips,
        source=source,
        images_per_s_per_device=ips / devices if ips is not None and devices else None,
        epoch_s=epoch_s,
        epoch_estimated=estimated,
        best_top1=best_top1(run),
        target_top1=target,
        time_to_target_s=time_to_target(run, target),
        restarts=run.restarts,
        status=run.summary.get("status") if isinstance(run.summary.get("status"), str) else None,
    )


def add_efficiency(rows: list[Row]) -> Row | None:
    """Fill ``efficiency`` relative to the smallest point with a throughput; return that point."""
    measured = [r for r in rows if r.images_per_s_per_device is not None and r.devices]
    if not measured:
        return None
    base = min(measured, key=lambda r: r.devices or 0)
    for row in measured:
        if base.images_per_s_per_device:
            row.efficiency = row.images_per_s_per_device / base.images_per_s_per_device
    return base


def scaling_table(runs: list[RunData]) -> list[Row]:
    """One row per run, in the order given, with the scaling efficiency filled in."""
    rows = [run_row(run) for run in runs]
    add_efficiency(rows)
    return rows


def series_summary(run: RunData) -> dict[str, Any]:
    """Per-run numbers for ``--json``: counts, last and best values, restarts, stragglers, notes."""
    last_train = run.train[-1] if run.train else {}
    last_val = run.vals[-1] if run.vals else {}
    waits = [v for v in (_num(r.get("data_wait_fraction")) for r in run.train) if v is not None]
    return {
        "label": run.label,
        "path": str(run.path),
        "status": run.summary.get("status"),
        "train_step_records": len(run.train),
        "epoch_records": len(run.epochs),
        "val_records": len(run.vals),
        "steps_per_epoch": run.steps_per_epoch,
        "last_global_step": last_train.get("global_step"),
        "last_train_loss": last_train.get("loss"),
        "last_val_top1": last_val.get("top1"),
        "last_val_top5": last_val.get("top5"),
        "best_val_top1": best_top1(run),
        "median_data_wait_fraction": statistics.median(waits) if waits else None,
        "restarts": run.restarts,
        "restart_times": run.restart_times,
        "stragglers": run.stragglers,
        "notes": run.notes,
    }

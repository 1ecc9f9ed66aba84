"""The report's PNGs, drawn with matplotlib (the ``plots`` extra) on the Agg backend.

One figure per run (loss, top-1/top-5, LR, data wait against epoch; loss,
top-1/top-5, img/s, data wait against wall time, restarts marked) and one
scaling figure across runs (img/s against devices with the ideal line,
scaling efficiency, time per epoch / time to target), optionally with a
published baseline series. Callers check :func:`available` first.
"""

from __future__ import annotations

import importlib.util
import math
import textwrap
from pathlib import Path
from typing import Any

from hpctrain.contract.node_records import BurnIn, Eviction, records
from hpctrain.observe.report.baselines import Baseline
from hpctrain.observe.report.load import RunData
from hpctrain.observe.report.table import Row

INSTALL_HINT = "pip install 'hpctrain[plots]'"
DPI = 80
LOG_SPAN = 100.0  # a curve panel whose values span more than this factor gets a log y axis
MAX_CURVE_POINTS = 4000  # per curve; longer series are drawn thinned (every k-th record)
MAX_RESTART_MARKS = 200  # restarts marked on the time axes (a file of replays could claim a million)
PNG_SOFTWARE = "hpctrain report"  # PNG Software text: how a later report knows the file is its own


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _time_unit(span_s: float) -> tuple[float, str]:
    if span_s >= 3 * 3600:
        return 3600.0, "h"
    if span_s >= 180:
        return 60.0, "min"
    return 1.0, "s"


def _points(records: list[dict[str, Any]], x: Any, key: str) -> tuple[list[float], list[float]]:
    """The curve of ``key``, broken (NaN) where a new attempt starts, so no line crosses a restart."""
    xs, ys, attempt = [], [], None
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if attempt is not None and record.get("attempt", attempt) != attempt:
                xs.append(x(record))
                ys.append(math.nan)
            attempt = record.get("attempt", attempt)
            xs.append(x(record))
            ys.append(float(value))
    return xs, ys


def _thin(records: list[dict[str, Any]], most: int = MAX_CURVE_POINTS) -> list[dict[str, Any]]:
    """Every k-th record (and the last) when there are more than ``most``: a curve a few hundred pixels
    wide shows no more, and drawing a 1M-record run point by point takes matplotlib half a minute."""
    if len(records) <= most:
        return records
    stride = math.ceil(len(records) / most)
    return [*records[::stride], records[-1]]


def _plot(ax: Any, records: list[dict[str, Any]], x: Any, key: str, **style: Any) -> bool:
    xs, ys = _points(_thin(records), x, key)
    if xs:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, **style)
    return bool(xs)


def _log_if_huge(ax: Any) -> bool:
    """A log y axis when the drawn values span more than :data:`LOG_SPAN` (an early validation loss of
    291,586 over a training loss of 2 would flatten the training curve on a linear axis)."""
    values = [y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y)]
    if not values or min(values) <= 0 or max(values) / min(values) <= LOG_SPAN:
        return False
    ax.set_yscale("log")
    return True


def _unused(ax: Any, what: str) -> None:
    """A panel with nothing to draw says so instead of an empty frame."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"{what}:\nnot in metrics.jsonl", ha="center", va="center", color="0.45", transform=ax.transAxes)


def plot_run(run: RunData, path: Path) -> Path:
    """The run's 2x4 figure of curves, written to ``path``."""
    plt = _pyplot()
    t0 = run.start_time or 0.0
    last = max((r["time"] for r in (*run.train, *run.epochs, *run.vals)), default=t0)
    scale, unit = _time_unit(last - t0)
    declared = run.summary.get("steps_per_epoch")  # a user loop says it with hpctrain.task.set_summary
    per_epoch = run.steps_per_epoch or (declared if isinstance(declared, int) and declared > 0 else None)
    epoch_axis = "epoch" if per_epoch else "optimizer step"  # a user loop's records may carry neither

    def at_epoch(r: dict[str, Any]) -> float:
        if r["kind"] == "train_step" and not isinstance(r.get("step"), int):  # hpctrain.task.log: global step only
            return float(r.get("global_step") or 0) / (per_epoch or 1)
        if r["kind"] == "train_step":
            return float(r.get("epoch") or 0) + float(r.get("step") or 0) / (per_epoch or 1)
        return float(r.get("epoch") or 0) + 1.0

    def at_time(r: dict[str, Any]) -> float:
        return (r["time"] - t0) / scale

    health = _health_record(run)
    fig = plt.figure(figsize=(16, 10.8 if health else 7.2), dpi=DPI)
    grid = fig.add_gridspec(3 if health else 2, 4)
    axes = [[fig.add_subplot(grid[row, column]) for column in range(4)] for row in range(2)]
    for row, (x, xlabel) in enumerate(((at_epoch, epoch_axis), (at_time, f"wall time ({unit})"))):
        loss, acc, third, wait = axes[row]
        drawn = {
            loss: _plot(loss, run.train, x, "loss", label="train", color="tab:blue")
            | _plot(loss, run.vals, x, "loss", label="val", color="tab:orange")
        }
        loss.set_title("loss (log scale)" if _log_if_huge(loss) else "loss")
        drawn[acc] = False
        for key, style in (("top1", "-"), ("top5", "--")):
            drawn[acc] |= _plot(acc, run.train, x, key, label=f"train {key}", color="tab:blue", linestyle=style)
            drawn[acc] |= _plot(acc, run.vals, x, key, label=f"val {key}", color="tab:orange", linestyle=style)
        acc.set_title("accuracy (%)")
        if row == 0:
            drawn[third] = _plot(third, run.train, x, "lr", color="tab:green")
            third.set_title("learning rate")
        else:
            drawn[third] = _plot(third, run.train, x, "images_per_s", color="tab:purple")
            third.set_title("images/s (all ranks)")
            third.set_ylim(bottom=0)
        drawn[wait] = _plot(wait, run.train, x, "data_wait_fraction", color="tab:red")
        wait.set_title("data-wait fraction")
        wait.set_ylim(0, 1.02)
        for ax in axes[row]:
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
            if not drawn[ax]:
                _unused(ax, ax.get_title())
    for ax in axes[1]:
        for index, (end, start) in enumerate(run.downtimes[:MAX_RESTART_MARKS]):
            ax.axvspan((end - t0) / scale, (start - t0) / scale, color="0.85")
            ax.axvline((start - t0) / scale, color="black", linestyle=":", label="restart" if index == 0 else None)
    evictions = records(Eviction, run.summary.get("evictions"))[:MAX_RESTART_MARKS]
    for index, evicted in enumerate(e for e in evictions if e.time is not None):
        label = "evicted " + ",".join(e.node for e in evictions) if index == 0 else None
        axes[1][2].axvline((evicted.time - t0) / scale, color="tab:red", linestyle="--", label=label)
    if health is not None:
        _node_heatmap(fig.add_subplot(grid[2, :]), health)
    for ax in (axes[0][0], axes[0][1], axes[1][1], axes[1][2]):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if run.downtimes and axes[1][0].get_legend_handles_labels()[0]:
        axes[1][0].legend(fontsize=8)
    title = f"{run.label}: restarts {run.restarts}"
    if run.stragglers:
        title += " | stragglers: " + "; ".join(run.stragglers)
    fig.suptitle(textwrap.shorten(title, 170), fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, metadata={"Software": PNG_SOFTWARE})
    plt.close(fig)
    return path


HEAT_NODES = 64  # nodes shown in the burn-in heatmap
HEAT_COLUMNS = (("compute_ms", "compute ms", False), ("allreduce_mb_s", "pair all-reduce MB/s", True))
HEAT_COLUMNS += (("read_mb_s", "read MB/s", True),)


def _health_record(run: RunData) -> BurnIn | None:
    """The burn-in the heatmap shows: the last that flagged a node, else the last one."""
    found = records(BurnIn, run.summary.get("burn_in"))
    flagged = [record for record in found if record.flagged]
    return (flagged or found or [None])[-1]


def _node_heatmap(ax: Any, record: BurnIn) -> None:
    """Nodes x (compute ms, all-reduce MB/s, read MB/s), each cell coloured by how much worse than the
    column's median it is (1x white, 3x and more dark red), flagged nodes starred."""
    import statistics

    scores = record.scores[:HEAT_NODES]
    matrix, labels = [], []
    for key, _, higher_is_better in HEAT_COLUMNS:
        values = [getattr(s, key) for s in scores]
        known = [v for v in values if v]
        middle = statistics.median(known) if known else 0.0
        row = []
        for value in values:
            if not value or not middle:
                row.append(float("nan"))
            else:
                row.append(min(3.0, max(1.0, middle / value if higher_is_better else value / middle)))
        matrix.append(row)
        labels.append(values)
    ax.imshow(list(zip(*matrix)) or [[float("nan")] * 3], cmap="Reds", vmin=1.0, vmax=3.0, aspect="auto")
    ax.set_xticks(range(len(HEAT_COLUMNS)), [title for _, title, _ in HEAT_COLUMNS])
    ax.set_yticks(range(len(scores)), [f"{s.node}{' *' if s.flagged else ''}" for s in scores])
    for column, values in enumerate(labels):
        for row, value in enumerate(values):
            text = "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.3g}"
            ax.text(column, row, text, ha="center", va="center", fontsize=8)
    flagged = "; ".join(f"{s.node}: {s.reason}" for s in record.scores if s.flagged) or "nobody flagged"
    ax.set_title(textwrap.shorten(f"burn-in per node ({record.seconds or 0:.1f} s; * flagged): {flagged}", 170))


def plot_scaling(rows: list[Row], path: Path, baseline: Baseline | None = None) -> Path:
    """img/s, efficiency and time per epoch (or to target) against devices."""
    plt = _pyplot()
    measured = sorted((r for r in rows if r.images_per_s is not None and r.devices), key=lambda r: r.devices or 0)
    kind = "GPUs" if measured and all(r.device_kind == "GPU" for r in measured) else "GPUs / processes"
    fig, (thr, eff, tim) = plt.subplots(1, 3, figsize=(16, 5.6), dpi=DPI)
    if measured:
        devices = [r.devices for r in measured]
        base = measured[0]
        thr.plot(devices, [r.images_per_s for r in measured], marker="o", color="tab:blue", label="this study")
        per = (base.images_per_s or 0) / (base.devices or 1)
        thr.plot(devices, [per * d for d in devices], linestyle="--", color="0.5", label="ideal (linear)")
        eff.plot(
            devices, [100 * (r.efficiency or 0) for r in measured], marker="o", color="tab:blue", label="this study"
        )
        timed = [r for r in measured if r.time_to_target_s is not None]
        if timed:
            tim.plot(
                [r.devices for r in timed],
                [r.time_to_target_s / 60 for r in timed],
                marker="o",
                color="tab:blue",
                label="to target",
            )
            tim.set_title(f"time to top-1 >= {timed[0].target_top1:g} % and per epoch (min)")
        epochs = [r for r in measured if r.epoch_s is not None]
        if epochs:
            tim.plot(
                [r.devices for r in epochs],
                [r.epoch_s / 60 for r in epochs],
                marker="s",
                ls="--",
                c="tab:blue",
                label="per epoch",
            )
        if not timed:
            tim.set_title("time per epoch (min)")
    if baseline is not None:
        gpus = [p.gpus for p in baseline.points]
        thr.plot(gpus, [p.images_per_s for p in baseline.points], marker="^", color="tab:orange", label=baseline.title)
        own = f"{baseline.name.upper()} (vs its {min(gpus)} GPUs)"
        eff.plot(gpus, [100 * baseline.efficiency(p) for p in baseline.points], marker="^", c="tab:orange", label=own)
        tim.plot(
            gpus,
            [p.epoch_s / 60 for p in baseline.points],
            marker="^",
            color="tab:orange",
            label=f"{baseline.name.upper()} per epoch",
        )
        for ax in (thr, tim):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        eff.set_xscale("log", base=2)
    thr.set_title("throughput (images/s)")
    eff.set_title("scaling efficiency (%)")
    eff.axhline(100, color="0.5", linestyle="--")
    eff.set_ylim(bottom=0)
    for ax in (thr, eff, tim):
        ax.set_xlabel(kind)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if baseline is not None:
        fig.text(0.01, 0.01, textwrap.fill(baseline.caption, 200), fontsize=8, va="bottom")
        fig.tight_layout(rect=(0, 0.07, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI, metadata={"Software": PNG_SOFTWARE})
    plt.close(fig)
    return path

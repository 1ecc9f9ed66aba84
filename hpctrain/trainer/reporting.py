"""What a run tells the outside world: metrics.jsonl, TensorBoard, progress lines, summary.json.

Only global rank 0 writes (a ``Reporter(enabled=False)`` on the other ranks
still builds summary dicts, which ``run_training`` returns on every rank).

* ``metrics.jsonl``: one JSON object per logged step ("train_step"), per epoch
  ("epoch") and per validation ("val"). After a resume the steps since the
  last checkpoint appear again; readers keep the last line per global step.
* ``tb/``: TensorBoard scalars; a resumed run purges events past its checkpoint.
* stdout: a rich progress bar on a terminal, else one greppable line per log.
* ``summary.json``: the run's state, rewritten atomically at start, at every
  epoch end and at exit. ``wall_s`` accumulates over requeues.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.contract.metrics import MetricsAppender
from hpctrain.contract.rundir import tb_dir
from hpctrain.contract.summary import CARRIED_SUMMARY_KEYS, Summary, read_summary, write_summary

if TYPE_CHECKING:
    from hpctrain.runtime.context import TaskContext

TRAIN_SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "top1": "train/top1",
    "top5": "train/top5",
    "images_per_s": "perf/images_per_s",
    "data_s": "perf/data_s",
    "step_s": "perf/step_s",
    "data_wait_fraction": "perf/data_wait_fraction",
}
VAL_SCALARS = {"top1": "val/top1", "top5": "val/top5", "loss": "val/loss"}


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def run_facts(ctx: TaskContext, global_batch_size: int) -> dict[str, Any]:
    """The summary fields that do not change during a run attempt."""
    env, trainer = ctx.env, ctx.spec.trainer
    return {
        "name": ctx.spec.name,
        "job_id": env.job_id,
        "arch": trainer.arch,
        "strategy": trainer.strategy,
        "precision": trainer.precision,
        "world_size": env.world_size,
        "num_nodes": env.num_nodes,
        "hostnames": list(env.hostnames),
        "device": str(ctx.device),
        "epochs": trainer.epochs,
        "batch_size": trainer.batch_size,
        "global_batch_size": global_batch_size,
        "deterministic": trainer.deterministic,
    }


def carried_fields(previous: Summary) -> dict[str, Any]:
    """What the batch step's supervisor recorded about lost nodes, kept by every later summary."""
    return {key: getattr(previous, key) for key in CARRIED_SUMMARY_KEYS if getattr(previous, key) is not None}


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


def loss_text(value: float) -> str:
    """A loss for the console: 4 decimals, or 3 significant digits once it is huge (291586.1234 -> 2.92e+05)."""
    return f"{value:.3g}" if math.isfinite(value) and abs(value) >= 1e4 else f"{value:.4f}"


# a validation loss this many times the epoch's train loss is explained once: it alarms newcomers
FAR_ABOVE_TRAIN = 10.0
HIGH_VAL_LOSS = (
    "  (val loss far above the train loss: usual in the first epochs of a small run, while BatchNorm's running "
    "statistics, which validation uses, catch up with the weights; top-1 is the figure to watch)"
)


def _share(value: float | None) -> str:
    return "?" if value is None else f"{100 * value:.0f}%"


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Reporter:
    """Metrics, progress and summary for one task of a run."""

    def __init__(self, run_dir: Path, *, enabled: bool, static: dict[str, Any]) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.static = dict(static)
        self.started = time.monotonic()
        previous = read_summary(self.run_dir) or Summary()
        self.static.update(carried_fields(previous))
        self.prior_wall_s = float(previous.wall_s or 0.0)
        self.prior_restarts = int(previous.restarts or 0)
        self.prior_status = previous.status  # "stopped": this start continues a run that stopped to come back
        self.started_at = previous.started_at or _now_iso()
        self.epochs = 1
        self.steps_per_epoch = 1
        self._metrics: MetricsAppender | None = None  # rank 0's, once started
        self._tb: Any = None
        self._purge_step: int | None = None
        self._train_loss: float | None = None  # the last epoch's, which a validation loss is told against
        self._loss_explained = False
        self._progress: Any = None
        self._task: Any = None
        self._rate_steps = 0
        self._rate_s = 0.0

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self, *, epochs: int, steps_per_epoch: int, global_step: int, resumed: bool) -> None:
        """Called once the run's shape is known; ``global_step`` > 0 when resuming."""
        self.epochs, self.steps_per_epoch = epochs, max(1, steps_per_epoch)
        self._purge_step = global_step if resumed else None
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = MetricsAppender(self.run_dir)
        if sys.stdout.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeRemainingColumn(),
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "", total=epochs * self.steps_per_epoch, completed=global_step, stats=""
            )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    # -- per step / epoch ------------------------------------------------------------------------------------
    def train_step(self, *, epoch: int, step: int, global_step: int, values: dict[str, float], steps: int) -> None:
        """``values``: loss, lr, top1, top5, images_per_s, data_s, step_s and data_wait_fraction of ``steps``."""
        self._rate_steps += steps
        self._rate_s += values["step_s"] * steps
        if not self.enabled:
            return
        self._write_metrics({"kind": "train_step", "epoch": epoch, "step": step, "global_step": global_step, **values})
        self._scalars(TRAIN_SCALARS, values, global_step)
        self._show(epoch, step, global_step, values)

    def step_split(self, record: dict[str, Any]) -> None:
        """A window's step_split record (``contract/step_split.py``): where its steps' time went, on every rank."""
        if self.enabled:
            self._write_metrics(record)

    def advance(self, global_step: int) -> None:
        """Move the progress bar (cheap; called every step)."""
        if self._progress is not None:
            self._progress.update(self._task, completed=global_step)

    def epoch_end(self, *, epoch: int, global_step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._write_metrics(
            {"kind": "epoch", "epoch": epoch, "step": self.steps_per_epoch, "global_step": global_step, **values}
        )
        self._train_loss = values["loss"]
        self._print(
            f"epoch {epoch + 1}/{self.epochs} train loss {loss_text(values['loss'])} top1 {values['top1']:.2f} "
            f"top5 {values['top5']:.2f} img/s {_rate(values.get('images_per_s'))} "
            f"data-wait {_share(values.get('data_wait_fraction'))}"
        )

    def validation(self, *, epoch: int, global_step: int, values: dict[str, float], best_top1: float | None) -> None:
        if not self.enabled:
            return
        self._write_metrics({"kind": "val", "epoch": epoch, "global_step": global_step, **values})
        self._scalars(VAL_SCALARS, values, global_step)
        best = f" best {best_top1:.2f}" if best_top1 is not None else ""
        skipped = f" ({values['skipped']} val images could not be decoded, not scored)" if values.get("skipped") else ""
        line = (
            f"epoch {epoch + 1}/{self.epochs} val top1 {values['top1']:.2f} top5 {values['top5']:.2f} "
            f"loss {loss_text(values['loss'])}{best}{skipped}"
        )
        train = self._train_loss
        if not self._loss_explained and train is not None and values["loss"] > FAR_ABOVE_TRAIN * max(train, 1e-3):
            line += HIGH_VAL_LOSS
            self._loss_explained = True
        self._print(line)

    def message(self, text: str) -> None:
        if self.enabled:
            self._print(text)

    # -- summary ---------------------------------------------------------------------------------------------
    def summary(self, status: str, fields: dict[str, Any]) -> dict[str, Any]:
        """The summary dict for ``status``; rank 0 also writes it to summary.json (atomically)."""
        summary = {
            **self.static,
            **fields,
            "steps_per_epoch": self.steps_per_epoch,  # with "epochs": the total steps 'status --watch' counts to
            "status": status,
            "wall_s": round(self.prior_wall_s + time.monotonic() - self.started, 3),
            "started_at": self.started_at,
            "updated_at": _now_iso(),
        }
        if self.enabled:
            write_summary(self.run_dir, summary)
        return summary

    def failed(self, exc: BaseException, fields: dict[str, Any]) -> None:
        """Write status "failed" with the error; never raises (the original error matters more)."""
        try:
            error = {"error": f"{type(exc).__name__}: {exc}", "failed_rank": fields.get("global_rank")}
            self.summary("failed", {**fields, **error})
        except Exception as report_error:
            print(f"hpctrain: could not write the failed summary: {report_error}", file=sys.stderr)

    # -- internals -------------------------------------------------------------------------------------------
    def _write_metrics(self, record: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.append(record, now=time.time())

    def _scalars(self, names: dict[str, str], values: dict[str, float], step: int) -> None:
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(tb_dir(self.run_dir)), purge_step=self._purge_step)
        for key, tag in names.items():
            if values.get(key) is not None:
                self._tb.add_scalar(tag, values[key], step)
        self._tb.flush()

    def _show(self, epoch: int, step: int, global_step: int, values: dict[str, float]) -> None:
        remaining = self.epochs * self.steps_per_epoch - global_step
        eta = format_duration(remaining * self._rate_s / self._rate_steps) if self._rate_steps else "?"
        if self._progress is not None:
            stats = (
                f"loss {values['loss']:.4f} top1 {values['top1']:.2f} img/s {_rate(values.get('images_per_s'))} "
                f"data-wait {_share(values.get('data_wait_fraction'))}"
            )
            self._progress.update(
                self._task, completed=global_step, description=f"epoch {epoch + 1}/{self.epochs}", stats=stats
            )
            return
        self._print(
            f"epoch {epoch + 1}/{self.epochs} step {step}/{self.steps_per_epoch} loss {values['loss']:.4f} "
            f"top1 {values['top1']:.2f} img/s {_rate(values.get('images_per_s'))} "
            f"data-wait {_share(values.get('data_wait_fraction'))} eta {eta}"
        )

    def _print(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line)
        else:
            print(line, flush=True)

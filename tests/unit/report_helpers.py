"""Synthetic run, sweep and study directories for the report tests.

metrics.jsonl is written by the trainer's own ``Reporter`` (its record format),
with a simulated clock so that runs span minutes to hours in no time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from hpctrain.contract.rundir import heartbeat_path, spec_path, study_file, write_run_info
from hpctrain.trainer.reporting import Reporter

START = 1_760_000_000.0


class ClockReporter(Reporter):
    """The trainer's Reporter with a simulated clock and no TensorBoard."""

    def __init__(self, run_dir: Path, clock: list[float], static: dict[str, Any]) -> None:
        super().__init__(run_dir, enabled=True, static=static)
        self.clock = clock

    def _scalars(self, names: dict[str, str], values: dict[str, float], step: int) -> None:
        pass

    def _print(self, line: str) -> None:
        pass

    def _write_metrics(self, record: dict[str, Any]) -> None:
        self._metrics.append(record, now=self.clock[0])


def simulate_run(
    run_dir: Path,
    *,
    nodes: int = 1,
    gpus_per_node: int = 2,
    per_device_ips: float = 200.0,
    efficiency: float = 1.0,
    epochs: int = 3,
    steps_per_epoch: int = 20,
    log_every: int = 5,
    batch_per_device: int = 32,
    restart_at: tuple[int, int] | None = None,  # (epoch, step): killed there, resumed from the epoch's start
    downtime_s: float = 600.0,
    desired_acc: float | None = None,
    device: str = "cuda:0",
    job_ids: tuple[str, ...] = ("100",),
) -> dict[str, Any]:
    """Write a complete run directory; returns the numbers it was built from."""
    run_dir.mkdir(parents=True, exist_ok=True)
    devices = nodes * gpus_per_node if gpus_per_node else nodes
    world = devices
    ips = per_device_ips * devices * efficiency
    global_batch = batch_per_device * devices
    step_s = global_batch / ips
    spec = {
        "name": "synthetic",
        "resources": {"nodes": nodes, "gpus_per_node": gpus_per_node, "tasks_per_node": max(1, gpus_per_node)},
        "trainer": {"arch": "resnet50", "epochs": epochs, "batch_size": batch_per_device, "desired_acc": desired_acc},
    }
    spec_path(run_dir).write_text(yaml.safe_dump(spec))
    write_run_info(run_dir, {"name": "synthetic", "job_id": job_ids[-1], "job_ids": list(job_ids), "backend": "slurm"})
    static = {"world_size": world, "num_nodes": nodes, "device": device, "global_batch_size": global_batch}
    clock = [START]
    reporter = ClockReporter(run_dir, clock, static)
    reporter.start(epochs=epochs, steps_per_epoch=steps_per_epoch, global_step=0, resumed=False)
    epoch, restarted, best = 0, False, 0.0
    while epoch < epochs:
        global_step = epoch * steps_per_epoch
        window, killed = 0, False
        for step in range(steps_per_epoch):
            global_step += 1
            window += 1
            last = step + 1 == steps_per_epoch
            if (step + 1) % log_every and not last:
                continue
            warm = 0.5 if step + 1 <= log_every else 1.0  # the first window of an epoch is slow
            clock[0] += window * step_s / warm
            progress = global_step / (epochs * steps_per_epoch)
            values = {
                "loss": 6.9 * math.exp(-2.5 * progress),
                "lr": 0.1 * (1 - progress),
                "top1": 85 * (1 - math.exp(-3 * progress)),
                "top5": 97 * (1 - math.exp(-4 * progress)),
                "images_per_s": ips * warm,
                "data_s": 0.1 * step_s,
                "step_s": step_s / warm,
                "data_wait_fraction": 0.1 if warm == 1.0 else 0.4,
            }
            reporter.train_step(epoch=epoch, step=step + 1, global_step=global_step, values=values, steps=window)
            window = 0
            if restart_at == (epoch, step + 1) and not restarted:
                reporter.summary("running", {"restarts": 0})
                reporter.close()
                clock[0] += downtime_s
                restarted, killed = True, True
                reporter = ClockReporter(run_dir, clock, static)
                reporter.start(
                    epochs=epochs, steps_per_epoch=steps_per_epoch, global_step=epoch * steps_per_epoch, resumed=True
                )
                break
        if killed:
            continue
        top1 = 80 * (1 - math.exp(-(epoch + 1) / 1.5))
        best = max(best, top1)
        reporter.epoch_end(epoch=epoch, global_step=global_step, values={**values, "images_per_s": ips})
        clock[0] += 30.0
        reporter.validation(
            epoch=epoch, global_step=global_step, values={"top1": top1, "top5": 95.0, "loss": 1.0}, best_top1=best
        )
        epoch += 1
    fields = {"restarts": 1 if restarted else 0, "best_val_top1": best, "train_images_per_s": ips}
    reporter.summary("completed", fields)
    reporter.close()
    return {"ips": ips, "devices": devices, "step_s": step_s, "global_batch": global_batch, "best": best}


def write_heartbeats(run_dir: Path, medians: list[float]) -> None:
    for rank, median in enumerate(medians):
        path = heartbeat_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        beat = {"rank": rank, "node": f"n{rank // 2 + 1}", "step": 60, "phase": "done", "step_time_median_s": median}
        path.write_text(json.dumps(beat))


def make_study(study_dir: Path, efficiencies: dict[int, float], **run: Any) -> dict[int, dict[str, Any]]:
    """A study over resources.nodes with one run directory per point (the contract's study.json)."""
    study_dir.mkdir(parents=True, exist_ok=True)
    points, built = [], {}
    for nodes, efficiency in efficiencies.items():
        label = f"nodes-{nodes}"
        built[nodes] = simulate_run(study_dir / label, nodes=nodes, efficiency=efficiency, **run)
        gpn = run.get("gpus_per_node", 2)
        points.append(
            {
                "label": label,
                "values": {"resources.nodes": nodes},
                "run_dir": label,
                "job_id": str(100 + nodes),
                "nodes": nodes,
                "gpus_per_node": gpn,
                "tasks_per_node": gpn,
                "world_size": nodes * gpn,
                "global_batch": built[nodes]["global_batch"],
            }
        )
    study = {
        "kind": "study",
        "version": 1,
        "name": "synthetic",
        "study_id": study_dir.name,
        "created_at": "2026-01-01T00:00:00+00:00",
        "axes": {"resources.nodes": list(efficiencies)},
        "points": points,
    }
    study_file(study_dir).write_text(json.dumps(study, indent=2))
    return built

"""A run directory as the trainer leaves it after restarts, for the tracking tests (unit and real servers).

``craft_run``: attempt 1 logs steps 1-10 and checkpoints at 6; it is killed hard
(a lost node at step 9); attempt 2 resumes from 6, so it logs 7-10 again with
other values, then goes on to 15 and a validation. The last value of each step
is ``last_loss(step)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRACKING_ID = "abcdef0123456789"


def first_loss(step: int) -> float:
    return 10.0 - step


def last_loss(step: int) -> float:
    return first_loss(step) if step <= 6 else 100.0 - step


def metric_line(step: int, loss: float, time: float, kind: str = "train_step") -> str:
    return json.dumps({"kind": kind, "epoch": 0, "step": step, "global_step": step, "loss": loss, "time": time}) + "\n"


def write_checkpoint(run: Path, step: int) -> None:
    folder = run / "checkpoints" / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.pt").write_bytes(b"x" * 10)
    meta = {"format_version": 1, "files": {"state.pt": {"size": 10}}, "global_step": step}
    (folder / "meta.json").write_text(json.dumps(meta))


def write_summary(run: Path, status: str, **more: Any) -> None:
    summary = {
        "status": status,
        "restarts": 1,
        "node_failures": [{"node": "c2", "kind": "lost", "step": 9, "action": "requeue"}],
        **more,
    }
    (run / "summary.json").write_text(json.dumps(summary))


def craft_run(run: Path, tracking: dict[str, Any], *, status: str = "running", last: int = 15) -> Path:
    run.mkdir(parents=True)
    spec = {"name": "trk", "trainer": {"lr": 0.1, "epochs": 1}, "tracking": tracking}
    (run / "spec.yaml").write_text(json.dumps(spec))
    (run / "run.json").write_text(json.dumps({"tracking_id": TRACKING_ID, "job_ids": ["101"]}))
    lines = [metric_line(step, first_loss(step), 1000.0 + step) for step in range(1, 11)]
    lines += [metric_line(step, last_loss(step), 2000.0 + step) for step in range(7, last + 1)]
    lines.append(json.dumps({"kind": "val", "epoch": 0, "global_step": last, "top1": 50.0, "time": 3000.0}) + "\n")
    (run / "metrics.jsonl").write_text("".join(lines))
    write_checkpoint(run, 6)
    write_summary(run, status)
    return run

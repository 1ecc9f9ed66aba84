"""Does a tracking server that is down slow training with ``tracking.live`` on? (issue 38: ratio <= 1.02)

The same small local run (the built-in trainer, 1 node x 1 CPU rank, ResNet-18 at 32 px, a step logged
each step) with ``tracking.live: true`` and ``live_interval_s: 5``, its MLflow server either up (a real
``mlflow server``, SQLite store, on 127.0.0.1) or down (a port where nothing listens), alternating the
order each repeat. It reports each run's median logged ``step_s`` and the ratio down / up per repeat, and
whether the server-up runs' steps all reached MLflow (the sender working, not idle).

    .venv/bin/python benchmarks/tracker_down.py --repeats 3 --steps 60

Needs mlflow (``pip install 'hpctrain[mlflow]'`` plus the ``mlflow`` server command). Takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SPEC = """\
name: bench
cluster: local
output_dir: {out}
resources: {{nodes: 1, tasks_per_node: 1, time: "01:00:00"}}
trainer: {{arch: resnet18, strategy: single, epochs: 1, batch_size: 16, log_every_steps: 1,
          max_steps_per_epoch: {steps}}}
data: {{root: {data}, image_size: 32, workers: 0}}
checkpoint: {{every_steps: 10}}
tracking:
  mlflow: {{tracking_uri: "{uri}", experiment: bench}}
  live: true
  live_interval_s: 5
"""


def one_run(folder: Path, data: Path, uri: str, steps: int) -> dict[str, Any]:
    folder.mkdir(parents=True)
    spec = folder / "spec.yaml"
    spec.write_text(SPEC.format(out=folder / "runs", data=data, uri=uri, steps=steps))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", str(spec), "--local", "--no-snapshot"],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"the run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    [run_dir] = (folder / "runs" / "bench").iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    step_s = [r["step_s"] for r in records if r.get("kind") == "train_step" and "step_s" in r][3:]  # warm-up out
    live_path = run_dir / ".hpctrain" / "tracking" / "live.json"
    live = json.loads(live_path.read_text()) if live_path.exists() else {}
    return {"median_step_s": statistics.median(step_s), "steps": len(step_s), "live": live}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    from hpctrain.dataset.generate import make_dataset
    from tests.net_helpers import free_port
    from tests.tracking_helpers import mlflow_server

    report: dict[str, Any] = {"loadavg_start": os.getloadavg(), "repeats": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        make_dataset(data, classes=4, per_class=(args.steps * 16) // 4 + 8, val_per_class=4, image_size=32)
        with mlflow_server(Path(tmp) / "mlflow") as up:
            down = f"http://127.0.0.1:{free_port()}"
            for repeat in range(args.repeats):
                order = [("up", up), ("down", down)][:: 1 if repeat % 2 == 0 else -1]
                found = {name: one_run(Path(tmp) / f"{repeat}-{name}", data, uri, args.steps) for name, uri in order}
                ratio = found["down"]["median_step_s"] / found["up"]["median_step_s"]
                report["repeats"].append({"order": [name for name, _ in order], "ratio_down_up": ratio, **found})
                print(json.dumps(report["repeats"][-1]), flush=True)
    ratios = [r["ratio_down_up"] for r in report["repeats"]]
    report.update(median_ratio=statistics.median(ratios), loadavg_end=os.getloadavg())
    print(json.dumps({k: v for k, v in report.items() if k != "repeats"}))


if __name__ == "__main__":
    main()

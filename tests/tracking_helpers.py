"""A run directory as the trainer leaves it after restarts, for the tracking tests (unit and real servers).

``craft_run``: attempt 1 logs steps 1-10 and checkpoints at 6; it is killed hard
(a lost node at step 9); attempt 2 resumes from 6, so it logs 7-10 again with
other values, then goes on to 15 and a validation. The last value of each step
is ``last_loss(step)``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.net_helpers import free_port

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


@contextlib.contextmanager
def mlflow_server(
    home: Path, start_timeout_s: float = 180, *, host: str = "127.0.0.1", wait: bool = True
) -> Iterator[str]:
    """A real ``mlflow server`` on ``host`` with a SQLite store under ``home``; its URI. Stopped after.

    ``host``: 127.0.0.1 serves this machine only; the Slurm test cluster's nodes live in network namespaces
    of their own and reach this machine at its bridge address (tests/slurm/conftest.py's ``HOST_ADDR``).
    ``wait=False`` yields the URI at once, while the server starts (its 6-10 s overlap what the caller does
    meanwhile, such as a Slurm job starting); :func:`wait_serving` waits for it later.
    """
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{home}/db.sqlite",
        "--artifacts-destination", str(home / "artifacts"), "--host", host, "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    log = (home / "server.log").open("w")
    # Without MLflow's job execution (on by default since 3.x): a job runner and a Huey consumer per job
    # kind, ~10 processes that no test uses and that took ~100 s of CPU per 13 minutes of CI (docs/testing.md)
    environment = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=home, env=environment
    )
    uri = f"http://{host}:{port}"
    try:
        if wait:
            try:
                wait_serving(uri, start_timeout_s, process)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}:\n" + (home / "server.log").read_text()[-3000:]) from None
        yield uri
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def wait_serving(uri: str, timeout_s: float = 180, process: subprocess.Popen | None = None) -> None:
    """Wait until the MLflow server at ``uri`` answers its health check (``process``: fail as soon as it ends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
            raise RuntimeError(f"the mlflow server at {uri} did not start (its server.log says why)")
        time.sleep(0.5)


def last_values(metrics: Path, field: str = "loss") -> dict[int, float]:
    """metrics.jsonl's last value of ``field`` for each train_step's global step (the one that counts)."""
    values = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "train_step" and field in record:
            values[record["global_step"]] = record[field]
    return values


def wandb_records(folder: Path) -> list[dict[str, Any]]:
    """The records of the one W&B offline run under ``folder``, as W&B's own reader (wandb-core) prints them."""
    [log] = folder.glob("offline-run-*/run-*.wandb")
    inspected = subprocess.run(
        [str(Path(sys.executable).parent / "wandb"), "leet", "inspect", str(log), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert inspected.returncode == 0, inspected.stderr
    return [json.loads(line) for line in inspected.stdout.splitlines() if line.strip()]

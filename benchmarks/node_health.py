"""Sick nodes on the test cluster: what the burn-in costs and catches, and what slow-node eviction gains.

Needs the Slurm test cluster (root, namespaces); 5 nodes; hold its lock:

    flock /tmp/hpctrain-slurm.lock .venv/bin/python benchmarks/node_health.py --repeats 10

The job: 4 nodes x 1 gloo rank (ResNet-18, 32 px, batch 2), as in tests/slurm/test_node_health_e2e.py.
A node is slowed with ``slurm-cluster slow n3 --cpu-pct P`` (a CFS quota on every process of it).

* burn-in: one job runs the burn-in's probes ``--repeats`` times in a row
  (benchmarks/node_health_job.py) on a healthy cluster (false alarms: any node flagged), and one
  with n3 slowed to ``--pct`` % of a core (detected: n3 flagged; any other node flagged is a
  false alarm too); the probes' seconds per burn-in, and the setup (model build) once per start;
* eviction: a training job with a spare (``health.eviction.window_s`` 10 s, ``min_steps`` 3),
  n3 slowed after the first checkpoint: seconds from the slow-down to the eviction record, and
  the job's img/s before the slow-down and after the eviction; the same job without a spare or
  eviction (burn-in off) gives the img/s while slowed.

Every number comes with the load average before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm.hpctrain_cli import hpctrain  # noqa: E402 (the checkout's tests package)
from tests.slurm.stop_helpers import Run, latest_step, wait_for  # noqa: E402

SCRIPT = REPO / "tests" / "cluster" / "slurm-cluster"
STATE_DIR = Path(os.environ.get("HPCTRAIN_SLURM_STATE", "/tmp/hpctrain-slurm"))
SLOW = "n3"
BASE = (
    "resources.nodes=4",
    "resources.tasks_per_node=1",
    "trainer.batch_size=2",
    "distributed.heartbeat_interval_s=2",
)


def cluster(*args: str) -> None:
    subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True, timeout=600)


def client_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(SLURM_CONF=str(STATE_DIR / "etc" / "slurm.conf"), XDG_STATE_HOME=str(work / "state"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["HPCTRAIN_CONFIG_DIR"] = str(work / "config")
    return env


def submit(env: dict[str, str], work: Path, name: str, *sets: str) -> Run:
    args = []
    for item in (f"name={name}", f"data.root={work / 'data'}", f"output_dir={work / 'runs'}", *BASE, *sets):
        args += ["--set", item]
    flags = ("--json", "--no-exclude", "--no-snapshot")  # the entry point is this checkout's benchmarks package
    done = hpctrain(env, "submit", "jobs/smoke_2x2_cpu.yaml", *flags, *args, timeout=120)
    assert done.returncode == 0, done
    report = done.json()
    return Run(report["job_id"], Path(report["run_dir"]))


def wait_done(env: dict[str, str], run: Run, timeout: float = 1200) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "State", "-j", run.job_id], env=env, capture_output=True, text=True
        ).stdout.split()
        if out and out[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return out[0]
        time.sleep(1)
    raise TimeoutError(f"job {run.job_id} did not end in {timeout} s")


def burn_ins(
    env: dict[str, str], work: Path, name: str, repeats: int, slow_pct: float | None, layout: str = "4x1"
) -> list[dict]:
    nodes, tasks = layout.split("x")
    if slow_pct is not None:
        cluster("slow", SLOW, "--cpu-pct", str(slow_pct))
    try:
        run = submit(
            env,
            work,
            name,
            "entrypoint=benchmarks.node_health_job:repeat_burn_in",
            f"entrypoint_args.repeats={repeats}",
            "health.burn_in.enabled=false",
            f"resources.nodes={nodes}",
            f"resources.tasks_per_node={tasks}",
        )
        state = wait_done(env, run)
    finally:
        if slow_pct is not None:
            cluster("slow", SLOW, "--off")
    path = run.run_dir / "bench-burn-in.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    print(f"{name}: job {run.job_id} {state}, {len(records)} burn-ins", flush=True)
    return records


def train_steps(run: Run) -> list[dict[str, Any]]:
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, filter(str.strip, lines)) if r.get("kind") == "train_step"]


def rate(records: list[dict[str, Any]], start: float, end: float) -> float | None:
    values = [r["images_per_s"] for r in records if start <= r["time"] < end and r.get("images_per_s")]
    return statistics.median(values) if values else None


def eviction(env: dict[str, str], work: Path, pct: float, spare: bool, epochs: int = 6) -> dict[str, Any]:
    sets = [
        f"trainer.epochs={epochs}",
        "trainer.max_steps_per_epoch=16",
        "checkpoint.every_steps=4",
        "trainer.log_every_steps=1",
    ]
    if spare:
        sets += ["resources.spare_nodes=1", "health.eviction.window_s=10", "health.eviction.min_steps=3"]
    else:
        sets += ["health.burn_in.enabled=false"]
    run = submit(env, work, "evict" if spare else "plain", *sets)
    wait_for(lambda: latest_step(run.run_dir) >= 4, "the first checkpoint", 600, run)
    time.sleep(5)
    slowed_at = time.time()
    cluster("slow", SLOW, "--cpu-pct", str(pct))
    try:
        wait_done(env, run)
    finally:
        cluster("slow", SLOW, "--off")
    summary = run.summary()
    records = train_steps(run)
    found: dict[str, Any] = {"before_img_s": rate(records, 0, slowed_at)}
    evictions = summary.get("evictions") or []
    if spare and evictions:
        found["slow_to_eviction_s"] = evictions[0]["time"] - slowed_at
        found["after_img_s"] = rate(records, evictions[0]["time"] + 10, float("inf"))  # the relaunch's steps
        found["ratio"] = evictions[0].get("ratio")
    elif not spare:
        found["slowed_img_s"] = rate(records, slowed_at + 5, float("inf"))
    print(f"{'evict' if spare else 'plain'}: {found}", flush=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="burn-ins per job (healthy, then slowed)")
    parser.add_argument(
        "--pct", type=float, action="append", help="the slow node's share of one core, percent (default 25 and 10)"
    )
    parser.add_argument(
        "--evict-pct", type=float, default=10.0, help="the slow node's share of a core, eviction jobs (default 10)"
    )
    parser.add_argument(
        "--evict-epochs",
        type=int,
        default=6,
        help="epochs of 16 steps of the eviction jobs (default 6; more leaves steps after a slower eviction)",
    )
    parser.add_argument("--skip-eviction", action="store_true")
    parser.add_argument("--skip-burn-in", action="store_true", help="only the eviction jobs")
    parser.add_argument("--work", type=Path, default=Path("/tmp/hpctrain-bench-node-health"))
    args = parser.parse_args()
    cluster("up", "--nodes", "5")
    env = client_env(args.work)
    if not (args.work / "data").is_dir():
        made = hpctrain(
            env, "make-dataset", str(args.work / "data"), "--classes", "4", "--per-class", "32", "--image-size", "32"
        )
        assert made.returncode == 0, made
    print(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    results: dict[str, Any] = {}
    try:
        if not args.skip_burn_in:
            results.update(burn_in_numbers(env, args))
        if not args.skip_eviction:
            results["eviction"] = eviction(env, args.work, args.evict_pct, spare=True, epochs=args.evict_epochs)
            results["plain"] = eviction(env, args.work, args.evict_pct, spare=False, epochs=args.evict_epochs)
    finally:
        cluster("down")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}", flush=True)
    print(json.dumps(results, indent=2))
    return 0


def burn_in_numbers(env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    healthy = burn_ins(env, args.work, "healthy", args.repeats, None)
    pairs = burn_ins(env, args.work, "healthy-2x2", args.repeats, None, layout="2x2")  # the CI tests' shape
    shares = args.pct or [25.0, 10.0]
    results["false_alarms"] = f"{sum(bool(r['flagged']) for r in healthy)} of {len(healthy)} healthy burn-ins"
    results["false_alarms_2x2"] = f"{sum(bool(r['flagged']) for r in pairs)} of {len(pairs)} (2 nodes x 2 ranks)"
    results["healthy_reasons"] = [s["reason"] for r in healthy + pairs for s in r["scores"] if s["flagged"]]
    seconds = [r["seconds"] for r in healthy + pairs]
    for pct in shares:
        slowed = burn_ins(env, args.work, f"slowed-{pct:g}", args.repeats, pct)
        caught = sum(r["flagged"] == [SLOW] for r in slowed)
        others = sum(bool(set(r["flagged"]) - {SLOW}) for r in slowed)
        results[f"detected_{pct:g}pct"] = f"{caught} of {len(slowed)}; other nodes flagged in {others}"
        ratios = [
            s["compute_ms"] / statistics.median(o["compute_ms"] for o in r["scores"] if o["node"] != SLOW)
            for r in slowed
            for s in r["scores"]
            if s["node"] == SLOW and s.get("compute_ms")
        ]
        results[f"slow_compute_ratio_{pct:g}pct"] = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else None
        seconds += [r["seconds"] for r in slowed]
    results["burn_in_s"] = f"median {statistics.median(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f})"
    results["setup_s_per_start"] = [r["phases_s"].get("setup", 0.0) for r in healthy[:1] + pairs[:1]]
    return results


if __name__ == "__main__":
    sys.exit(main())

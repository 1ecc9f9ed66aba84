"""How fast does a run go on after a node dies: healing inside the allocation vs the requeue path,
and what the supervision costs a run that loses nothing.

Needs the Slurm test cluster (root, namespaces) with 3 nodes; hold its lock:

    flock /tmp/hpctrain-slurm.lock .venv/bin/python benchmarks/node_loss.py --repeats 3

Each repeat trains the stop tests' small 2 x 2 CPU job (tests/slurm/stop_helpers.py),
waits for its first checkpoint, and kills every process of node n2's namespace (slurmd
included: a power loss). It measures the seconds from the kill to the next training step
recorded in metrics.jsonl:

* heal: ``resources.spare_nodes=1``: the supervisor continues on n1,n3;
* requeue: a plain job: srun waits for Slurm's node-failure detection (SlurmdTimeout 30 s on the test
  cluster, 300 s by default), Slurm requeues the job, and the benchmark releases it at once
  (Slurm holds a requeued job ~120 s, and a real queue adds its wait: both left out);
* expedite (``--expedite-repeats``, Slurm 25.11+: ``--slurm 26.05``): the same plain job with
  ``resources.expedited_requeue=true``: Slurm requeues it at once, first in line, and nothing is
  released (docs/preemption.md, "Expedited requeue").

Overhead: plain and supervised runs without a loss, in pairs (which runs first alternates): the
median step time of each (metrics.jsonl ``step_s``) and their ratio, and the supervisor's own CPU
time over its run's wall time. The summary gives each number's median and range over the repeats,
and the load average before and after (a shared machine: say so when it was loaded).
The cluster is left as found (2 nodes) unless ``--keep``.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm.stop_helpers import (  # noqa: E402 (the checkout's tests package)
    Run,
    Workspace,
    latest_step,
    make_workspace,
    submit,
    wait_for,
)
from tests.slurm.stop_helpers import kill_node as power_off  # noqa: E402 (the benchmark's kill_node times it)

SCRIPT = REPO / "tests" / "cluster" / "slurm-cluster"
STATE_DIR = Path(os.environ.get("HPCTRAIN_SLURM_STATE", "/tmp/hpctrain-slurm"))
LONGER = ("trainer.epochs=4", "trainer.max_steps_per_epoch=8")


class Cluster:
    def __init__(self, slurm: str | None = None) -> None:
        self.slurm = slurm
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(STATE_DIR / "etc" / "slurm.conf")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        self.env = env

    def up(self, nodes: int) -> None:
        version = ["--slurm", self.slurm] if self.slurm else []
        subprocess.run(
            [sys.executable, str(SCRIPT), "up", "--nodes", str(nodes), *version], check=True, capture_output=True
        )

    def run(self, *args: str) -> str:
        return subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=60).stdout

    def state(self, job_id: str) -> str:
        out = self.run("sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id).split()
        return out[0] if out else ""

    def wait_done(self, job_id: str, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return state
            time.sleep(1)
        raise TimeoutError(f"job {job_id} still {self.state(job_id)} after {timeout} s")


def kill_node(node: str) -> float:
    """A power loss of ``node`` (``stop_helpers.kill_node``); the wall time of the kill."""
    killed_at = time.time()
    power_off(node)
    return killed_at


def train_records(run_dir: Path) -> list[dict]:
    records = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("kind") == "train_step":
                records.append(record)
    return records


def next_step_after(run_dir: Path, when: float, resumed_from: int) -> float | None:
    """Seconds from ``when`` to the first training step of a start that resumed from step ``resumed_from``
    (a step that was in flight at ``when`` is not the next one)."""
    try:
        later = [r["time"] for r in train_records(run_dir) if r["time"] > when and r["global_step"] == resumed_from + 1]
    except (OSError, ValueError, KeyError):
        return None
    return min(later) - when if later else None


def loss_repeat(
    cluster: Cluster, ws: Workspace, name: str, *sets: str, requeue: bool = False, release: bool = True
) -> float:
    cluster.up(3)  # a node killed before comes back
    run = submit(ws, f"name={name}", *LONGER, *sets)
    wait_for(lambda: latest_step(run.run_dir) >= 2, "the first checkpoint", 300, run)
    killed_at = kill_node("n2")
    resumed_from = latest_step(run.run_dir)
    if requeue and release:
        wait_for(lambda: "PENDING" in cluster.run("squeue", "-h", "-j", run.job_id, "-o", "%T"), "requeue", 300, run)
        cluster.run("scontrol", "update", f"JobId={run.job_id}", "StartTime=now")
    seconds = wait_for(
        lambda: next_step_after(run.run_dir, killed_at, resumed_from), "the next training step", 600, run, 0.5
    )
    cluster.run("scancel", run.job_id)
    cluster.wait_done(run.job_id)
    return seconds


def supervisor_cpu_s(job_id: str) -> float:
    """utime + stime of this job's supervisor process (the batch step's python)."""
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        try:
            if b"hpctrain.healing.supervisor" not in (entry / "cmdline").read_bytes():
                continue
            if f"SLURM_JOB_ID={job_id}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, ValueError, IndexError):
            continue
    return float("nan")


def overhead_repeat(cluster: Cluster, ws: Workspace, index: int) -> dict[str, float]:
    cluster.up(3)
    found: dict[str, float] = {}
    pair = [("plain", ()), ("supervised", ("resources.spare_nodes=1",))]
    for label, sets in pair if index % 2 == 0 else pair[::-1]:  # alternate which runs first
        run: Run = submit(ws, f"name=overhead-{label}-{index}", *LONGER, *sets)
        cpu, started = 0.0, time.monotonic()
        while cluster.state(run.job_id) not in ("COMPLETED", "FAILED", "CANCELLED"):
            if label == "supervised":
                value = supervisor_cpu_s(run.job_id)
                cpu = value if value == value else cpu  # the last reading before it ends
            time.sleep(0.5)
        wall = time.monotonic() - started
        found[f"{label}_step_s"] = statistics.median(r["step_s"] for r in train_records(run.run_dir))
        if label == "supervised":
            found["supervisor_cpu_share"] = cpu / wall
    found["ratio"] = found["supervised_step_s"] / found["plain_step_s"]
    return found


def spread(values: list[float], unit: str = " s", digits: int = 1) -> str:
    """``median 29.0 s (28.5-31.2 s, 3 repeats)``."""
    if not values:
        return "not measured"
    low, high, mid = min(values), max(values), statistics.median(values)
    return f"median {mid:.{digits}f}{unit} ({low:.{digits}f}-{high:.{digits}f}{unit}, {len(values)} repeats)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requeue-repeats", type=int, default=2)
    parser.add_argument("--overhead-repeats", type=int, default=3)
    parser.add_argument("--expedite-repeats", type=int, default=0, help="Slurm 25.11+ only (--slurm 26.05)")
    parser.add_argument("--slurm", help="the test cluster's Slurm version (slurm-cluster up --slurm)")
    parser.add_argument("--keep", action="store_true", help="leave the 3-node cluster up")
    parser.add_argument("--work", type=Path, default=Path("/tmp/hpctrain-bench-node-loss"))
    args = parser.parse_args()
    cluster = Cluster(args.slurm)
    cluster.up(3)
    ws = make_workspace(cluster, args.work)  # type: ignore[arg-type]
    heal: list[float] = []
    requeue: list[float] = []
    expedite: list[float] = []
    ratios: list[float] = []
    cpu: list[float] = []
    print(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    try:
        for k in range(args.repeats):
            heal.append(loss_repeat(cluster, ws, f"heal-{k}", "resources.spare_nodes=1"))
            print(f"heal {k}: node death -> next training step: {heal[-1]:.1f} s", flush=True)
        for k in range(args.requeue_repeats):
            requeue.append(loss_repeat(cluster, ws, f"requeue-{k}", requeue=True))
            print(f"requeue {k}: node death -> next training step: {requeue[-1]:.1f} s", flush=True)
        for k in range(args.expedite_repeats):
            sets = ("resources.expedited_requeue=true",)
            expedite.append(loss_repeat(cluster, ws, f"expedite-{k}", *sets, requeue=True, release=False))
            print(f"expedite {k}: node death -> next training step: {expedite[-1]:.1f} s", flush=True)
        for k in range(args.overhead_repeats):
            found = overhead_repeat(cluster, ws, k)
            ratios.append(found["ratio"])
            cpu.append(100 * found["supervisor_cpu_share"])
            print(
                f"overhead {k}: median step plain {found['plain_step_s']:.3f} s, supervised "
                f"{found['supervised_step_s']:.3f} s, ratio {found['ratio']:.3f}; supervisor CPU "
                f"{cpu[-1]:.2f} % of one core",
                flush=True,
            )
    finally:
        if not args.keep:
            cluster.up(2)
    print(f"heal in the allocation: {spread(heal)}")
    print(f"requeue path (hold released at once): {spread(requeue)}")
    if expedite:
        print(f"requeue path, expedited (nothing released): {spread(expedite)}")
    print(f"median step supervised / plain: {spread(ratios, unit='', digits=3)}")
    print(f"supervisor CPU, % of one core: {spread(cpu, unit=' %', digits=2)}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())

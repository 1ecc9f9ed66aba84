"""Injected causes on the test cluster: how often `hpctrain report` names the right one as the largest loss.

Needs the Slurm test cluster up with three nodes or more (root, namespaces); hold its lock:

    slurm-cluster up --nodes 3
    flock /tmp/hpctrain-slurm.lock .venv/bin/python benchmarks/scaling_causes.py --repeats 3

(Instance 1: HPCTRAIN_SLURM_INSTANCE=1 and its lock /tmp/hpctrain-slurm-1.lock.)

The job: the smoke spec on 3 nodes x 1 gloo rank (ResNet-18, 32 px, 8 images per
rank, 6 steps), with the burn-in on but its margins out of reach (it records the
nodes' numbers and flags nobody: the report is what is measured here, not the
burn-in's own flagging, which benchmarks/node_health.py measures). Each repeat
runs every case once, in this order, the second node being the sick one:

* clean: nothing injected; *right* = no cause pinned on a node (a straggler or
  a slow link); any cause at all is counted apart (gloo on shared cores does
  not hide the all-reduce, so exposed communication is often named, truly);
* node-25 / node-10: ``slurm-cluster slow NODE --cpu-pct 25 / 10``; right = the
  largest cause is a straggler on NODE;
* link-400 / link-100: ``slurm-cluster slow-link NODE --rate 400mbit / 100mbit``;
  right = the largest cause is a slow link on NODE.

Slow data is not a case: the test bed has no throttled file system for Slurm jobs
(``--shared`` serves data over sshfs, which a slow link slows too; the local
tests' slow loader is tests/local/test_step_split.py). Prints one line per run and
a table; ``--json FILE`` writes every run's numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster_scripts import load_cluster_script  # noqa: E402 (the checkout's tests package)
from tests.slurm.hpctrain_cli import hpctrain  # noqa: E402

CLUSTER = load_cluster_script("slurm-cluster")
SCRIPT = REPO / "tests" / "cluster" / "slurm-cluster"
STATE_DIR = Path(os.environ.get("HPCTRAIN_SLURM_STATE", CLUSTER.DEFAULT_STATE_DIR))
CASES: dict[str, tuple[str, ...]] = {
    "clean": (),
    "node-25": ("slow", "--cpu-pct", "25"),
    "node-10": ("slow", "--cpu-pct", "10"),
    "link-400": ("slow-link", "--rate", "400mbit"),
    "link-100": ("slow-link", "--rate", "100mbit"),
}
EXPECTED = {"node": "straggler", "link": "link"}  # case prefix -> the cause part that must come first
SETS = (
    "resources.nodes=3",
    "resources.tasks_per_node=1",
    "trainer.epochs=1",
    "trainer.max_steps_per_epoch=6",
    "trainer.log_every_steps=2",
    "health.burn_in.budget_s=6",
    "health.burn_in.margin=100",
    "health.burn_in.network_margin=100",
    "health.eviction.enabled=false",
)
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


def cluster(*args: str) -> None:
    subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True, timeout=120)


def client_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(SLURM_CONF=str(STATE_DIR / "etc" / "slurm.conf"), XDG_STATE_HOME=str(work / "state"))
    env["PATH"] = os.pathsep.join(p for p in (str(CLUSTER.WRAPPER_DIR), env.get("PATH")) if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def wait_done(env: dict[str, str], job_id: str, timeout: float = 900) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id], env=env, capture_output=True, text=True
        ).stdout.split()
        if out and out[0].split()[0] in FINAL:
            return out[0]
        time.sleep(2)
    return "WAITED"


def one_run(env: dict[str, str], work: Path, case: str, node: str, index: int) -> dict[str, Any]:
    args = []
    for item in (f"name={case}-{index}", f"data.root={work / 'data'}", f"output_dir={work / 'runs'}", *SETS):
        args += ["--set", item]
    inject = CASES[case]
    if inject:
        cluster(inject[0], node, *inject[1:])
    started = time.monotonic()
    try:
        done = hpctrain(env, "submit", "jobs/smoke_2x2_cpu.yaml", "--json", *args, timeout=120)
        assert done.returncode == 0, done
        job_id, run_dir = done.json()["job_id"], Path(done.json()["run_dir"])
        state = wait_done(env, job_id)
    finally:
        if inject:
            cluster(inject[0], node, "--off")
    result: dict[str, Any] = {"case": case, "state": state, "seconds": round(time.monotonic() - started, 1)}
    return judged(env, work, result | {"run_dir": str(run_dir)}, node)


def judged(env: dict[str, str], work: Path, result: dict[str, Any], node: str) -> dict[str, Any]:
    """``result`` with what ``hpctrain report --json`` says about its run now."""
    run_dir = Path(result["run_dir"])
    shown = hpctrain(env, "report", str(run_dir), "--out", str(work / "reports" / run_dir.name), "--json")
    if shown.returncode != 0:
        return result | {"error": shown.stderr[-500:]}
    waterfall = json.loads(shown.stdout).get("waterfall") or {}
    found = waterfall.get("causes") or []
    bars = waterfall.get("bars") or []
    result["causes"] = [(c["part"], c.get("nodes", [])) for c in found]
    result["step_s"] = bars[0]["actual_s"] if bars else None
    result["losses"] = {x["part"]: round(x["fraction"], 3) for x in bars[0]["losses"]} if bars else {}
    result["right"] = judge(result["case"], found, node)
    return result


def judge(case: str, found: list[dict[str, Any]], node: str) -> bool:
    if case == "clean":
        return not any(c.get("nodes") for c in found)
    want = EXPECTED[case.split("-")[0]]
    return bool(found) and found[0]["part"] == want and found[0].get("nodes") == [node]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/hpctrain-scaling-causes"))
    parser.add_argument("--json", type=Path, help="write every run's numbers here")
    parser.add_argument("--again", action="store_true", help="no new runs: report every run under WORK/runs again")
    args = parser.parse_args()
    record = json.loads((STATE_DIR / "cluster.json").read_text())
    nodes = record.get("nodes", [])
    if len(nodes) < 3 or not record.get("up"):
        print(f"needs the test cluster up with 3 nodes or more (state dir {STATE_DIR})", file=sys.stderr)
        return 2
    sick = nodes[1]
    args.work.mkdir(parents=True, exist_ok=True)
    os.chmod(args.work, 0o755)
    env = client_env(args.work)
    if not (args.work / "data").is_dir():
        made = hpctrain(env, "make-dataset", str(args.work / "data"), "--classes", "4", "--per-class", "36")
        assert made.returncode == 0, made
    results = []
    if args.again:
        for run_dir in sorted((args.work / "runs").glob("*/*/")):
            case = run_dir.parent.name.rsplit("-", 1)[0]
            results.append(judged(env, args.work, {"case": case, "run_dir": str(run_dir)}, sick))
            print(json.dumps(results[-1]), flush=True)
    for index in range(0 if args.again else args.repeats):
        for case in args.cases:
            result = one_run(env, args.work, case, sick, index)
            results.append(result)
            print(json.dumps(result), flush=True)
    print("\n| case | runs | right | any cause named | step (s), range |\n|---|---|---|---|---|")
    for case in dict.fromkeys(r["case"] for r in results):
        mine = [r for r in results if r["case"] == case]
        steps = [r["step_s"] for r in mine if r.get("step_s")]
        span = f"{min(steps):.2f}-{max(steps):.2f}" if steps else "-"
        named = sum(bool(r.get("causes")) for r in mine)
        print(f"| {case} | {len(mine)} | {sum(bool(r.get('right')) for r in mine)} | {named} | {span} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

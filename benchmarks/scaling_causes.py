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

* data-1m / data-256k / data-128k: ``slurm-cluster slow-share --rate 1mbit / 256kbit / 128kbit``: the data
  set lies in the cluster's shared folder (``up --shared DIR``, read over sshfs)
  and the file server sends at that rate to all nodes together; right = the
  largest cause is data wait (on no node). Needs the cluster up with ``--shared``.

``--study``: every case is a 1/2/4-node study instead (``study: resources.nodes:
[1, 2, 4]``, submitted while a blocking job holds every node, then held and
released one after another, so that the points do not share the cores), judged
as ``hpctrain report STUDY_DIR`` judges it (the causes at the largest scale);
the slow node is the second, which the 1-node point does not have. Needs four
nodes. With ``--shared`` every case reads its data from the shared folder.

Prints one line per run and a table; ``--json FILE`` writes every run's numbers.
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
    "data-1m": ("slow-share", "--rate", "1mbit"),
    "data-128k": ("slow-share", "--rate", "128kbit"),
    "data-256k": ("slow-share", "--rate", "256kbit"),
}
EXPECTED = {"node": "straggler", "link": "link", "data": "data"}  # case prefix -> the part that must come first
ON_NODE = {"node", "link"}
NODES: list[str] = []  # the cluster's nodes  # the causes named on the sick node
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


def inject(case: str, node: str, off: bool = False) -> None:
    how = CASES[case]
    if how:
        where = () if how[0] == "slow-share" else (node,)
        cluster(how[0], *where, *(("--off",) if off else how[1:]))


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


def study_spec(work: Path) -> Path:
    """The smoke spec with a 1/2/4-node study axis (one Slurm job per point)."""
    spec = work / "study_causes.yaml"
    text = (REPO / "jobs" / "smoke_2x2_cpu.yaml").read_text()
    spec.write_text(text + "\nstudy:\n  resources.nodes: [1, 2, 4]\n")
    return spec


def one_run(
    env: dict[str, str], work: Path, data: Path, case: str, node: str, index: int, study: bool
) -> dict[str, Any]:
    args = []
    sets = [s for s in SETS if not (study and s.startswith("resources.nodes="))]
    for item in (f"name={case}-{index}", f"data.root={data}", f"output_dir={work / 'runs'}", *sets):
        args += ["--set", item]
    spec = str(study_spec(work)) if study else "jobs/smoke_2x2_cpu.yaml"
    inject(case, node)
    started = time.monotonic()
    try:
        blocker = block_nodes(env) if study else None
        try:
            done = hpctrain(env, "submit", spec, "--json", *args, timeout=120)
            assert done.returncode == 0, done
            jobs = [r["job_id"] for r in done.json()["runs"]] if study else []
            for job in jobs:
                subprocess.run(["scontrol", "hold", job], env=env, capture_output=True)
        finally:
            if blocker:
                subprocess.run(["scancel", blocker], env=env, capture_output=True)
        if study:
            run_dir = Path(done.json()["study_dir"])
            state = one_after_another(env, jobs)
        else:
            job_id, run_dir = done.json()["job_id"], Path(done.json()["run_dir"])
            state = wait_done(env, job_id)
    finally:
        inject(case, node, off=True)
    result: dict[str, Any] = {"case": case, "state": state, "seconds": round(time.monotonic() - started, 1)}
    return judged(env, work, result | {"run_dir": str(run_dir)}, node)


def block_nodes(env: dict[str, str]) -> str:
    """A job that holds every node while the study is submitted (its points pend, then are held); its id."""
    done = subprocess.run(
        ["sbatch", "--parsable", "--exclusive", "-N", str(len(NODES)), "-p", "debug", "-t", "5", "-o", "/dev/null",
         "--wrap", "sleep 300"], env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    job = done.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline
        and "RUNNING"
        not in subprocess.run(["squeue", "-h", "-o", "%T", "-j", job], env=env, capture_output=True, text=True).stdout
    ):
        time.sleep(0.5)
    return job


def one_after_another(env: dict[str, str], jobs: list[str]) -> str:
    """The study's (held) jobs one at a time, each released when the one before ended; their states."""
    states = []
    for job in jobs:
        subprocess.run(["scontrol", "release", job], env=env, capture_output=True)
        states.append(wait_done(env, job))
    return ",".join(states)


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
    top = bars[-1] if bars else None  # a study's last bar is its largest scale's
    result["step_s"] = top["actual_s"] if top else None
    result["losses"] = {x["part"]: round(x["fraction"], 3) for x in top["losses"]} if top else {}
    result["bars"] = [
        {"label": b.get("label"), "kind": b.get("kind"), "step_s": b.get("actual_s"), "eff": b.get("efficiency")}
        | {x["part"]: round(x["fraction"], 3) for x in b.get("losses", [])}
        for b in bars
    ]
    result["right"] = judge(result["case"], found, node)
    return result


def judge(case: str, found: list[dict[str, Any]], node: str) -> bool:
    if case == "clean":
        return not any(c.get("nodes") or c["part"] in ("data", "link") for c in found)
    kind = case.split("-")[0]
    where = [node] if kind in ON_NODE else []
    return bool(found) and found[0]["part"] == EXPECTED[kind] and found[0].get("nodes", []) == where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/hpctrain-scaling-causes"))
    parser.add_argument("--json", type=Path, help="write every run's numbers here")
    parser.add_argument("--again", action="store_true", help="no new runs: report every run under WORK/runs again")
    parser.add_argument("--study", action="store_true", help="every case a 1/2/4-node study (four nodes)")
    args = parser.parse_args()
    record = json.loads((STATE_DIR / "cluster.json").read_text())
    nodes = record.get("nodes", [])
    need = 4 if args.study else 3
    if len(nodes) < need or not record.get("up"):
        print(f"needs the test cluster up with {need} nodes or more (state dir {STATE_DIR})", file=sys.stderr)
        return 2
    shared = record.get("shared")
    if not shared and any(c.startswith("data") for c in args.cases) and not args.again:
        print(
            "the data cases need the cluster up with a shared folder (slurm-cluster up --shared DIR)", file=sys.stderr
        )
        return 2
    sick = nodes[1]
    NODES[:] = nodes
    args.work.mkdir(parents=True, exist_ok=True)
    os.chmod(args.work, 0o755)
    env = client_env(args.work)
    data = Path(shared) / "causes-data" if shared else args.work / "data"
    if not data.is_dir():
        made = hpctrain(env, "make-dataset", str(data), "--classes", "4", "--per-class", "36")
        assert made.returncode == 0, made
    results = []
    if args.again:
        for run_dir in sorted((args.work / "runs").glob("*/*/")):
            case = run_dir.parent.name.rsplit("-", 1)[0]
            results.append(judged(env, args.work, {"case": case, "run_dir": str(run_dir)}, sick))
            print(json.dumps(results[-1]), flush=True)
    for index in range(0 if args.again else args.repeats):
        for case in args.cases:
            result = one_run(env, args.work, data, case, sick, index, args.study)
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

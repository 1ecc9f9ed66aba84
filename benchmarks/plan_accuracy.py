"""Does ``hpctrain plan`` pick the shape that finishes first, and how close is its finish? (issue 40)

Needs the Slurm test cluster (root, namespaces); hold its lock:

    flock /tmp/hpctrain-slurm.lock .venv/bin/python benchmarks/plan_accuracy.py --slurm 24.11

On a 4-node cluster, the stop tests' small deterministic CPU job (tests/slurm/stop_helpers.py,
2 tasks a node) is first run once at each shape (1 and 2 nodes) on the empty cluster: the runs
``plan`` learns step times and start costs from (this spec's earlier runs, its first source).
Then, for each shape in turn, three of the four nodes are held for a known time by another
user's job (``sleep``, time limit 2 min), ``plan --nodes 1,2`` is asked, and that one shape is
submitted at once: its real finish (the last training step in metrics.jsonl; the job's end is a
few seconds later) is compared with the finish the plan gave it, both counted from the moment the
plan was made. Then a run longer than the ``short`` partition's 2-minute MaxTime is planned and
run there: the chunks the plan said against the starts the run had, and the finish.

It prints one line per shape and a JSON summary: the recommended shape, the shape that really
finished first, each finish's error relative to the planned time to finish (the issue's
criterion: within 20 %), and the load average before and after (a shared 2-core machine: say so).
The cluster is left as found (2 nodes) unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.node_loss import SCRIPT, Cluster, train_records  # noqa: E402
from tests.slurm.hpctrain_cli import hpctrain  # noqa: E402
from tests.slurm.stop_helpers import SMOKE_SPEC, Run, Workspace, make_workspace, submit  # noqa: E402

NODES = 4
HELD = 3  # nodes another user's job holds during each measured shape
HOLD_S = 115  # that job's own length: just under its 2-min limit, which Slurm's estimate assumes
SHAPES = (1, 2)
STEPS_PER_EPOCH = 8  # the stop tests' 64 images / (2 nodes x 2 ranks x batch 2)
# The calibration runs: 4 epochs; the measured ones train ~TRAIN_S at the 2-node step time they measured.
WORK = ("name=plan_accuracy", f"trainer.max_steps_per_epoch={STEPS_PER_EPOCH}", "health.burn_in.enabled=false")
CALIBRATION = ("trainer.epochs=4",)
TRAIN_S = 60
# The chunked run on `short` (MaxTime 2 min): the time-limit signal 30 s before it.
CHUNKED = ("resources.partition=short", "resources.time=00:02:00", "signals.signal_delay_s=30")
CHUNKED_TRAIN_S = 120  # training the chunked run needs at the measured step time: 2 chunks of ~80 s


class Slurm(Cluster):
    def sbatch(self, *args: str) -> str:
        return self.run("sbatch", "--parsable", *args).strip().split(";")[0]

    def wait_state(self, job_id: str, state: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.run("squeue", "-h", "-t", "all", "-o", "%T", "-j", job_id).strip() != state:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} never became {state}")
            time.sleep(0.5)


def plan(ws: Workspace, sets: tuple[str, ...], *args: str) -> dict:
    done = hpctrain(ws.env, "plan", SMOKE_SPEC, "--json", *ws.sets(*sets), *args, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"plan failed: {done.stderr}")
    return json.loads(done.stdout)


def last_step_time(run: Run) -> float:
    return max(record["time"] for record in train_records(run.run_dir))


def starts(run: Run) -> int:
    return int(run.summary().get("restarts", 0)) + 1


def hold(cluster: Slurm, nodes: int) -> str:
    job = cluster.sbatch("--exclusive", f"-N{nodes}", "-t", "2", "-o", "/dev/null", "--wrap", f"sleep {HOLD_S}")
    cluster.wait_state(job, "RUNNING")
    return job


def epochs_for(seconds: float, step_s: float) -> str:
    return f"trainer.epochs={max(2, round(seconds / step_s / STEPS_PER_EPOCH))}"


def measured_shape(cluster: Slurm, ws: Workspace, nodes: int, index: int, epochs: str) -> dict:
    holder = hold(cluster, HELD)
    made_at = time.time()
    made = plan(ws, (*WORK, epochs), "--nodes", ",".join(map(str, SHAPES)))
    shape = next(s for s in made["shapes"] if s["nodes"] == nodes)
    run = submit(ws, *WORK, epochs, f"resources.nodes={nodes}")
    state = cluster.wait_done(run.job_id, timeout=900)
    cluster.run("scancel", holder)
    real = last_step_time(run) - made_at
    planned = shape["finish_in_s"]
    line = {
        "nodes": nodes,
        "state": state,
        "recommended": made["recommended_nodes"],
        "planned_finish_s": planned,
        "real_finish_s": round(real, 1),
        "error": None if not planned else round((real - planned) / planned, 3),
        "planned_start_s": shape["start_in_s"],
        "step_s": shape["step_s"],
        "step_source": shape["step_source"],
        "restart_s": made["restart_s"],
        "steps": shape["steps"],
        "index": index,
    }
    print(json.dumps(line), flush=True)
    return line


def chunked(cluster: Slurm, ws: Workspace, step_s: float) -> dict:
    work = (*WORK, epochs_for(CHUNKED_TRAIN_S, step_s))
    made_at = time.time()
    made = plan(ws, (*work, *CHUNKED), "--nodes", "2")
    (shape,) = made["shapes"]
    run = submit(ws, *work, *CHUNKED)
    state = cluster.wait_done(run.job_id, timeout=1800)
    real = last_step_time(run) - made_at
    line = {
        "chunked": True,
        "steps": shape["steps"],
        "state": state,
        "planned_chunks": shape["chunks"],
        "real_starts": starts(run),
        "planned_finish_s": shape["finish_in_s"],
        "real_finish_s": round(real, 1),
        "error": None if not shape["finish_in_s"] else round((real - shape["finish_in_s"]) / shape["finish_in_s"], 3),
        "chunk_limit_s": made["chunk_limit_s"],
        "held_s": shape["held_s"],
    }
    print(json.dumps(line), flush=True)
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slurm", default=None, help="the test cluster's Slurm release (22.05, 24.11, 26.05)")
    parser.add_argument("--repeats", type=int, default=1, help="measured rounds (each: both shapes)")
    parser.add_argument("--no-chunks", action="store_true", help="skip the run longer than MaxTime")
    parser.add_argument("--keep", action="store_true", help="leave the cluster at 4 nodes")
    args = parser.parse_args()
    cluster = Slurm(args.slurm)
    load_before = os.getloadavg()
    cluster.up(NODES)
    ws = make_workspace(cluster, Path(tempfile.mkdtemp(prefix="plan-accuracy-")))  # type: ignore[arg-type]
    try:
        for nodes in SHAPES:  # the earlier runs a plan learns from, on the empty cluster
            run = submit(ws, *WORK, *CALIBRATION, f"resources.nodes={nodes}")
            print(f"calibration run, {nodes} node(s): {cluster.wait_done(run.job_id, timeout=900)}", flush=True)
        two = next(s for s in plan(ws, WORK, "--nodes", "2")["shapes"])["step_s"]
        epochs = epochs_for(TRAIN_S, two)
        lines = [measured_shape(cluster, ws, n, i, epochs) for i in range(args.repeats) for n in SHAPES]
        chunk = None if args.no_chunks else chunked(cluster, ws, two)
    finally:
        if not args.keep:
            subprocess.run([sys.executable, str(SCRIPT), "up", "--nodes", "2"], capture_output=True)
    by_round: dict[int, list[dict]] = {}
    for line in lines:
        by_round.setdefault(line["index"], []).append(line)
    rounds = []
    for _, shapes in sorted(by_round.items()):
        first = min(shapes, key=lambda s: s["real_finish_s"])["nodes"]
        rounds.append({"recommended": shapes[0]["recommended"], "finished_first": first})
    print(
        json.dumps(
            {
                "rounds": rounds,
                "errors": [line["error"] for line in lines],
                "chunked": chunk,
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

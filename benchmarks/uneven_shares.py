"""Uneven shares (issue 29, item 4): a healthy run's step time before/after, and throughput on k of n ranks.

Both parts run hpctrain's own Trainer (ddp over gloo ranks on CPU, ResNet-18 at 32 px by default,
``--batch-size`` (32) per micro-batch, one thread per rank, no loader workers) on a generated dataset, in
fresh processes, and read each step's time from an ``on_step`` hook (the first ``--warmup`` steps left
out, the median of the rest):

1. **healthy**: n ranks on their own shape, with the code of ``--baseline`` (a git revision: the
   commit before uneven shares by default; exported with ``git archive`` into a temporary folder
   and put first on ``PYTHONPATH``) and with this checkout, alternating, ``--repeats`` pairs. The
   ratio after / before is the cost of the change on a healthy run (the goal: ~1.0).
2. **k of n**: k ranks sharing the n micro-batches of a run first started on n (``HPCTRAIN_RUN_MICRO_BATCHES``
   makes the trainer take the run's count, as a heal does), against the same n micro-batches on n
   ranks, in the same round. The throughput ratio is T(n ranks) / T(k ranks) (same global batch per
   step); the ideal is k/n, the plan's own model 1 / step_cost.

A step's time on this 2-core machine is also set by how many ranks share its cores (n = 4 ranks
are oversubscribed 2x, k = 3 1.5x), so the k-of-n part also reports the slowest rank's CPU seconds
per step (``time.process_time`` of each rank's process): what a rank with a core of its own would
take. Collectives cost differently on GPUs (NCCL, no CPU time): a piece's BatchNorm exchange over gloo
on CPU is the pessimistic case.

Usage: ``python benchmarks/uneven_shares.py [--repeats 3] [--shapes 4:3,4:2,6:4,6:5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
BASELINE = "adf5be6"  # main before uneven shares were merged
RUN_MICRO_BATCHES_VAR = "HPCTRAIN_RUN_MICRO_BATCHES"  # jobspec/node_loss.py (read here without importing it)


# -- one measurement, in a fresh process (``--worker``): whichever hpctrain PYTHONPATH gives -----------------------
def _rank_main(rank: int, world: int, port: int, args: dict[str, Any], out: str) -> None:
    from hpctrain.jobspec.models import JobSpec
    from hpctrain.runtime.context import TaskContext
    from hpctrain.runtime.stop import StopRequest
    from hpctrain.runtime.task_env import one_node_env
    from hpctrain.trainer.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    trainer = {
        "arch": args["arch"],
        "strategy": "ddp",
        "batch_size": args["batch_size"],
        "epochs": 1,
        "max_steps_per_epoch": args["steps"],
        "log_every_steps": args["steps"],
        "lr": 0.1,
    }
    data = {"root": args["data"], "image_size": 32, "val_resize": 36, "workers": 0}
    spec = JobSpec.model_validate({"name": "bench", "trainer": trainer, "data": data})
    marks: list[tuple[float, float]] = []
    try:
        env = one_node_env("submitit-local", rank, world, rank, "bench", port)
        ctx = TaskContext(env, spec, Path(out) / "run", torch.device("cpu"), StopRequest())
        marks.append((time.perf_counter(), time.process_time()))
        Trainer(ctx, on_step=lambda _: marks.append((time.perf_counter(), time.process_time()))).fit()
    finally:
        dist.destroy_process_group()
    (Path(out) / f"rank-{rank}.json").write_text(json.dumps(marks))


def worker(args: dict[str, Any]) -> dict[str, float]:
    """Median wall and CPU seconds per step (the slowest rank's CPU) of one run."""
    with tempfile.TemporaryDirectory() as out:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        mp.spawn(_rank_main, args=(args["ranks"], port, args, out), nprocs=args["ranks"], join=True)
        marks = [json.loads((Path(out) / f"rank-{r}.json").read_text()) for r in range(args["ranks"])]
    skip = args["warmup"] + 1
    wall = [b[0] - a[0] for a, b in zip(marks[0][skip - 1 :], marks[0][skip:], strict=False)]
    cpu = [
        max(rank[i + 1][1] - rank[i][1] for rank in marks) for i in range(skip - 1, len(marks[0]) - 1)
    ]  # per step, the rank that spent most
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}


# -- the driver ----------------------------------------------------------------------------------------------------
def measure(code: Path, args: argparse.Namespace, ranks: int, micro_batches: int | None) -> dict[str, float]:
    request = {
        "ranks": ranks,
        "arch": args.arch,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "data": str(args.data),
    }
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    env.pop(RUN_MICRO_BATCHES_VAR, None)
    if micro_batches is not None:
        env[RUN_MICRO_BATCHES_VAR] = str(micro_batches)
    done = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(request)],
        env=env,
        cwd=code,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"a measurement failed ({code}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def export(revision: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "hpctrain"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4, help="ranks of the healthy run")
    parser.add_argument("--shapes", default="4:3,4:2,6:4,6:5", help="n:k pairs for the k-of-n part")
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the code before the change")
    parser.add_argument("--skip-healthy", action="store_true")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    from hpctrain.dataset.generate import make_dataset
    from hpctrain.jobspec.shares import SharePlan

    with tempfile.TemporaryDirectory() as tmp:
        most = max([args.ranks] + [int(pair.split(":")[0]) for pair in filter(None, args.shapes.split(","))])
        args.data = Path(tmp) / "data"
        per_class = (args.steps + 1) * most * args.batch_size // 4 + 1
        make_dataset(args.data, classes=4, per_class=per_class, val_per_class=4, image_size=32)
        report: dict[str, Any] = {"arch": args.arch, "batch_size": args.batch_size, "loadavg": os.getloadavg()}
        if not args.skip_healthy:
            before = export(args.baseline, Path(tmp) / "before")
            ratios: dict[str, list[float]] = {"wall_s": [], "cpu_s": []}
            for repeat in range(args.repeats):
                order = [(before, "before"), (REPO, "after")][:: 1 if repeat % 2 == 0 else -1]
                times = {name: measure(code, args, args.ranks, None) for code, name in order}
                for key in ratios:
                    ratios[key].append(times["after"][key] / times["before"][key])
                print(
                    f"healthy {args.ranks} ranks: before {times['before']['wall_s']:.4f} s "
                    f"({times['before']['cpu_s']:.4f} s CPU), after {times['after']['wall_s']:.4f} s "
                    f"({times['after']['cpu_s']:.4f} s CPU); ratio {ratios['wall_s'][-1]:.3f} wall, "
                    f"{ratios['cpu_s'][-1]:.3f} CPU",
                    flush=True,
                )
            report["healthy_ratio"] = {
                key: {"median": statistics.median(values), "min": min(values), "max": max(values)}
                for key, values in ratios.items()
            }
        for pair in filter(None, args.shapes.split(",")):
            n, k = map(int, pair.split(":"))
            rows = []
            for _ in range(args.repeats):
                full = measure(REPO, args, n, None)
                part = measure(REPO, args, k, n)
                rows.append({key: full[key] / part[key] for key in ("wall_s", "cpu_s")})
                print(
                    f"  {n} ranks: {full['wall_s']:.4f} s wall, {full['cpu_s']:.4f} s CPU per step; "
                    f"{k} ranks: {part['wall_s']:.4f} s, {part['cpu_s']:.4f} s",
                    flush=True,
                )
            model = 1 / SharePlan(n, k, args.batch_size).step_cost()
            found = {key: statistics.median(row[key] for row in rows) for key in ("wall_s", "cpu_s")}
            report[f"{k}_of_{n}"] = {
                "ideal": k / n,
                "plan": model,
                "throughput_wall": found["wall_s"],
                "throughput_cpu": found["cpu_s"],
                "cpu_range": [min(r["cpu_s"] for r in rows), max(r["cpu_s"] for r in rows)],
            }
            print(
                f"{k} of {n} ranks: throughput {found['cpu_s']:.3f} (CPU), {found['wall_s']:.3f} (wall); "
                f"plan {model:.3f}, ideal {k / n:.3f}",
                flush=True,
            )
        report["loadavg_end"] = os.getloadavg()
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""A DDP script in torchrun's style: one process per rank, its rank from RANK/WORLD_SIZE/LOCAL_RANK (env://).

Run by hpctrain with ``script.per: rank`` (srun) or ``launcher: torchrun``. With ``--task-log`` it also
records each step's loss with ``hpctrain.task.log`` (the task API's one call a script needs for its metrics
to reach ``metrics.jsonl``, and from there the run's trackers).
"""

import argparse
import os

import torch.distributed as dist
from common import on_stop_signal, report_env, train

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--step-s", type=float, default=0.2)
parser.add_argument("--fail-rank", type=int, default=None)
parser.add_argument("--fail-step", type=int, default=2)
parser.add_argument("--tag", default="")
parser.add_argument("--task-log", action="store_true", help="log each step's loss with hpctrain.task.log")
args = parser.parse_args()
on_stop_signal()  # the script's own stop handler first; the task API's, below, keeps it and calls it
if args.task_log:
    from hpctrain import task

    task.context()  # hpctrain's handler notes the stop for task.should_stop(), then calls the script's
    log = task.log
else:
    log = None

rank = int(os.environ["RANK"])
report_env(rank, {"local_rank": int(os.environ["LOCAL_RANK"])})
dist.init_process_group("gloo")
fail = (args.fail_rank, args.fail_step) if args.fail_rank is not None else None
print(f"rank {rank}: {train(rank, args.steps, args.step_s, fail, log=log)}", flush=True)
dist.destroy_process_group()

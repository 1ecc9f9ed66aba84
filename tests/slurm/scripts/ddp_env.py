"""A DDP script in torchrun's style: one process per rank, its rank from RANK/WORLD_SIZE/LOCAL_RANK (env://).

Run by hpctrain with ``script.per: rank`` (srun) or ``launcher: torchrun``.
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
args = parser.parse_args()

on_stop_signal()
rank = int(os.environ["RANK"])
report_env(rank, {"local_rank": int(os.environ["LOCAL_RANK"])})
dist.init_process_group("gloo")
fail = (args.fail_rank, args.fail_step) if args.fail_rank is not None else None
print(f"rank {rank}: {train(rank, args.steps, args.step_s, fail)}", flush=True)
dist.destroy_process_group()

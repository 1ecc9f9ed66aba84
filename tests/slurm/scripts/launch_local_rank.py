"""A script written for ``python -m torch.distributed.launch``: it takes ``--local_rank`` on its command line
and reads RANK/WORLD_SIZE/MASTER_* from the environment (env://).

Run by hpctrain with ``script.per: rank`` and ``args: ["--local_rank={local_rank}", ...]``.
"""

import argparse
import os

import torch.distributed as dist
from common import on_stop_signal, report_env, train

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", "--local-rank", type=int, required=True)
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--step-s", type=float, default=0.2)
parser.add_argument("--fail-rank", type=int, default=None)
parser.add_argument("--fail-step", type=int, default=2)
args = parser.parse_args()

on_stop_signal()
rank = int(os.environ["RANK"])
report_env(rank, {"local_rank": args.local_rank})
dist.init_process_group(backend="gloo", init_method="env://")
fail = (args.fail_rank, args.fail_step) if args.fail_rank is not None else None
print(f"rank {rank}: {train(rank, args.steps, args.step_s, fail)}", flush=True)
dist.destroy_process_group()

"""HAL's multi-node script style: one process per node, spawning a worker per device with mp.spawn and a
``--dist-url tcp://HOST:PORT`` rendezvous; ``--world-size`` counts nodes and ``--rank`` is the node's.

Run by hpctrain with ``script.per: node``.
"""

import argparse
import os
import signal

import torch.distributed as dist
import torch.multiprocessing as mp
from common import escape, on_stop_signal, report_env, train


def worker(local: int, args: argparse.Namespace) -> None:
    on_stop_signal()
    rank = args.rank * args.nproc + local
    world = args.world_size * args.nproc
    report_env(rank, {"local_rank": local})
    if args.escape:
        escape()
    dist.init_process_group("gloo", init_method=args.dist_url, world_size=world, rank=rank)
    print(f"rank {rank}: {train(rank, args.steps, args.step_s, loader_workers=args.loader_workers)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dist-url", required=True)
    parser.add_argument("--world-size", type=int, required=True)  # nodes, as in the tutorial
    parser.add_argument("--rank", type=int, required=True)  # this node's index
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=0.2)
    parser.add_argument("--loader-workers", type=int, default=0)
    parser.add_argument("--escape", action="store_true", help="each worker leaves a setsid'ed sleep behind")
    args = parser.parse_args()
    # The stop signal reaches the whole process group: the workers stop; this parent waits for them.
    signal.signal(getattr(signal, "SIG" + os.environ.get("HPCTRAIN_STOP_SIGNAL", "TERM")), signal.SIG_IGN)
    report_env(f"node{args.rank}")
    mp.spawn(worker, args=(args,), nprocs=args.nproc)

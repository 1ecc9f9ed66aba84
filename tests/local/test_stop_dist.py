"""Two gloo processes: one rank's stop flag is the reason every rank agrees on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.net_helpers import free_port

pytestmark = pytest.mark.local_dist

WORKER = """
import json, os, signal, sys
import torch.distributed as dist
from hpctrain.contract.cancel_marker import cancel_marker_paths
from hpctrain.runtime.stop import StopRequest, all_reduce_max, install_handlers

rank, port, run_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
stop = StopRequest(cancel_markers=cancel_marker_paths(run_dir), job_ids=["77"])
install_handlers(stop, "USR2")
rows = {"before": stop.agreed()}
if rank == 1:
    os.kill(os.getpid(), signal.SIGUSR2)  # only rank 1 hears the time-limit warning
rows["local"] = stop.local_reason
rows["agreed"] = stop.agreed()
if rank == 0:  # rank 0 alone gets the SIGTERM of `hpctrain cancel` (marker written by the test)
    os.kill(os.getpid(), signal.SIGTERM)
rows["agreed_after_cancel"] = stop.agreed()
rows["outcome"] = all_reduce_max(2 if rank == 0 else 0)
dist.destroy_process_group()
print(json.dumps(rows))
"""


def test_one_ranks_flag_is_agreed_by_both(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    from hpctrain.contract.cancel_marker import write_cancel_marker

    write_cancel_marker(tmp_path, ["77"])  # only a SIGTERM turns into a cancel
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), port, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for rank in (0, 1)
    ]
    rows = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        rows.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert [r["before"] for r in rows] == [None, None]
    assert [r["local"] for r in rows] == [None, "timeout"]
    assert [r["agreed"] for r in rows] == ["timeout", "timeout"]
    assert [r["agreed_after_cancel"] for r in rows] == ["cancelled", "cancelled"]
    assert [r["outcome"] for r in rows] == [2, 2]

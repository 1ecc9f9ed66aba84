"""A user's loop under real torchrun (2 gloo ranks on CPU) that never starts a process group itself.

Before, each rank trained alone: ``task.ddp`` returned the bare model, the
checkpointer and ``should_stop`` acted per process, and the two trainings
ended with different weights. The task API's collective parts now form the
group from torchrun's variables (``hpctrain/task/process_group.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from task_harness import clean_env

pytestmark = pytest.mark.local_dist

LOOP = """
import json, sys
import torch, torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset
from hpctrain import task

info = task.context()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = task.ElasticLoader(data, batch_size=4, seed=0)
model = task.ddp(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = task.Checkpointer(model=model, optimizer=optimizer, data=loader, every_steps=2)
start = ckpt.load()
total = 6
for step, batches in loader.steps(start, total):
    if task.should_stop():
        ckpt.save(step)
        sys.exit(0)
    optimizer.zero_grad()
    for x, y in task.accumulate(model, batches):
        (nn.functional.mse_loss(model(x), y) / len(batches)).backward()
    optimizer.step()
    task.log(step + 1, loss=0.0)
    ckpt.maybe_save(step + 1)
row = {
    "rank": info.rank, "world": info.world_size, "group": dist.is_initialized(),
    "ddp": isinstance(model, nn.parallel.DistributedDataParallel), "start": start,
    "digest": task.weights_sha256(model),
}
with open(f"row-{info.rank}.json", "w") as out:  # a file each: the ranks' stdout lines can interleave
    json.dump(row, out)
"""


def torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    env = {**clean_env(), "TMPDIR": str(cwd)}  # torchrun's own log folder (torchelastic_*): not left in /tmp
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def rows_of(folder: Path) -> list[dict]:
    return [json.loads((folder / f"row-{rank}.json").read_text()) for rank in (0, 1)]


def test_a_loop_without_init_process_group_trains_as_one_job(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(LOOP)
    done = torchrun(["loop.py"], tmp_path)
    rows = rows_of(tmp_path)
    assert [(r["rank"], r["world"], r["group"], r["ddp"]) for r in rows] == [(0, 2, True, True), (1, 2, True, True)]
    assert rows[0]["digest"] == rows[1]["digest"]  # one training: each rank's different data summed by DDP
    assert "2 ranks joined one process group (gloo, from torchrun's variables)" in done.stderr
    folders = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert folders == ["step-00000004", "step-00000006"]  # saved once by the group, nothing half-written
    steps = [json.loads(line)["global_step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # rank 0's metrics alone, not two trainings' interleaved

    torchrun(["loop.py"], tmp_path)
    assert [row["start"] for row in rows_of(tmp_path)] == [6, 6]  # both ranks loaded the last checkpoint


def test_the_example_says_where_it_writes_and_that_a_second_run_has_nothing_to_do(
    data_root: Path, tmp_path: Path
) -> None:
    example = ["-m", "hpctrain.examples.own_loop", "--data-root", str(data_root), "--epochs", "1"]
    first = torchrun(example, tmp_path)
    run = tmp_path / "runs" / "own_loop"
    assert f"own_loop: step 0 of 4: starting (checkpoints in {run / 'checkpoints'})" in first.stdout
    assert "own_loop: step 4 of 4: epoch 1 of 1, loss " in first.stdout
    assert "own_loop: completed at step 4" in first.stdout
    assert (run / "metrics.jsonl").is_file() and not (tmp_path / "checkpoints").exists()

    second = torchrun(example, tmp_path)
    assert "own_loop: step 4 of 4: already done: nothing to train" in second.stdout

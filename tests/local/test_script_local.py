"""``hpctrain submit --local`` of ``script:`` jobs: the same wrapper as on Slurm, under submitit's local executor.

Torch-free scripts (each process writes what it got), so the tier stays quick: a script per node runs once
per "node" with the node's layout and the rendezvous on this machine; a sweep's trials each get their own
filled arguments; a failed rank is named in the summary and by ``submit``'s exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.contract.rundir import SUMMARY_FILE, spec_path, summary_path

pytestmark = pytest.mark.local_dist

REPO = Path(__file__).resolve().parents[2]
REPORT = """
import json, os, sys
keys = ("RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "HPCTRAIN_RESTART_COUNT")
name = f"got-{os.environ['GROUP_RANK']}-{os.environ.get('RANK', 'node')}.json"
json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), **{k: os.environ.get(k) for k in keys}}, open(name, "w"))
if "FAIL_RANK" in os.environ and os.environ.get("RANK") == os.environ["FAIL_RANK"]:
    print("giving up: no data", file=sys.stderr)
    sys.exit(4)
"""


def submit(tmp_path: Path, name: str, script: dict, **extra: object) -> subprocess.CompletedProcess[str]:
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "code" / "report.py").write_text(REPORT)
    spec = {
        "name": name,
        "cluster": "local",
        "output_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 2, "tasks_per_node": 2, "time": "00:10:00"},
        "script": {"path": str(tmp_path / "code" / "report.py"), **script},
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "HPCTRAIN_CONFIG_DIR": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state")}
    command = [sys.executable, "-m", "hpctrain", "submit", str(path), "--local"]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def run_dirs(tmp_path: Path, name: str) -> list[Path]:
    return sorted(p.parent for p in (tmp_path / "runs" / name).rglob(SUMMARY_FILE))


def test_a_script_per_node_runs_once_per_node(tmp_path: Path) -> None:
    args = ["--world-size", "{nnodes}", "--rank", "{node_rank}", "--url", "tcp://{master_addr}:{master_port}"]
    done = submit(tmp_path, "per_node", {"per": "node", "args": args})
    assert done.returncode == 0, done.stdout + done.stderr
    [run_dir] = run_dirs(tmp_path, "per_node")
    got = [json.loads((run_dir / f"got-{node}-node.json").read_text()) for node in (0, 1)]
    assert [g["argv"][:4] for g in got] == [["--world-size", "2", "--rank", "0"], ["--world-size", "2", "--rank", "1"]]
    assert all(g["argv"][5].startswith("tcp://127.0.0.1:") and g["cwd"] == str(run_dir) for g in got)
    assert [(g["RANK"], g["WORLD_SIZE"], g["LOCAL_WORLD_SIZE"]) for g in got] == [(None, "4", "2")] * 2
    assert json.loads(summary_path(run_dir).read_text())["status"] == "completed"


def test_each_sweep_trial_gets_its_own_arguments_and_a_failed_rank_is_named(tmp_path: Path) -> None:
    done = submit(
        tmp_path,
        "sweep",
        {"args": ["--lr", "{sweep.lr}", "--rank={rank}"]},
        sweep={"lr": [0.1, 0.2]},
        env={"FAIL_RANK": "3"},
    )
    assert done.returncode != 0 and "the script of rank 3 on localhost exited with code 4" in done.stderr, done.stderr
    trials = run_dirs(tmp_path, "sweep")
    assert len(trials) == 2
    for trial, lr in zip(trials, ("0.1", "0.2")):
        assert json.loads((trial / "got-0-0.json").read_text())["argv"] == ["--lr", lr, "--rank=0"]
        summary = json.loads(summary_path(trial).read_text())
        assert (summary["status"], summary["failed_rank"], summary["failed_exit_code"]) == ("failed", 3, 4)
        assert summary["failed_stderr"] == ["giving up: no data"]
        assert f"- --lr\n  - '{lr}'" in spec_path(trial).read_text(), "the trial's spec shows its arguments"

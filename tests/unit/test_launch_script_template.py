"""``hpctrain init NAME --script train.py`` (hpctrain/launch/script_template.py): the script's style from its
text, and a spec that validates and runs it that way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.jobspec.load import load_job
from hpctrain.launch.script_template import read_script, render, style_of

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "scripts"


def test_the_three_styles_of_hals_tutorial_and_pytorchs() -> None:
    spawn = style_of((EXAMPLES / "imagenet_ddp.py").read_text())
    assert spawn.per == "node"
    assert spawn.args == [
        "--dist-url",
        "tcp://{master_addr}:{master_port}",
        "--world-size",
        "{nnodes}",
        "--rank",
        "{node_rank}",
        "--multiprocessing-distributed",
    ]
    launch = style_of('parser.add_argument("--local_rank", type=int)\nsignal.signal(15, f)')
    assert (launch.per, launch.args) == ("rank", ["--local_rank={local_rank}"])
    assert "no signal handler" not in launch.says
    torchrun = style_of((EXAMPLES / "multinode.py").read_text())
    assert (torchrun.per, torchrun.args) == ("rank", []) and "torchrun" in torchrun.says
    bare = style_of("import torch\n")
    assert "installs no signal handler" in bare.says


def test_the_rendered_spec_validates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my train.py").write_text("import torch.multiprocessing as mp\nmp.spawn(f, nprocs=4)\n")
    path = tmp_path / "jobs" / "mine.yaml"
    path.parent.mkdir()
    style = style_of(read_script(Path("my train.py")))
    path.write_text(render("mine", path, "my train.py", style, nodes=2, gpus_per_node=4, cluster="hal"))
    spec = load_job(path).spec
    assert spec.script is not None and (spec.script.per, spec.script.path) == ("node", str(tmp_path / "my train.py"))


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCTRAIN_CONFIG_DIR": str(cwd / "config"), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "hpctrain", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_init_script_through_the_cli(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import os\nrank = int(os.environ['RANK'])\n")
    args = ["init", "job", "--script", "train.py", "--nodes", "2", "--cluster", "local", "--gpus-per-node", "0"]
    done = run_cli(args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "train.py, one process per rank" in done.stdout
    assert "installs no signal handler" in (tmp_path / "jobs" / "job.yaml").read_text()
    missing = run_cli(["init", "other", "--script", "nope.py"], cwd=tmp_path)
    assert missing.returncode == 2 and "--script nope.py: no such file" in missing.stderr
    assert not (tmp_path / "jobs" / "other.yaml").exists()

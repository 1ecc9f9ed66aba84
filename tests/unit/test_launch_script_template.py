"""``hpctrain init NAME --script train.py`` (hpctrain/launch/script_template.py): the script's style from its
text, and a spec that validates and runs it that way."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import assert_user_error, hpctrain

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


def test_init_script_through_the_cli(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "train.py").write_text("import os\nrank = int(os.environ['RANK'])\n")
    args = ["init", "job", "--script", "train.py", "--nodes", "2", "--cluster", "local", "--gpus-per-node", "0"]
    done = hpctrain(*args, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "train.py, one process per rank" in done.stdout
    assert "installs no signal handler" in (tmp_path / "jobs" / "job.yaml").read_text()
    missing = hpctrain("init", "other", "--script", "nope.py", env=env, cwd=tmp_path)
    assert_user_error(missing, 2, "--script nope.py: no such file")
    assert not (tmp_path / "jobs" / "other.yaml").exists()

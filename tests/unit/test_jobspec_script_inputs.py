"""A script's arguments and workdir as they reach its processes (hpctrain/jobspec/script_inputs.py): what would
fail at job start (a control character a sweep value brings, an argument over Linux's 128 KiB, a workdir that
cannot be made, an empty one) is a spec problem with its key at validate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobspec import script_inputs
from hpctrain.jobspec.load import load_job
from hpctrain.launch.script_code import require_program

pytestmark = pytest.mark.usefixtures("isolated")


def spec(tmp_path: Path, script: dict, sweep: dict | None = None) -> Path:
    (tmp_path / "train.py").write_text("")
    data = {"name": "s", "cluster": "local", "resources": {"gpus_per_node": 0}}
    data["script"] = {"path": "train.py", **script}
    if sweep is not None:
        data["sweep"] = sweep
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML, and writes any character as an escape
    return path


def problems(path: Path) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        require_program(load_job(path))
    return {problem.key: problem.message for problem in caught.value.problems}


@pytest.mark.parametrize("value", ["a\nb", "x\x1b[2Jy", "c\x9bd", "e\x85f", "\x00"])
def test_a_sweep_value_gets_the_argument_rule(value: str, tmp_path: Path) -> None:
    """The red team's case: {sweep.KEY} skipped the control-character check a written argument gets."""
    found = problems(spec(tmp_path, {"args": ["--lr={sweep.lr}"]}, sweep={"lr": ["0.1", value]}))
    assert "control characters" in found["script.args.0"] and "sweep trial" in found["script.args.0"]
    assert "\x1b" not in str(found)


@pytest.mark.parametrize("value", ["c\x9bd", "e\x85f"])
def test_a_written_argument_with_a_c1_control_is_refused_too(value: str, tmp_path: Path) -> None:
    assert "control characters" in problems(spec(tmp_path, {"args": ["ok", value]}))["script.args.1"]


@pytest.mark.parametrize("how", ["written", "swept", "workdir"])
def test_an_argument_over_128_kib_is_refused_at_validate(how: str, tmp_path: Path) -> None:
    big = "x" * (128 * 1024)
    if how == "written":
        path, key = spec(tmp_path, {"args": ["--a", big]}), "script.args.1"
    elif how == "swept":
        path, key = spec(tmp_path, {"args": ["--cfg={sweep.cfg}"]}, sweep={"cfg": ["small", big]}), "script.args.0"
    else:
        path, key = spec(tmp_path, {"workdir": "/tmp/" + big}), "script.workdir"
    assert "Linux passes no argument over 128 KiB" in problems(path)[key]
    fits = spec(tmp_path, {"args": ["--a", "x" * (128 * 1024 - 2)]})
    require_program(load_job(fits))


def test_arguments_that_together_exceed_the_limit(tmp_path: Path) -> None:
    """A spec file holds at most 1 MB, but one swept value may fill many arguments."""
    path = spec(tmp_path, {"args": ["{sweep.blob}"] * 11}, sweep={"blob": ["y" * (100 * 1024)]})
    assert "the arguments total" in problems(path)["script.args"]


def test_an_empty_workdir_is_refused_and_dot_is_the_submit_folder(tmp_path: Path) -> None:
    assert "is empty" in problems(spec(tmp_path, {"workdir": ""}))["script.workdir"]
    job = load_job(spec(tmp_path, {"workdir": "."}))
    assert job.spec.script is not None and job.spec.script.workdir == str(tmp_path.resolve())


def test_a_workdir_that_cannot_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "afile").write_text("")
    under_a_file = problems(spec(tmp_path, {"workdir": str(tmp_path / "afile" / "work")}))["script.workdir"]
    assert "is a file" in under_a_file
    (tmp_path / "locked").mkdir()
    real_access = script_inputs.os.access
    monkeypatch.setattr(script_inputs.os, "access", lambda p, m: Path(p) != tmp_path / "locked" and real_access(p, m))
    locked = problems(spec(tmp_path, {"workdir": str(tmp_path / "locked" / "a" / "b")}))["script.workdir"]
    assert "is not writable by you" in locked
    for fine in (str(tmp_path / "new" / "deeper"), "/nonexistent-node-local/scratch", "{run_dir}/work"):
        require_program(load_job(spec(tmp_path, {"workdir": fine})))

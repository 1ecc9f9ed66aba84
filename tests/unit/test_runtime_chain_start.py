"""runtime/chain_start.py: a chained run starts with its upstream's values, or ends with the chain's reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.chain_links import read_chain_end
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.errors import UsageError
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime import chain_start


class Exited(Exception):
    pass


def exit_process(code: int) -> None:
    raise Exited(code)


def upstream(tmp_path: Path, status: str, checkpoint: bool = True) -> Path:
    folder = tmp_path / "up"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"job_id": "7", "backend": "slurm"}))
    write_summary(folder, {"status": status, "global_step": 12})
    if checkpoint:
        step = folder / "checkpoints" / "step-00000012"
        step.mkdir(parents=True)
        (step / "state.pt").write_bytes(b"abc")
        meta = {"format_version": 1, "global_step": 12, "files": {"state.pt": {"size": 3}}}
        (step / "meta.json").write_text(json.dumps(meta))
    return folder


def spec(up: Path, when: str = "completed", **more: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "dep", "after": {"run": str(up), "when": when}, **more})


def test_a_spec_without_after_starts_with_no_values(tmp_path: Path) -> None:
    assert chain_start.begin(JobSpec(name="x"), str(tmp_path), is_main=True, exit_process=exit_process) == {}


def test_a_completed_upstream_gives_its_values(tmp_path: Path) -> None:
    up = upstream(tmp_path, "completed")
    values = chain_start.begin(spec(up), str(tmp_path / "dep"), is_main=True, exit_process=exit_process)
    assert values["after.checkpoint"] == str(up / "checkpoints" / "step-00000012")
    assert values["after.global_step"] == "12" and values["after.run_dir"] == str(up)


@pytest.mark.parametrize(("status", "when", "kind"), [("failed", "completed", "end"), ("stopped", "completed", "wait"),
                                                       ("completed", "failed", "end")])  # fmt: skip
def test_an_unmet_condition_ends_the_run_with_its_reason(tmp_path: Path, status: str, when: str, kind: str) -> None:
    up = upstream(tmp_path, status)
    dep = tmp_path / "dep"
    dep.mkdir()
    with pytest.raises(Exited) as info:
        chain_start.begin(spec(up, when), str(dep), is_main=True, exit_process=exit_process)
    assert info.value.args == (0,)
    ended = read_chain_end(dep)
    assert ended is not None and ended["kind"] == kind and str(up) in ended["reason"]
    summary = read_summary(dep)
    assert summary is not None and summary.status == "stopped" and summary.stop_reason == ended["reason"]


def test_only_rank_0_records_the_end(tmp_path: Path) -> None:
    up, dep = upstream(tmp_path, "failed"), tmp_path / "dep"
    dep.mkdir()
    with pytest.raises(Exited):
        chain_start.begin(spec(up), str(dep), is_main=False, exit_process=exit_process)
    assert read_chain_end(dep) is None and read_summary(dep) is None


def test_a_value_the_upstream_lacks_is_named(tmp_path: Path) -> None:
    up = upstream(tmp_path, "completed", checkpoint=False)
    wanting = spec(up, entrypoint="pkg.mod:main", entrypoint_args={"weights": "{after.checkpoint}"})
    with pytest.raises(UsageError) as info:
        chain_start.begin(wanting, str(tmp_path / "dep"), is_main=True, exit_process=exit_process)
    assert "{after.checkpoint}" in info.value.message and "checkpoint_dir" in (info.value.hint or "")


def test_entrypoint_args_are_filled_as_plain_values(tmp_path: Path) -> None:
    up = upstream(tmp_path, "completed")
    wanting = spec(up, entrypoint="pkg.mod:main", entrypoint_args={"w": "{after.checkpoint}; rm -rf ~", "n": 3})
    values = chain_start.begin(wanting, str(tmp_path / "dep"), is_main=True, exit_process=exit_process)
    filled = chain_start.fill_entrypoint_args(wanting, values)
    assert filled.entrypoint_args == {"w": f"{up}/checkpoints/step-00000012; rm -rf ~", "n": 3}

"""jobspec/chain_checks.py: where ``{after.NAME}`` may stand, and ``after:`` owning the Slurm dependency."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobspec.load import load_job

pytestmark = pytest.mark.usefixtures("isolated")


def problems(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text))
    (tmp_path / "eval.py").write_text("")
    with pytest.raises(SpecError) as info:
        load_job(path)
    return {problem.key: problem.message for problem in info.value.problems}


def test_a_placeholder_without_after_says_how_to_add_it(tmp_path: Path) -> None:
    found = problems(tmp_path, f"name: e\nscript: {{path: {tmp_path}/eval.py, args: ['{{after.checkpoint}}']}}\n")
    assert "--after RUN" in found["script.args.0"] and "after:" in found["script.args.0"]


def test_entrypoint_args_are_checked_by_key(tmp_path: Path) -> None:
    text = """\
    name: e
    entrypoint: pkg.mod:main
    entrypoint_args: {weights: "{after.chekpoint}", steps: 3}
    after: {run: /r}
    """
    found = problems(tmp_path, text)
    assert list(found) == ["entrypoint_args.weights"]
    assert "{after.checkpoint}" in found["entrypoint_args.weights"]


def test_a_dependency_of_ones_own_beside_after_is_refused(tmp_path: Path) -> None:
    text = "name: e\ndata: {root: /d}\nafter: {run: /r}\nresources: {slurm_extra: {dependency: 'singleton'}}\n"
    assert "remove slurm_extra.dependency" in problems(tmp_path, text)["resources.slurm_extra.dependency"]


def test_the_dependency_a_submit_recorded_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: e\ndata: {root: /d}\nafter: {run: /r}\nresources: {slurm_extra: {dependency: 'afterany:12'}}\n"
    )
    assert load_job(path).spec.resources.slurm_extra["dependency"] == "afterany:12"

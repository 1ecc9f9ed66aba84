"""jobspec/after.py: the ``after:`` section, and ``{after.NAME}`` in a script's arguments."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.script_args import fill, fill_after

pytestmark = pytest.mark.usefixtures("isolated")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text))
    (tmp_path / "eval.py").write_text("print('hi')\n")
    return path


SCRIPT = """\
name: evaluate
script:
  path: {folder}/eval.py
  args: [{args}]
"""


def test_after_defaults_to_completed(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ndata: {root: /d}\nafter: {run: /runs/train/1}\n")
    after = load_job(path).spec.after
    assert after is not None and after.run == "/runs/train/1" and after.when == "completed"


def test_unknown_condition_and_key_are_named(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ndata: {root: /d}\nafter: {run: /r, when: sometimes, afterwards: x}\n")
    with pytest.raises(SpecError) as info:
        load_job(path)
    keys = {problem.key for problem in info.value.problems}
    assert {"after.when", "after.afterwards"} <= keys
    assert "completed" in info.value.message and "ended" in info.value.message


def test_the_set_override_makes_the_section(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ndata: {root: /d}\n")
    spec = load_job(path, ['after.run="12345"']).spec  # what submit --after 12345 writes
    assert spec.after is not None and spec.after.run == "12345"


def test_after_placeholders_are_accepted_in_script_args(tmp_path: Path) -> None:
    args = '"--init", "{after.checkpoint}", "--step={after.global_step}", "{rank}"'
    path = write(tmp_path, SCRIPT.format(folder=tmp_path, args=args) + "after: {run: /r}\n")
    assert load_job(path).spec.script.args[1] == "{after.checkpoint}"  # type: ignore[union-attr]


def test_an_unknown_after_placeholder_is_named_with_the_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path, SCRIPT.format(folder=tmp_path, args='"{after.chekpoint}"') + "after: {run: /r}\n")
    with pytest.raises(SpecError) as info:
        load_job(path)
    problem = info.value.problems[0]
    assert problem.key == "script.args.0"
    assert "{after.chekpoint}" in problem.message and "{after.checkpoint}" in problem.message


def test_fill_after_keeps_other_tokens_and_escapes_values() -> None:
    values = {"after.checkpoint": "/runs/a b/{weird}", "after.run_dir": "/runs/a"}
    text = "--init={after.checkpoint} --rank={rank} {{after.run_dir}}"
    partly = fill_after(text, values)
    assert fill(partly, {"rank": "3"}) == "--init=/runs/a b/{weird} --rank=3 {after.run_dir}"
    assert fill_after("{after.run_dir}/x {{lit}}", values, escaped=False) == "/runs/a/x {{lit}}"

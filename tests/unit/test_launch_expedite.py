"""``resources.expedited_requeue``: the spec's checks, the decision against the cluster, and the sbatch line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.contract.slurm_answers import ExpeditedRequeue
from hpctrain.errors import SpecError, UsageError
from hpctrain.jobscript.parameters import slurm_parameters
from hpctrain.jobscript.sbatch_script import render_sbatch
from hpctrain.jobspec.load import LoadedJob, load_job
from hpctrain.launch.expedite import Expedite, choose, expedite_for

pytestmark = pytest.mark.usefixtures("isolated")

SPEC = """\
name: e
cluster: slurm
data: {{root: /datasets/x}}
resources: {{nodes: 2, tasks_per_node: 1, gpus_per_node: 0, partition: debug{resources}}}
signals: {{requeue_on_timeout: {requeue}, requeue_on_preemption: {requeue}}}
"""
ON = ExpeditedRequeue(True, "Slurm 26.05 with SlurmctldParameters=enable_expedited_requeue")
OFF = ExpeditedRequeue(False, "Slurm 24.11 has none (it came with 25.11)")


def load(tmp_path: Path, resources: str = "", requeue: bool = True) -> LoadedJob:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.format(resources=resources, requeue=str(requeue).lower()))
    return load_job(path)


def test_default_is_off_and_the_three_values_load(tmp_path: Path) -> None:
    assert load(tmp_path).spec.resources.expedited_requeue is False
    for text, value in (("auto", "auto"), ("true", True), ("false", False)):
        assert load(tmp_path, f", expedited_requeue: {text}").spec.resources.expedited_requeue == value


@pytest.mark.parametrize("value", ["maybe", "'on'", "1", "fast", "[auto]"])
def test_any_other_value_names_the_key_and_the_choices(tmp_path: Path, value: str) -> None:
    with pytest.raises(SpecError) as caught:
        load(tmp_path, f", expedited_requeue: {value}")
    [problem] = caught.value.problems
    assert problem.key == "resources.expedited_requeue" and "auto, true or false" in problem.message


def test_true_on_a_job_that_is_never_requeued_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load(tmp_path, ", expedited_requeue: true", requeue=False)
    [problem] = caught.value.problems
    assert problem.key == "resources.expedited_requeue"
    assert "requeue_on_preemption" in problem.message and "auto or false" in problem.message
    assert expedite_for(load(tmp_path, ", expedited_requeue: auto", requeue=False), support=None) == Expedite()


@pytest.mark.parametrize(
    ("setting", "support", "used", "note"),
    [
        (False, ON, False, None),
        ("auto", ON, True, "expedited requeue: on (Slurm 26.05 with"),
        ("auto", OFF, False, "expedited requeue: off (Slurm 24.11 has none"),
        ("auto", None, False, "decided at submit"),
        (True, ON, True, "expedited requeue: on"),
        (True, None, True, "the submit checks"),
    ],
)
def test_the_decision(setting: bool | str, support: ExpeditedRequeue | None, used: bool, note: str | None) -> None:
    chosen = choose(setting, True, support)  # type: ignore[arg-type]
    assert chosen.used is used
    assert [n for n in chosen.notes if note and note in n] if note else chosen.notes == ()


def test_true_where_the_cluster_has_none_refuses_to_submit_with_why_and_the_fix() -> None:
    with pytest.raises(UsageError) as caught:
        choose(True, True, OFF, "job.yaml")
    assert "job.yaml: resources.expedited_requeue: true" in str(caught.value)
    assert "Slurm 24.11 has none" in str(caught.value) and "auto" in (caught.value.hint or "")


def test_the_cluster_is_asked_only_when_the_answer_depends_on_it(tmp_path: Path) -> None:
    asked: list[int] = []

    def support() -> ExpeditedRequeue:
        asked.append(1)
        return ON

    assert expedite_for(load(tmp_path), support=support) == Expedite()
    assert expedite_for(load(tmp_path, ", expedited_requeue: auto", requeue=False), support=support) == Expedite()
    assert not asked
    assert expedite_for(load(tmp_path, ", expedited_requeue: auto"), support=support).used and asked == [1]


def test_the_sbatch_script_says_requeue_expedite_only_when_used(tmp_path: Path) -> None:
    job = load(tmp_path, ", expedited_requeue: auto")
    used = slurm_parameters(job.spec, job.profile, tmp_path, expedite=True)
    plain = slurm_parameters(job.spec, job.profile, tmp_path)
    assert "#SBATCH --requeue=expedite" in render_sbatch(used, tmp_path, "python -m x")
    script = render_sbatch(plain, tmp_path, "python -m x")
    assert "#SBATCH --requeue\n" in script and "expedite" not in script
    never = load(tmp_path, requeue=False)
    extra = slurm_parameters(never.spec, never.profile, tmp_path, expedite=True)["additional_parameters"]
    assert extra.get("no-requeue") is True and "requeue" not in extra

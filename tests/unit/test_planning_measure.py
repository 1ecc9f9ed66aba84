"""``hpctrain plan --measure``: the spec itself, cut down to one node and a few steps, run through the one
submit sequence, then read as an earlier run of the spec (planning/measure.py)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hpctrain.errors import RunDirError, UsageError
from hpctrain.jobspec.load import load_job
from hpctrain.launch import submit as submit_module
from hpctrain.launch.submit import Submission
from hpctrain.planning.measure import measure, measurement_overrides
from hpctrain.planning.plan import plan
from tests.fake_slurm import FakeSlurm
from tests.unit.cli_helpers import in_process

pytestmark = pytest.mark.usefixtures("isolated")

GOLDEN = Path(__file__).parent / "golden" / "slurm" / "24.11"
NOW = datetime(2026, 11, 29, 0, 3, 14).timestamp()


def write_spec(folder: Path, more: str = "") -> Path:
    spec = folder / "spec.yaml"
    spec.write_text(
        f"name: m\ncluster: slurm\noutput_dir: {folder / 'runs'}\nresources:\n  nodes: 4\n  min_nodes: 2\n"
        f"  spare_nodes: 1\n  tasks_per_node: 2\n  time: '04:00:00'\ntrainer:\n  arch: resnet18\n  epochs: 90\n"
        f"  batch_size: 32\n  max_steps_per_epoch: 500\ndata:\n  root: {folder / 'data'}\n{more}"
    )
    (folder / "data").mkdir(exist_ok=True)
    return spec


class FakeSubmit:
    """What the submit sequence leaves: a run directory under OUTPUT_DIR/NAME with the cut-down spec's steps."""

    def __init__(self, step_s: float | None = 0.5) -> None:
        self.calls: list[dict[str, Any]] = []
        self.step_s = step_s

    def __call__(self, spec: Path, *, overrides: list[str], cluster: str | None, wait: bool) -> Submission:
        job = load_job(spec, overrides, cluster=cluster)
        self.calls.append({"overrides": overrides, "wait": wait, "job": job})
        run_dir = Path(job.spec.output_dir) / job.spec.name / "20261129-000000"
        run_dir.mkdir(parents=True)
        (run_dir / "spec.yaml").write_text(json.dumps(job.spec.model_dump(mode="json")))
        (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "num_nodes": 1}))
        steps = range(1, 41) if self.step_s is not None else ()
        lines = [
            {"kind": "train_step", "global_step": i, "step_s": self.step_s, "time": i * self.step_s} for i in steps
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        return Submission(run_dir, "91", "slurm", state="COMPLETED" if self.step_s else "FAILED")


def test_the_spec_is_cut_down_to_one_node_and_a_few_steps_and_waited_for(tmp_path: Path) -> None:
    fake = FakeSubmit()
    found = measure(write_spec(tmp_path), steps=40, submit=fake)
    [call] = fake.calls
    cut = call["job"].spec
    assert call["wait"] and (cut.resources.nodes, cut.resources.min_nodes, cut.resources.spare_nodes) == (1, None, 0)
    assert (cut.trainer.epochs, cut.trainer.max_steps_per_epoch, cut.resources.time) == (1, 40, "00:20:00")
    assert cut.trainer.arch == "resnet18" and cut.trainer.batch_size == 32  # the run's own model and batch
    assert (found.step_s, found.steps, found.job_id) == (0.5, 40, "91")
    assert measurement_overrides(40)[0] == "resources.nodes=1"


def test_plan_measure_makes_the_step_time_measured_at_one_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    partitions = (GOLDEN / "scontrol_show_partition.txt").read_text()
    FakeSlurm(answers={"scontrol --oneliner show partition": (0, partitions)}).install(monkeypatch)
    made = plan(write_spec(tmp_path), nodes=(2,), measure_steps=40, submit=FakeSubmit(), clock=lambda: NOW)
    for shape in made.shapes:  # min_nodes 2 rules out 1 node for the run; the measurement ran at 1 all the same
        assert shape.step_time is not None and shape.step_time.seconds == 0.5 and shape.step_time.extrapolated
        assert "from 1 node" in shape.step_time.source
    assert any(note.startswith("--measure: job 91 ran 40 step(s) at 1 node") for note in made.notes)


def test_both_faces_hand_the_one_submit_sequence_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """planning stands beneath launch: ``hpctrain plan --measure`` and ``hpctrain.plan(measure_steps=)`` give
    it launch's submit, the same sequence ``hpctrain submit`` runs."""
    import hpctrain

    fake = FakeSubmit()
    monkeypatch.setattr(submit_module, "submit", fake)
    partitions = (GOLDEN / "scontrol_show_partition.txt").read_text()
    FakeSlurm(answers={"scontrol --oneliner show partition": (0, partitions)}).install(monkeypatch)
    (tmp_path / "api").mkdir()
    made = hpctrain.plan(write_spec(tmp_path / "api"), nodes=[2], measure_steps=40)
    assert any(note.startswith("--measure: job 91 ran 40 step(s)") for note in made.notes)
    (tmp_path / "cli").mkdir()
    result = in_process(capsys, "plan", str(write_spec(tmp_path / "cli")), "--nodes", "2", "--measure", "40", "--json")
    assert result.returncode == 0, result.stderr
    assert any(note.startswith("--measure: job 91 ran 40 step(s)") for note in json.loads(result.stdout)["notes"])
    assert [call["wait"] for call in fake.calls] == [True, True]


def test_what_cannot_be_measured_is_said(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="logged no step time") as caught:
        measure(write_spec(tmp_path), submit=FakeSubmit(step_s=None))
    assert "hpctrain logs" in (caught.value.hint or "")
    script = tmp_path / "s"
    script.mkdir()
    (script / "train.py").write_text("print(1)\n")
    spec = script / "spec.yaml"
    spec.write_text(f"name: s\ncluster: slurm\noutput_dir: {script / 'runs'}\nscript:\n  path: {script / 'train.py'}\n")
    with pytest.raises(UsageError, match="counts its own steps"):
        measure(spec, submit=FakeSubmit())


def test_cli_refuses_a_measurement_too_short_to_say(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        in_process(capsys, "plan", str(write_spec(tmp_path)), "--measure", "2")
    assert caught.value.code == 2 and "--measure: 2 is out of range" in capsys.readouterr().err

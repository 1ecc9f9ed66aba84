"""``hpctrain plan`` and ``hpctrain.plan``: the sequence on a fake Slurm, earlier runs on disk, and bad input."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import hpctrain
from hpctrain.errors import UsageError
from hpctrain.jobspec.load import load_job
from hpctrain.planning.plan import parse_shapes, plan
from tests.fake_slurm import FakeSlurm, nowhere
from tests.unit.cli_helpers import assert_user_error, in_process

pytestmark = pytest.mark.usefixtures("isolated")

GOLDEN = Path(__file__).parent / "golden" / "slurm" / "24.11"
PARTITIONS = (GOLDEN / "scontrol_show_partition.txt").read_text()  # debug: 2 nodes, MaxTime UNLIMITED
NOW = datetime(2026, 11, 29, 0, 13, 14).timestamp() - 600  # ten minutes before the recorded start


def at(minutes: float, nodes: str = "n1") -> tuple[int, str]:
    """sbatch --test-only's answer for a start ``minutes`` after NOW."""
    when = datetime.fromtimestamp(NOW + minutes * 60).strftime("%Y-%m-%dT%H:%M:%S")
    return 0, f"sbatch: Job 9 to start at {when} using 2 processors on nodes {nodes} in partition debug\n"


def write_spec(folder: Path, **resources: Any) -> Path:
    spec = folder / "spec.yaml"
    body = {"nodes": 1, "tasks_per_node": 2, "time": "01:00:00", **resources}
    lines = "\n".join(f"  {key}: {json.dumps(value)}" for key, value in body.items())
    spec.write_text(
        f"name: planned\ncluster: slurm\noutput_dir: {folder / 'runs'}\nresources:\n{lines}\n"
        f"trainer:\n  arch: resnet18\n  epochs: 2\n  batch_size: 32\ndata:\n  root: {folder / 'data'}\n"
    )
    (folder / "data").mkdir(exist_ok=True)
    return spec


def earlier_run(spec: Path, nodes: int, step_s: float, *, name: str = "") -> Path:
    """A finished run of ``spec`` at ``nodes`` nodes that logged ``step_s`` per step, on 6,400 samples an epoch."""
    job = load_job(spec, [f"resources.nodes={nodes}"])
    steps_per_epoch = 6400 // job.spec.global_batch_size
    run_dir = spec.parent / "runs" / "planned" / (name or f"20261128-00000{nodes}")
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(json.dumps(job.spec.model_dump(mode="json")))
    summary = {"status": "completed", "num_nodes": nodes, "steps_per_epoch": steps_per_epoch}
    (run_dir / "summary.json").write_text(json.dumps({**summary, "global_batch_size": job.spec.global_batch_size}))
    records = [
        {"kind": "train_step", "epoch": 0, "step": i, "global_step": i, "step_s": step_s, "time": i * step_s}
        for i in range(1, 11)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    slurm = FakeSlurm(answers={"scontrol --oneliner show partition": (0, PARTITIONS)}).install(monkeypatch)
    slurm.test_only_answers = {1: at(10), 2: at(180, "n[1-2]")}
    return slurm


def test_earlier_runs_give_step_times_work_and_a_recommendation(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    earlier_run(spec, 1, 0.5)
    earlier_run(spec, 2, 0.6)
    made = plan(spec, nodes=(1, 2, 4), clock=lambda: NOW)
    one, two, four = made.shapes
    assert "about 6,400 samples an epoch" in made.work.source  # 100 steps x global batch 64
    assert (one.steps, two.steps) == (200, 100)  # the global batch doubles with the nodes
    assert one.step_time is not None and one.step_time.seconds == 0.5 and "measured" in one.step_time.source
    assert one.start.in_s == pytest.approx(600) and two.start.in_s == pytest.approx(3 * 3600)
    assert one.timeline is not None and one.timeline.finish_in_s == pytest.approx(600 + 120 + 100)
    assert four.problem == "partition debug has 2 nodes" and four.timeline is None
    assert made.choice.nodes == 1 and "1 node finishes first" in made.choice.reason
    asked = fake.asked("sbatch")
    assert [a for a in asked[0] if a.startswith(("--nodes", "--time", "--ntasks"))] == [
        "--nodes=1",
        "--ntasks-per-node=2",
        "--time=60",
    ]
    assert not fake.asked("sacct")  # no accounting needed: the plan works where slurmdbd is absent


def test_an_unmeasured_shape_is_extrapolated_and_marked(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    earlier_run(spec, 1, 0.5)
    made = plan(spec, nodes=(2,), clock=lambda: NOW)
    (two,) = made.shapes
    assert two.step_time is not None and two.step_time.extrapolated and "perfect weak scaling" in two.step_time.source


def test_runs_of_another_model_or_batch_are_not_evidence(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    other = earlier_run(spec, 1, 0.5)
    data = json.loads((other / "spec.yaml").read_text())
    data["trainer"]["batch_size"] = 64
    (other / "spec.yaml").write_text(json.dumps(data))
    with pytest.raises(UsageError, match="no step count"):
        plan(spec, nodes=(1,), clock=lambda: NOW)


def test_hostile_run_files_are_skipped_not_followed(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    good = earlier_run(spec, 1, 0.5)
    bad = earlier_run(spec, 2, 0.001, name="20261128-000009")
    (bad / "metrics.jsonl").unlink()
    os.symlink(good / "metrics.jsonl", bad / "metrics.jsonl")  # a link out of the run: not read
    (bad / "summary.json").write_text('{"steps_per_epoch": "many", "num_nodes": [2]}')
    made = plan(spec, nodes=(2,), step_time_s=None, clock=lambda: NOW)
    (two,) = made.shapes
    assert two.step_time is not None and two.step_time.extrapolated  # from the good run, not the link


def test_a_partition_limit_below_the_run_plans_chunks(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path, time="04:00:00")
    fake.answers["scontrol --oneliner show partition"] = (
        0,
        PARTITIONS.replace("MaxTime=UNLIMITED", "MaxTime=01:00:00", 1),
    )
    made = plan(spec, nodes=(1,), steps=30_000, step_time_s=0.5, clock=lambda: NOW)
    (one,) = made.shapes
    assert made.limit_s == 3600 and "MaxTime" in made.limit_source
    assert any("above debug's MaxTime" in note for note in made.notes)
    assert one.timeline is not None and one.timeline.chunks == 5  # 15,000 s / (3600 - 120 - stop) a chunk
    assert any("wait in the queue as long as the first" in note for note in made.notes)
    assert any("120 s starting before it trains: assumed" in note for note in made.notes)
    assert "--time=60" in fake.asked("sbatch")[0]


def test_a_refused_test_only_leaves_the_start_unknown(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    fake.test_only_answers = {1: (1, "sbatch: error: Batch job submission failed: Access/permission denied\n")}
    made = plan(spec, nodes=(1,), steps=100, step_time_s=0.5, clock=lambda: NOW)
    (one,) = made.shapes
    assert one.start.in_s is None and "permission denied" in one.start.unknown
    assert one.timeline is not None and one.timeline.finish_in_s is None
    assert made.choice.nodes is None and "no shape has a known finish" in made.choice.reason
    shown = made.as_json()["shapes"][0]
    assert shown["expected_start"] is None and shown["expected_finish"] is None and shown["start_unknown"]


def test_a_shape_no_node_set_can_hold_is_ruled_out_by_slurms_answer(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    fake.test_only_answers = {2: (1, (GOLDEN / "sbatch_test_only_too_many_nodes.txt").read_text())}
    made = plan(spec, nodes=(1, 2), steps=100, step_time_s=0.5, clock=lambda: NOW)
    assert "no node can ever satisfy" in made.shapes[1].problem
    assert made.choice.nodes == 1


def test_without_slurm_every_start_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeSlurm().install(monkeypatch, which=nowhere)
    made = plan(write_spec(tmp_path), nodes=(1, 2), steps=100, step_time_s=0.5, clock=lambda: NOW)
    assert all(shape.start.in_s is None for shape in made.shapes)
    assert any("no Slurm on this machine" in note for note in made.notes)
    assert made.choice.nodes is None and "by its own run time alone" in made.choice.reason


def test_a_partition_the_cluster_lacks_is_the_specs_mistake(tmp_path: Path, fake: FakeSlurm) -> None:
    with pytest.raises(UsageError, match="'gpu' is not a partition of this cluster \\(debug, short, urgent\\)"):
        plan(write_spec(tmp_path, partition="gpu"), nodes=(1,), steps=10, step_time_s=0.5, clock=lambda: NOW)
    assert not fake.asked("sbatch")


def test_a_local_profile_starts_now_without_asking_slurm(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text().replace("cluster: slurm", "cluster: local"))
    made = plan(spec, steps=100, step_time_s=0.5, clock=lambda: NOW)
    assert [shape.nodes for shape in made.shapes] == [1]  # the spec's own: one machine
    assert made.shapes[0].start.in_s == 0 and made.choice.nodes == 1 and not fake.commands
    assert any("runs on this machine" in note for note in made.notes)


def test_time_min_is_asked_of_slurm_and_noted(tmp_path: Path, fake: FakeSlurm) -> None:
    made = plan(write_spec(tmp_path, time_min="00:30:00"), nodes=(1,), steps=10, step_time_s=0.5, clock=lambda: NOW)
    assert "--time-min=30" in fake.asked("sbatch")[0]
    assert any("resources.time_min 00:30:00" in note for note in made.notes)


def test_parse_shapes_refuses_absurd_lists() -> None:
    assert parse_shapes("8,1,2,2") == (1, 2, 8)
    for text in ("0", "1,x", "1,,2", "99999", ",".join(str(n) for n in range(1, 18)), "-1"):
        with pytest.raises(UsageError):
            parse_shapes(text)


# ------------------------------------------------------------------ the two faces


def test_cli_prints_the_table_and_the_pick(tmp_path: Path, fake: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path)
    result = in_process(capsys, "plan", str(spec), "--nodes", "1,2", "--steps", "1000", "--step-time", "0.5")
    assert result.returncode == 0, result.stderr
    assert "recommended: ask for 1 node(s)" in result.stdout and "--step-time (yours)" in result.stdout


def test_cli_json_is_the_apis_plan(tmp_path: Path, fake: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path)
    result = in_process(capsys, "plan", str(spec), "--nodes", "1,2", "--steps", "1000", "--step-time", "0.5", "--json")
    shown = json.loads(result.stdout)
    api = hpctrain.plan(spec, nodes=[1, 2], steps=1000, step_time_s=0.5).as_json()
    assert shown["recommended_nodes"] == api["recommended_nodes"] == 1
    assert [s["steps"] for s in shown["shapes"]] == [s["steps"] for s in api["shapes"]] == [1000, 1000]
    assert shown["shapes"][0]["step_source"] == "--step-time (yours)"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--nodes", "0,2"], "'0' is not a node count"),
        (["--nodes", "1,2,x"], "'x' is not a node count"),
        (["--nodes", ",".join(str(n) for n in range(1, 20))], "at most 16"),
        ([], "no step count"),
        (["--samples-per-epoch", "6400"], "no step time"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, fake: FakeSlurm, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    result = in_process(capsys, "plan", str(write_spec(tmp_path)), *args)
    assert_user_error(result, 2, needle)
    assert result.stderr.count("\n") <= 2  # the error and its hint


def test_api_refuses_wrong_types() -> None:
    for kwargs in ({"nodes": [1, "2"]}, {"steps": 0}, {"step_time_s": float("nan")}, {"margin": -1}):
        with pytest.raises(UsageError):
            hpctrain.plan("jobs/quickstart.yaml", **kwargs)

"""Studies: ``study:`` axes are validated and expanded into points that each resolve with
their own resources; a study directory records them in study.json; submit, status,
cancel and resume of a study, with Slurm replaced by fakes."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

import hpctrain.launch.study as study_module
from hpctrain.cli.main import main
from hpctrain.contract.rundir import read_json_object, read_run_info, run_info_path, study_file, write_run_info
from hpctrain.contract.study_file import read_study
from hpctrain.contract.summary import write_summary
from hpctrain.diagnose.preflight import Finding, check_partition, study_findings
from hpctrain.errors import ClusterError, SpecError
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.study_axes import check_axes, combinations, point_label
from hpctrain.launch.cancel import Cancelled
from hpctrain.launch.study import point_record, render_study_plan, study_record, submit_study
from hpctrain.launch.submission import SubmittedRun
from hpctrain.launch.submit import submit
from tests.fake_slurm import FakeSlurm

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
CPU_STUDY = """\
name: st
cluster: slurm
output_dir: {out}
study:
  resources.nodes: [1, 2]
resources:
  tasks_per_node: 2
  gpus_per_node: 0
trainer:
  arch: resnet18
  batch_size: 8
data:
  root: /datasets/imagenet
"""


pytestmark = pytest.mark.usefixtures("isolated")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent(text).format(out=tmp_path / "runs"))
    return path


def problems(path: Path) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        load_job(path)
    return {p.key: p.message for p in info.value.problems}


# ---------------------------------------------------------------- axes


def test_points_are_the_cartesian_product_first_axis_slowest() -> None:
    axes = {"resources.nodes": [1, 2], "resources.gpus_per_node": [2, 4]}
    assert [point_label(v) for v in combinations(axes)] == [
        "nodes-1_gpus_per_node-2",
        "nodes-1_gpus_per_node-4",
        "nodes-2_gpus_per_node-2",
        "nodes-2_gpus_per_node-4",
    ]


def test_every_axis_problem_is_reported_at_once_naming_its_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: st
        study:
          resources.nodes: [1, 2, 2]
          resources.gpus_per_node: []
          trainer.lr: [0.1, 0.2]
          resources.partition: [a, b]
          resources.tasks_per_node: [1, true]
        data:
          root: /datasets/imagenet
        """,
    )
    found = problems(path)
    assert set(found) == {
        "study.resources.nodes",
        "study.resources.gpus_per_node",
        "study.trainer.lr",
        "study.resources.partition",
        "study.resources.tasks_per_node",
    }
    assert "2 more than once" in found["study.resources.nodes"]
    assert "at least one value" in found["study.resources.gpus_per_node"]
    assert "sweep:" in found["study.trainer.lr"]
    assert "resources.nodes" in found["study.resources.partition"]  # lists the keys a study may vary
    assert "whole numbers" in found["study.resources.tasks_per_node"]


def test_too_many_points_are_refused() -> None:
    axes = {"resources.nodes": list(range(1, 21)), "resources.cpus_per_task": list(range(1, 21))}
    assert [p.key for p in check_axes(axes)] == ["study"]


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("4", "not 4; to run one size only, set resources.nodes: 4 instead"),
        ("2.5", "not 2.5"),
        ("null", "not null"),
        ("{a: 1}", "not {'a': 1}"),
        ("[[1, 2], [3]]", "whole numbers such as 4, not [1, 2] (and 1 more)"),
        ("[true, 2]", "whole numbers such as 4, not True"),
    ],
)
def test_every_shape_of_an_axis_is_one_message_at_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, needle: str
) -> None:
    """A scalar, null, mapping, nested list or bool axis: one line naming the key, exit 2, no traceback (issue 19)."""
    path = tmp_path / "study.yaml"
    path.write_text(f"name: st\ndata: {{root: /d}}\nstudy:\n  resources.nodes: {value}\n")
    found = problems(path)
    assert list(found) == ["study.resources.nodes"] and needle in found["study.resources.nodes"]
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and "Traceback" not in err


@pytest.mark.parametrize("count", [99_000, 100_000])
def test_a_huge_axis_is_refused_at_the_study_cap_not_as_an_alias_bomb(tmp_path: Path, count: int) -> None:
    """99k values took 108 s (a quadratic duplicate check before the cap); 100k were called a YAML
    alias problem. Now the cap answers first; parsing the 600 kB file is most of the time."""
    import time

    values = ", ".join(str(1 + i % 7) for i in range(count))  # duplicates too: the cap speaks first
    path = tmp_path / "study.yaml"
    path.write_text(f"name: st\ndata: {{root: /d}}\nstudy:\n  resources.nodes: [{values}]\n")
    start = time.process_time()  # CPU time: the machine's load (CI's nice 10 under the Slurm legs) is not the test's
    found = problems(path)
    assert time.process_time() - start < 60  # CPU seconds: a hang guard only (was minutes)
    assert list(found) == ["study.resources.nodes"]
    assert f"{count:,} values, but a study submits at most 256 jobs" in found["study.resources.nodes"]
    start = time.process_time()
    assert [p.key for p in check_axes({"resources.nodes": list(range(count))})] == ["study.resources.nodes"]
    assert [p.key for p in check_axes({"resources.nodes": [1, 2] * 128})] == ["study.resources.nodes"]
    assert time.process_time() - start < 10  # CPU seconds, a hang guard: linear now


def test_an_alias_bomb_is_still_an_alias_problem_next_to_a_long_list(tmp_path: Path) -> None:
    bomb = ["x-0: &b0 [" + ", ".join(["1"] * 10) + "]"]
    bomb += [f"x-{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 10) + "]" for i in range(1, 7)]
    path = tmp_path / "study.yaml"
    path.write_text("name: st\nstudy:\n  resources.nodes: [1, 2]\n" + "\n".join(bomb) + "\n")
    assert "aliases (*name) expand to more than" in problems(path)[""]


def test_a_value_failing_resource_validation_names_the_study_key_and_point(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: st
        cluster: hal
        study:
          resources.nodes: [1, 0]
          resources.gpus_per_node: [4, 8]
        trainer:
          strategy: ddp
        """,
    )
    found = problems(path)
    assert set(found) == {"study.resources.nodes", "study.resources.gpus_per_node"}
    assert "nodes-0_gpus_per_node-4" in found["study.resources.nodes"]
    assert "'hal' nodes have 4" in found["study.resources.gpus_per_node"]


def test_a_point_that_breaks_a_cross_field_rule_is_refused(tmp_path: Path) -> None:
    single = CPU_STUDY.replace("tasks_per_node: 2", "tasks_per_node: 1").replace("arch:", "strategy: single\n  arch:")
    path = write(tmp_path, single)
    found = problems(path)
    assert list(found) == ["trainer.strategy"]
    assert "(study point nodes-2)" in found["trainer.strategy"]


# ---------------------------------------------------------------- points resolve with their own resources


def test_scaling_example_points_get_their_own_world_size_batch_and_lr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    job = load_job(REPO / "jobs" / "scaling_hal.yaml")
    assert job.is_study and not job.is_sweep
    got = [(p.label, p.job.spec.world_size, p.job.spec.global_batch_size) for p in job.points]
    assert got == [
        ("nodes-1", 4, 832),
        ("nodes-2", 8, 1664),
        ("nodes-4", 16, 3328),
        ("nodes-8", 32, 6656),
        ("nodes-16", 64, 13312),
    ]
    records = [point_record(p) for p in job.points]
    assert [r["lr"] for r in records] == pytest.approx([0.325, 0.65, 1.3, 2.6, 5.2])
    assert all(r["warmup_epochs"] == 5 and r["gpus_per_node"] == 4 for r in records)
    assert all(not p.job.spec.study for p in job.points)  # a point's spec.yaml is a plain spec: resume works


def test_a_sweep_inside_a_study_is_a_sweep_at_every_point(tmp_path: Path) -> None:
    path = write(tmp_path, CPU_STUDY + "sweep:\n  trainer.lr: [0.1, 0.2, 0.4]\n")
    job = load_job(path)
    assert [len(p.job.trials) for p in job.points] == [3, 3]
    assert [t.world_size for t in job.points[1].job.trials] == [4, 4, 4]
    assert point_record(job.points[0])["trials"] == 3


def test_a_tasks_per_node_study(tmp_path: Path) -> None:
    path = write(tmp_path, CPU_STUDY.replace("resources.nodes: [1, 2]", "resources.tasks_per_node: [1, 4]"))
    job = load_job(path)
    assert [(p.label, p.job.spec.world_size) for p in job.points] == [("tasks_per_node-1", 1), ("tasks_per_node-4", 4)]


# ---------------------------------------------------------------- dry run, study.json


def normalised(text: str) -> str:
    return text.replace(shlex.quote(sys.executable), "PYTHON").replace(sys.executable, "PYTHON")


def test_dry_run_plan_matches_golden_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    plan = normalised(render_study_plan(load_job(REPO / "jobs" / "scaling_hal.yaml"), Path("/runs/S"), local=False))
    golden = GOLDEN / "scaling_hal.study.txt"
    if not golden.exists():
        golden.write_text(plan)
    assert plan == golden.read_text(), f"the study plan changed; delete {golden.relative_to(REPO)} if intended"


def test_golden_plan_shows_every_points_sbatch_size() -> None:
    lines = (GOLDEN / "scaling_hal.study.txt").read_text().splitlines()
    assert [line for line in lines if line.startswith("#SBATCH --nodes=")] == [
        f"#SBATCH --nodes={n}" for n in (1, 2, 4, 8, 16)
    ]
    assert sum(line.startswith("srun ") for line in lines) == 5
    assert any("world size 64, global batch 13312" in line and "lr 5.2" in line for line in lines)


def test_study_record_follows_the_contract(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, CPU_STUDY))
    record = study_record(job, tmp_path / "runs" / "st" / "20260101-000000")
    assert {k: record[k] for k in ("kind", "version", "name", "study_id", "axes")} == {
        "kind": "study",
        "version": 1,
        "name": "st",
        "study_id": "20260101-000000",
        "axes": {"resources.nodes": [1, 2]},
    }
    point = record["points"][1]
    assert {k: point[k] for k in ("label", "values", "run_dir", "job_id", "nodes", "tasks_per_node", "world_size")} == {
        "label": "nodes-2",
        "values": {"resources.nodes": 2},
        "run_dir": "nodes-2",
        "job_id": None,
        "nodes": 2,
        "tasks_per_node": 2,
        "world_size": 4,
    }
    assert (point["gpus_per_node"], point["global_batch"]) == (0, 32)


# ---------------------------------------------------------------- submit (Slurm faked)


def fake_submit(monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> list[Path]:
    """Replace the per-point submit: it creates the run dir and returns job ids 100, 101, ..."""
    seen: list[Path] = []

    def submit(job, *, local=False, run_dir=None, snapshot=True):  # noqa: ANN001, ANN202
        if fail_at is not None and len(seen) == fail_at:
            raise ClusterError("sbatch: the partition does not exist", hint="set resources.partition")
        run_dir.mkdir(parents=True)
        job_id = str(100 + len(seen))
        write_run_info(run_dir, {"job_id": job_id, "backend": "slurm", "world_size": job.spec.world_size})
        seen.append(run_dir)
        return SubmittedRun(job_id, run_dir, "slurm", [], [run_dir])

    monkeypatch.setattr(study_module, "submit_run", submit)
    return seen


def test_submit_writes_one_run_dir_per_point_and_records_each_job_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_submit(monkeypatch)
    study = submit(write(tmp_path, CPU_STUDY), preflight=False)  # the submit verb's sequence
    assert study.run_dir.parent == tmp_path / "runs" / "st"
    record = read_study(study.run_dir)
    assert [(p["label"], p["job_id"]) for p in record["points"]] == [("nodes-1", "100"), ("nodes-2", "101")]
    assert all(run_info_path(study.run_dir / p["run_dir"]).is_file() for p in record["points"])
    assert study.as_json() == {  # what 'submit --json' prints
        "study_dir": str(study.run_dir),
        "runs": [
            {"job_id": "100", "run_dir": str(study.run_dir / "nodes-1"), "label": "nodes-1", "world_size": 2},
            {"job_id": "101", "run_dir": str(study.run_dir / "nodes-2"), "label": "nodes-2", "world_size": 4},
        ],
    }


def test_a_failed_submission_half_way_keeps_the_record_of_what_was_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_submit(monkeypatch, fail_at=1)
    with pytest.raises(ClusterError) as info:
        submit_study(load_job(write(tmp_path, CPU_STUDY)))
    assert "nodes-2" in info.value.message and "nodes-1 (job 100)" in info.value.message
    assert "hpctrain cancel" in (info.value.hint or "")
    (study_dir,) = (tmp_path / "runs" / "st").iterdir()
    assert [p["job_id"] for p in read_study(study_dir)["points"]] == ["100", None]


def test_a_submission_that_queued_nothing_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_submit(monkeypatch, fail_at=0)
    with pytest.raises(ClusterError):
        submit_study(load_job(write(tmp_path, CPU_STUDY)))
    assert list((tmp_path / "runs" / "st").iterdir()) == []


def test_submit_json_prints_one_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_submit(monkeypatch)
    assert main(["submit", str(write(tmp_path, CPU_STUDY)), "--json", "--no-preflight"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["label"], r["job_id"], r["world_size"]) for r in report["runs"]] == [
        ("nodes-1", "100", 2),
        ("nodes-2", "101", 4),
    ]
    assert read_json_object(study_file(Path(report["study_dir"])))["points"][1]["job_id"] == "101"


def test_dry_run_of_a_study_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = fake_submit(monkeypatch)
    assert main(["submit", str(write(tmp_path, CPU_STUDY)), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# --- point 2/2: nodes-2" in out and "#SBATCH --nodes=2" in out and "world size 4" in out
    assert not seen and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- status, cancel, resume of a study dir


def made_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_submit(monkeypatch)
    study = submit_study(load_job(write(tmp_path, CPU_STUDY)))
    for (_point, submitted), top1 in zip(study.runs, (51.5, 60.25)):
        info = {"job_id": submitted.job_id, "backend": "local", "name": "st"}  # local: no Slurm asked
        write_run_info(submitted.run_dir, info)
        write_summary(
            submitted.run_dir,
            {"status": "completed", "epochs_completed": 2, "global_step": 8, "best_val_top1": top1},
        )
    return study.study_dir


def test_status_of_a_study_lists_every_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    study_dir = made_study(tmp_path, monkeypatch)
    assert main(["status", str(study_dir), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["points"]
    assert [(r["label"], r["job_id"], r["status"], r["world_size"], r["best_val_top1"]) for r in rows] == [
        ("nodes-1", "100", "completed", 2, 51.5),
        ("nodes-2", "101", "completed", 4, 60.25),
    ]
    assert main(["status", str(study_dir)]) == 0
    table = capsys.readouterr().out
    assert "nodes-2" in table and "60.25" in table and "2/90" in table


def test_status_of_a_study_asks_slurm_once_for_all_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    study_dir = made_study(tmp_path, monkeypatch)
    for point in ("nodes-1", "nodes-2"):
        info = read_run_info(study_dir / point)
        write_run_info(study_dir / point, {**info, "backend": "slurm"})
    fake = FakeSlurm({"100": "RUNNING"}, answers={"squeue -h -o %T -j 101": (0, "PENDING\n")}).install(monkeypatch)
    assert main(["status", str(study_dir), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["points"]
    assert [(r["label"], r["slurm_state"]) for r in rows] == [("nodes-1", "RUNNING"), ("nodes-2", "PENDING")]
    # one sacct call for both; a job it did not list is asked about alone
    assert [argv[-1] for argv in fake.asked("sacct")] == ["100,101", "101"]


def test_cancel_of_a_study_cancels_every_point_through_the_run_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study_dir = made_study(tmp_path, monkeypatch)
    cancelled: list[Path] = []

    def cancel_run(run_dir: Path, timeout_s: float, *, slurm: object = None) -> Cancelled:
        cancelled.append(run_dir)
        return Cancelled(run_dir, "1", "CANCELLED", "stopped", True, 0.0, None)

    monkeypatch.setattr("hpctrain.launch.cancel.cancel_run", cancel_run)
    assert main(["cancel", str(study_dir)]) == 0
    assert cancelled == [study_dir / "nodes-1", study_dir / "nodes-2"]


def test_resume_of_a_study_names_a_point_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    study_dir = made_study(tmp_path, monkeypatch)
    assert main(["resume", str(study_dir)]) == 2
    err = capsys.readouterr().err
    assert "is a study of 2 points" in err and f"hpctrain resume {study_dir / 'nodes-1'}" in err


def test_preflight_refuses_more_nodes_than_the_partition_has(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, CPU_STUDY))
    partitions = {"debug": {"PartitionName": "debug", "Default": "YES", "TotalNodes": "2", "MaxNodes": "UNLIMITED"}}
    assert check_partition(job.points[1].job.spec, partitions) == []
    big = load_job(write(tmp_path, CPU_STUDY.replace("[1, 2]", "[1, 4]")))
    (finding,) = check_partition(big.points[1].job.spec, partitions)
    assert (finding.level, finding.key) == ("error", "resources.nodes")
    assert "partition 'debug' has 2" in finding.message


def test_local_points_run_one_after_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    events: list[str] = []

    def submit(job, *, local=False, run_dir=None, snapshot=True):  # noqa: ANN001, ANN202
        assert local
        run_dir.mkdir(parents=True)
        events.append(f"submit {run_dir.name}")
        return SubmittedRun(str(len(events)), run_dir, "local", [], [run_dir])

    def follow_local(submitted, stream):  # noqa: ANN001, ANN202
        events.append(f"ran {submitted.run_dir.name}")
        status = "completed" if submitted.run_dir.name == "nodes-1" else "failed"
        write_summary(submitted.run_dir, {"status": status})
        return 0 if status == "completed" else 1

    monkeypatch.setattr(study_module, "submit_run", submit)
    monkeypatch.setattr("hpctrain.launch.follow.follow_local", follow_local)
    assert main(["submit", str(write(tmp_path, CPU_STUDY)), "--local", "--json", "--no-preflight"]) == 1
    assert events == ["submit nodes-1", "ran nodes-1", "submit nodes-2", "ran nodes-2"]
    report = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in report["runs"]] == ["nodes-1", "nodes-2"]


def test_preflight_of_a_study_names_the_points_a_finding_concerns() -> None:
    shared = Finding("warning", "data.root", "/d is not visible from this machine")
    big = Finding("error", "resources.nodes", "16 nodes, but partition 'gpu' has 8")
    merged = study_findings([("nodes-1", [shared]), ("nodes-8", [shared]), ("nodes-16", [shared, big])])
    assert merged == [
        Finding("error", "resources.nodes", "16 nodes, but partition 'gpu' has 8 (study point nodes-16)"),
        shared,  # every point: said once, without labels
    ]

"""The Python API (``import hpctrain``): the same library as the verbs, no torch, errors as exceptions.

One test runs a real local job on a tiny generated dataset (one CPU task, two
steps); the others replace Slurm with fakes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import in_process

import hpctrain
from hpctrain.cli.main import main
from hpctrain.contract.rundir import cancel_marker_path, report_dir, write_run_info
from hpctrain.contract.summary import write_summary
from hpctrain.dataset.generate import make_dataset
from hpctrain.errors import HpctrainError, RunDirError, SpecError, UsageError
from tests.fake_slurm import FakeSlurm

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 600  # a hang guard for the local run, not a timing assertion


pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture(autouse=True)
def fixed_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ids fixed, so two renders name one directory."""
    monkeypatch.setattr("hpctrain.contract.rundir.new_run_id", lambda now=None: "20260101-000000")


def test_import_hpctrain_and_the_api_names_import_no_torch() -> None:
    code = (
        "import sys, hpctrain\n"
        "before = sorted(m for m in sys.modules if m.startswith('hpctrain'))\n"
        "names = [hpctrain.load_job, hpctrain.submit, hpctrain.status, hpctrain.cancel, hpctrain.resume, "
        "hpctrain.report, hpctrain.RunStatus, hpctrain.HpctrainError]\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'submitit')]\n"
        "print(before, heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['hpctrain'] []"  # 'import hpctrain' alone loads nothing else


def test_every_exported_name_resolves_and_an_unknown_one_is_an_attribute_error() -> None:
    assert set(hpctrain.__all__) == {"__version__", *hpctrain._LAZY}
    assert all(getattr(hpctrain, name) is not None for name in hpctrain.__all__)
    with pytest.raises(AttributeError, match="no attribute 'sumbit'"):
        hpctrain.sumbit  # noqa: B018


@pytest.mark.parametrize("spec", ["jobs/resnet50_4x4.yaml", "jobs/sweep_lr.yaml", "jobs/scaling_hal.yaml"])
def test_a_dry_run_returns_what_submit_dry_run_prints(
    spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", str(REPO / spec), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    planned = hpctrain.submit(hpctrain.load_job(REPO / spec), dry_run=True)
    assert planned.plan == printed and planned.job_id is None and planned.backend == "slurm"
    if spec == "jobs/scaling_hal.yaml":  # a study: each point has its own script, in the plan
        assert planned.script is None and "# --- point 5/5: nodes-16" in printed
    else:
        assert printed.startswith(planned.script) and "\n#SBATCH --nodes=" in planned.script
        assert f"--output={planned.run_dir}/submitit/" in planned.script
    assert not (tmp_path / "home" / "hpctrain-runs").exists()  # a dry run writes nothing


def test_load_job_reports_every_problem_and_refuses_a_bare_string(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        hpctrain.load_job(REPO / "jobs/quickstart.yaml", ["trainer.epochs=0", "resources.nodes=0"])
    assert len(caught.value.problems) == 2
    with pytest.raises(UsageError, match="list of 'key=value'"):
        hpctrain.load_job(REPO / "jobs/quickstart.yaml", "trainer.epochs=2")
    with pytest.raises(HpctrainError):  # never SystemExit
        hpctrain.submit(tmp_path / "missing.yaml", dry_run=True)


def test_status_and_cancel_of_a_missing_run_are_run_dir_errors(tmp_path: Path) -> None:
    for call in (hpctrain.status, hpctrain.cancel, hpctrain.resume):
        with pytest.raises(RunDirError, match="not an hpctrain run directory"):
            call(tmp_path)


def slurm_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str) -> tuple[Path, FakeSlurm]:
    """A Slurm run whose job Slurm (a fake, in-process) says is in ``state``."""
    run_dir = tmp_path / "runs" / "demo" / "1"
    run_dir.mkdir(parents=True)
    write_run_info(run_dir, {"name": "demo", "job_id": "4242", "backend": "slurm", "cluster": "hal"})
    write_summary(run_dir, {"status": "completed" if state == "COMPLETED" else "running", "global_step": 9})
    return run_dir, FakeSlurm({"4242": state}).install(monkeypatch)


def test_status_is_what_status_json_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _ = slurm_run(tmp_path, monkeypatch, "RUNNING")
    status = hpctrain.status(run_dir)
    assert main(["status", str(run_dir), "--json"]) == 0
    assert status.as_dict() == json.loads(capsys.readouterr().out)
    assert (status.status, status.slurm_state, status.global_step, status.finished) == ("running", "RUNNING", 9, False)
    with pytest.raises(AttributeError):  # frozen
        status.status = "completed"  # type: ignore[misc]


def test_resume_refuses_while_the_job_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, _ = slurm_run(tmp_path, monkeypatch, "RUNNING")
    with pytest.raises(UsageError, match="job 4242 of this run is still RUNNING"):
        hpctrain.resume(run_dir)


def test_a_local_submit_with_wait_completes_and_then_has_nothing_to_cancel(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_dataset(data, classes=2, per_class=4, val_per_class=2, image_size=32)
    spec = {
        "name": "api",
        "cluster": "local",
        "output_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:30:00"},
        "trainer": {"arch": "resnet18", "strategy": "single", "batch_size": 4, "epochs": 1, "max_steps_per_epoch": 2},
        "data": {"root": str(data), "image_size": 32, "val_resize": 36, "workers": 0},
    }
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump(spec))
    submitted = hpctrain.submit(hpctrain.load_job(path), local=True, wait=True)
    assert submitted.backend == "local" and submitted.state == "completed" and submitted.job_id
    assert submitted.run_dir.parent == tmp_path / "runs" / "api"
    status = hpctrain.status(submitted.run_dir)
    assert status.status == "completed" and status.epochs_completed == 1 and status.finished
    ended = hpctrain.cancel(submitted.run_dir)  # nothing left to cancel: said, nothing written or signalled
    assert ended.already_ended and ended.state.startswith("already ended (its ") and ended.status == "completed"
    assert not cancel_marker_path(submitted.run_dir).exists()
    written = hpctrain.report(submitted.run_dir, out=report_dir(tmp_path))
    assert written.html.is_file() and written.markdown.is_file() and written.out_dir == report_dir(tmp_path)


def test_a_study_status_is_what_status_json_prints_and_an_ended_study_has_nothing_to_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_launch_study import made_study

    study_dir = made_study(tmp_path, monkeypatch)
    study = hpctrain.status(study_dir)
    assert main(["status", str(study_dir), "--json"]) == 0
    assert study.as_dict() == json.loads(capsys.readouterr().out)
    assert [(p["label"], p["status"]) for p in study.points] == [("nodes-1", "completed"), ("nodes-2", "completed")]
    cancelled = hpctrain.cancel(study_dir)
    assert [c.already_ended for c in cancelled] == [True, True]  # every point had ended: nothing signalled
    with pytest.raises(UsageError, match="is a study of 2 points"):
        hpctrain.resume(study_dir)


def test_cancel_of_a_running_job_writes_the_marker_then_scancels_and_returns_where_it_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, fake = slurm_run(tmp_path, monkeypatch, "RUNNING")
    events: list[str] = []

    def scancel(argv: list[str]) -> tuple[int, str]:
        events.append(f"{' '.join(argv)} (marker written: {cancel_marker_path(run_dir).exists()})")
        write_summary(run_dir, {"status": "stopped", "global_step": 9})
        fake.jobs["4242"] = "CANCELLED"
        return 0, ""

    fake.answers["scancel"] = scancel
    fake.kill_wait_s = 30
    done = hpctrain.cancel(run_dir, timeout_s=5)
    assert events == ["scancel 4242 (marker written: True)"]
    assert (done.job_id, done.state, done.status, done.settled, done.checkpoint_step) == (
        "4242",
        "CANCELLED",
        "stopped",
        True,
        None,
    )


# ---------------------------------------------------------------- one door, two faces: every verb through both


def through_api(call: Any) -> tuple[int, Any, str]:
    """A Python API call as the CLI would end it: (exit code, result, error message)."""
    try:
        return 0, call(), ""
    except HpctrainError as exc:
        return exc.exit_code, None, exc.message


def agree_on_the_error(cli: subprocess.CompletedProcess[str], api: tuple[int, Any, str]) -> None:
    """The same refusal: one exit code, the API's message is the CLI's error line, no traceback."""
    assert cli.returncode == api[0] != 0 and api[1] is None
    assert cli.stderr.startswith(f"error: {api[2]}") and "Traceback" not in cli.stderr


def test_both_faces_cancel_an_ended_run_alike_writing_and_signalling_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, fake = slurm_run(tmp_path, monkeypatch, "COMPLETED")
    done = in_process(capsys, "cancel", str(run_dir))
    code, out = done.returncode, done.stdout
    done = hpctrain.cancel(run_dir)
    assert code == 0 and done.already_ended and (done.state, done.status) == ("already ended (COMPLETED)", "completed")
    assert out.splitlines()[0] == f"job 4242: {done.state}; run status: {done.status}"
    as_json = in_process(capsys, "cancel", str(run_dir), "--json")  # what a remote hpctrain.cancel reads back
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == {
        **{name: getattr(done, name) for name in done.__dataclass_fields__},
        "run_dir": str(run_dir),
        "dependents": [],
    }
    assert not cancel_marker_path(run_dir).exists() and not fake.asked("scancel")


def test_both_faces_cancel_a_running_job_with_the_same_protocol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, fake = slurm_run(tmp_path, monkeypatch, "RUNNING")
    done = in_process(capsys, "cancel", str(run_dir))
    code, out = done.returncode, done.stdout
    cli_commands, fake.commands = [argv[0] for argv in fake.commands], []
    assert code == 0 and out.startswith("job 4242: CANCELLED; run status: stopped (the job ended before")
    fake.jobs["4242"] = "RUNNING"  # the same job, running again, through the other face
    done = hpctrain.cancel(run_dir)
    assert (done.state, done.already_ended) == ("CANCELLED", False)
    assert [argv[0] for argv in fake.commands] == cli_commands and cli_commands.count("scancel") == 1


def test_both_faces_refuse_a_run_json_that_names_no_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, fake = slurm_run(tmp_path, monkeypatch, "RUNNING")
    write_run_info(run_dir, {"name": "demo", "job_id": "--user=me", "backend": "slurm"})
    for verb in ("cancel", "resume"):
        call = getattr(hpctrain, verb)
        agree_on_the_error(in_process(capsys, verb, str(run_dir)), through_api(lambda call=call: call(run_dir)))
    assert fake.commands == [] and not cancel_marker_path(run_dir).exists()


@pytest.mark.parametrize(("state", "stopping"), [("RUNNING", False), ("CANCELLED", True)])
def test_both_faces_refuse_to_resume_while_the_previous_attempt_may_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], state: str, stopping: bool
) -> None:
    run_dir, fake = slurm_run(tmp_path, monkeypatch, state)
    if stopping:
        fake.stopping.add("4242")
    cli, api = in_process(capsys, "resume", str(run_dir)), through_api(lambda: hpctrain.resume(run_dir))
    agree_on_the_error(cli, api)
    assert ("still stopping" if stopping else "still RUNNING") in api[2]


def test_both_faces_agree_on_status_of_a_run_and_a_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_launch_study import made_study

    run_dir, _ = slurm_run(tmp_path, monkeypatch, "PENDING")
    (tmp_path / "study").mkdir()
    study_dir = made_study(tmp_path / "study", monkeypatch)
    for target in (run_dir, study_dir):
        done = in_process(capsys, "status", str(target), "--json")
        code, out = done.returncode, done.stdout
        assert code == 0 and json.loads(out) == hpctrain.status(target).as_dict()
    agree_on_the_error(in_process(capsys, "status", str(tmp_path)), through_api(lambda: hpctrain.status(tmp_path)))


def test_both_faces_agree_on_validate_and_dry_run_and_their_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpctrain.launch.plan import describe

    spec = REPO / "jobs/resnet50_4x4.yaml"
    done = in_process(capsys, "validate", str(spec), "--set", "trainer.epochs=3")
    code, out = done.returncode, done.stdout
    assert (
        code == 0 and out.splitlines()[0] == f"{spec}: OK - {describe(hpctrain.load_job(spec, ['trainer.epochs=3']))}"
    )
    bad = ["--set", "resources.nodes=0", "--set", "trainer.arch=resnet5"]
    for verb in ("validate", "submit"):
        api = through_api(lambda: hpctrain.load_job(spec, [bad[1], bad[3]]))
        agree_on_the_error(in_process(capsys, verb, str(spec), *bad, *(["--dry-run"] if verb == "submit" else [])), api)
    image = tmp_path / "broken.sqsh"
    image.write_bytes(b"not an image" * 100)
    api = through_api(lambda: hpctrain.load_job(spec, [f"data.root={image}"]))
    agree_on_the_error(in_process(capsys, "validate", str(spec), "--set", f"data.root={image}"), api)
    assert "data.root" in api[2]  # the image is read by both doors, not only by the command line


def test_both_faces_agree_on_the_doctor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeSlurm(answers={"scontrol ping": (0, "Slurmctld(primary) at ctl is DOWN\n")}).install(monkeypatch)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: j\ncluster: slurm\noutput_dir: {tmp_path / 'runs'}\ndata: {{root: {tmp_path / 'd'}}}\n")
    done = in_process(capsys, "doctor", str(spec), "--json")
    code, out = done.returncode, done.stdout
    found = hpctrain.doctor(spec)
    assert code == 1 and not found.ok and json.loads(out) == found.as_json()
    assert any(check.key == "controller" and check.level == "error" for check in found.checks)


def test_both_faces_agree_on_the_report_of_a_study_and_on_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_launch_study import made_study

    study_dir = made_study(tmp_path, monkeypatch)
    out = tmp_path / "both"
    done = in_process(capsys, "report", str(study_dir), "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    written = hpctrain.report(study_dir, out=out)  # the same files again: its own, so rewritten
    assert json.loads(done.stdout) == json.loads(json.dumps(written.as_json(), default=str))
    assert written.html == out / "report.html" and written.markdown.is_file()
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "report.md").write_text("someone else's notes\n")
    agree_on_the_error(
        in_process(capsys, "report", str(study_dir), "--out", str(tmp_path / "theirs")),
        through_api(lambda: hpctrain.report(study_dir, out=tmp_path / "theirs")),
    )
    assert (tmp_path / "theirs" / "report.md").read_text() == "someone else's notes\n"


def test_both_faces_agree_on_the_bad_node_ledger_and_on_forgetting_a_node(capsys: pytest.CaptureFixture[str]) -> None:
    from hpctrain.contract import bad_nodes

    bad_nodes.append_entries(
        bad_nodes.new_entry(node, cluster=cluster, reason="slurmd gone", kind="lost", evidence={"step": 3}, run="r",
                            job_id="7")
        for node, cluster in (("n2", "hal"), ("n3", "hal"), ("n3", "other"))
    )  # fmt: skip
    for flags, kwargs in (([], {}), (["--cluster", "hal"], {"cluster": "hal"}), (["--all"], {"include_expired": True})):
        done = in_process(capsys, "nodes", "--json", *flags)
        assert done.returncode == 0 and json.loads(done.stdout) == hpctrain.nodes(**kwargs).as_json()
    hal = hpctrain.nodes(cluster="hal").rows
    assert [(row["node"], row["cluster"]) for row in hal] == [("n2", "hal"), ("n3", "hal")]
    done = in_process(capsys, "nodes", "--forget", "n3", "--cluster", "other")
    assert done.returncode == 0 and done.stdout.startswith("forgot 1 entry of n3 on cluster other")
    assert hpctrain.forget_node("n3") == 1 and hpctrain.forget_node("n3") == 0
    assert [row["node"] for row in hpctrain.nodes().rows] == ["n2"] == [r["node"] for r in json.loads(
        in_process(capsys, "nodes", "--json").stdout)]  # fmt: skip


# ---------------------------------------------------------------- the Python API's hostile input (issue 30)


@pytest.mark.parametrize(
    "edit",
    [
        lambda job: job.spec.env.__setitem__("X", "a\n#SBATCH --uid=0"),
        lambda job: job.spec.resources.slurm_extra.__setitem__("reservation\n#SBATCH --uid=0", "r"),
        lambda job: job.spec.resources.slurm_extra.__setitem__("reservation", "r\n#SBATCH --uid=0"),
        lambda job: object.__setattr__(job.spec.resources, "min_nodes", 8),
        lambda job: object.__setattr__(job, "spec", job.spec.model_copy(update={"name": "a b/../c"})),
        lambda job: object.__setattr__(job, "spec", {"name": "x"}),
    ],
)
def test_a_job_edited_after_load_job_is_checked_again_before_anything_is_submitted(
    edit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSlurm().install(monkeypatch)
    job = hpctrain.load_job(REPO / "jobs/smoke_2x2_cpu.yaml", [f"output_dir={tmp_path / 'runs'}", "resources.nodes=4"])
    edit(job)
    for dry_run in (True, False):
        with pytest.raises(SpecError) as refused:
            hpctrain.submit(job, dry_run=dry_run)
        assert "changed after load_job" in (refused.value.hint or "")
    assert fake.commands == [] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda: hpctrain.submit(123),
        lambda: hpctrain.submit(None, dry_run=True),
        lambda: hpctrain.submit(REPO / "jobs/quickstart.yaml", dry_run="yes"),
        lambda: hpctrain.submit(REPO / "jobs/quickstart.yaml", dry_run=True, log=5),
        lambda: hpctrain.load_job(["jobs/quickstart.yaml"]),
        lambda: hpctrain.load_job(REPO / "jobs/quickstart.yaml", [5]),
        lambda: hpctrain.load_job(REPO / "jobs/quickstart.yaml", cluster=5),
        lambda: hpctrain.status(None),
        lambda: hpctrain.status(3.5),
        lambda: hpctrain.cancel(REPO, timeout_s="5"),
        lambda: hpctrain.cancel(REPO, timeout_s=float("nan")),
        lambda: hpctrain.cancel(REPO, timeout_s=-1),
        lambda: hpctrain.resume(REPO, overrides=[None]),
        lambda: hpctrain.resume(REPO, wait=1),
        lambda: hpctrain.report(5),
        lambda: hpctrain.report([]),
        lambda: hpctrain.report(REPO, out=5),
        lambda: hpctrain.doctor(spec=5),
        lambda: hpctrain.nodes(cluster=5),
        lambda: hpctrain.nodes(include_expired="yes"),
        lambda: hpctrain.forget_node(3),
        lambda: hpctrain.forget_node("n3", cluster=["hal"]),
    ],
)
def test_wrong_argument_types_are_usage_errors_that_name_the_argument(call: Any) -> None:
    with pytest.raises(UsageError) as refused:
        call()
    assert "=" in refused.value.message  # names the argument and what it got


# ------------------------------------- cancel and doctor: one library door each (launch/cancel.py, diagnose/doctor.py)


def printed_cancel(done: Any) -> str:
    """The line ``hpctrain cancel`` prints first for one run, from the API's answer."""
    return f"job {done.job_id}: {done.state}; run status: {done.status}"


def test_both_faces_cancel_a_study_and_refuse_a_missing_path_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_launch_study import made_study

    study_dir = made_study(tmp_path, monkeypatch)
    cli = in_process(capsys, "cancel", str(study_dir))
    api = hpctrain.cancel(study_dir)
    assert cli.returncode == 0 and [c.already_ended for c in api] == [True, True]
    expected = [
        line for point, done in zip(("nodes-1", "nodes-2"), api) for line in (f"{point}:", printed_cancel(done))
    ]
    assert [line for line in cli.stdout.splitlines() if not line.startswith(("last complete", "no checkpoint"))] == (
        expected
    )
    as_json = json.loads(in_process(capsys, "cancel", str(study_dir), "--json").stdout)
    assert [p["label"] for p in as_json["points"]] == ["nodes-1", "nodes-2"]
    assert [p["result"]["already_ended"] for p in as_json["points"]] == [True, True]
    for missing in (tmp_path / "nowhere", tmp_path / "runs"):  # not there; there, but neither a run nor a study
        agree_on_the_error(
            in_process(capsys, "cancel", str(missing)), through_api(lambda m=missing: hpctrain.cancel(m))
        )


def test_both_faces_report_a_study_point_that_cannot_be_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_launch_study import made_study

    study_dir = made_study(tmp_path, monkeypatch)
    write_run_info(study_dir / "nodes-2", {"name": "st", "job_id": "--user=me", "backend": "slurm"})
    FakeSlurm().install(monkeypatch)
    cli = in_process(capsys, "cancel", str(study_dir))
    code, _, message = through_api(lambda: hpctrain.cancel(study_dir))
    assert cli.returncode == code != 0 and "nodes-1:" in cli.stdout and "nodes-2:" in cli.stdout
    point_error = cli.stderr.removeprefix("error: ").splitlines()[0]
    assert message.startswith(f"{study_dir}: 1 point(s) could not be cancelled: nodes-2: ") and point_error in message


def doctor_spec_file(tmp_path: Path, extra: str = "") -> Path:
    spec = tmp_path / "job.yaml"
    runs, data = tmp_path / "runs", tmp_path / "d"
    spec.write_text(f"name: j\ncluster: slurm\noutput_dir: {runs}\ndata: {{root: {data}}}\n{extra}")
    return spec


@pytest.mark.parametrize(
    ("case", "extra"),
    [
        ("a run", ""),
        ("a study", "study: {resources.nodes: [1, 2]}\n"),
        # validate's loader (the API's, before) refused these; load_job (the CLI's) let them through unchecked
        ("a missing script", "script: {path: MISSING}\n"),
        ("an entry point that cannot take ctx", "entrypoint: 'doctor_entry:main'\n"),
    ],
)
def test_both_faces_agree_on_the_doctor_of(
    case: str, extra: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeSlurm(answers={"scontrol ping": (0, "Slurmctld(primary) at ctl is DOWN\n")}).install(monkeypatch)
    (tmp_path / "doctor_entry.py").write_text("def main():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = doctor_spec_file(tmp_path, extra.replace("MISSING", str(tmp_path / "missing.py")))
    cli = in_process(capsys, "doctor", str(spec), "--json", "--set", "trainer.epochs=2")
    found = hpctrain.doctor(spec, ["trainer.epochs=2"])
    assert cli.returncode == (0 if found.ok else 1) == 1 and json.loads(cli.stdout) == found.as_json()
    errors = {check.key for check in found.checks if check.level == "error"}
    wanted = {"a missing script": "script.path", "an entry point that cannot take ctx": "entrypoint"}.get(case)
    assert "controller" in errors and (wanted is None or wanted in errors), found.checks


def test_both_faces_refuse_a_missing_or_wrong_spec_for_the_doctor_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.yaml"
    agree_on_the_error(in_process(capsys, "doctor", str(missing)), through_api(lambda: hpctrain.doctor(missing)))
    wrong = doctor_spec_file(tmp_path, "resources: {nodes: 0}\n")
    cli, api = in_process(capsys, "doctor", str(wrong)), through_api(lambda: hpctrain.doctor(wrong))
    assert cli.returncode == api[0] != 0 and "resources.nodes" in cli.stderr and "Traceback" not in cli.stderr

"""Run directories, the job-id registry, sacct parsing and the status/logs/cancel
commands on a run directory, without Slurm (its answers come from tests/fake_slurm.py)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import hpctrain, in_process, isolated_env

from hpctrain.contract import job_registry
from hpctrain.contract.rundir import (
    atomic_write_text,
    cancel_marker_path,
    checkpoints_dir,
    create_run_dir,
    next_run_dir,
    read_run_info,
    run_info_path,
    submitit_dir,
    summary_path,
    write_run_info,
)
from hpctrain.contract.slurm_answers import parse_sacct_states
from hpctrain.contract.slurm_states import TERMINAL_STATES, normalise_state
from hpctrain.errors import RunDirError
from tests.fake_slurm import FakeSlurm

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def fake_run(tmp_path: Path, job_id: str = "4242", backend: str = "slurm") -> Path:
    run_dir = create_run_dir(str(tmp_path / "runs"), "demo")
    submitit_dir(run_dir).mkdir()
    write_run_info(
        run_dir,
        {
            "name": "demo",
            "job_id": job_id,
            "job_ids": [job_id],
            "backend": backend,
            "submitit_dir": str(submitit_dir(run_dir)),
            "cluster": "slurm",
        },
    )
    job_registry.record(job_id, run_dir)
    return run_dir


def test_run_dirs_are_never_reused(tmp_path: Path) -> None:
    first = create_run_dir(str(tmp_path), "job")
    second = create_run_dir(str(tmp_path), "job")
    assert first != second and first.parent == second.parent == tmp_path / "job"
    assert next_run_dir(str(tmp_path), "job") not in (first, second)


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = summary_path(tmp_path)
    atomic_write_text(target, "old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_registry_maps_job_ids_and_array_tasks_to_run_dirs(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, job_id="77")
    sweep_dir = fake_run(tmp_path, job_id="88_3")
    assert job_registry.resolve_run("77") == run_dir
    assert job_registry.resolve_run("88_3") == sweep_dir
    assert job_registry.resolve_run("88") == sweep_dir
    assert job_registry.resolve_run(str(run_dir)) == run_dir
    with pytest.raises(RunDirError, match="not submitted by hpctrain"):
        job_registry.resolve_run("99999")
    with pytest.raises(RunDirError, match="not an hpctrain run directory"):
        job_registry.resolve_run(str(tmp_path))


def test_unreadable_run_info_is_a_clear_error(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path)
    run_info_path(run_dir).write_text("{not json")
    with pytest.raises(RunDirError, match="unreadable"):
        read_run_info(run_dir)


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("COMPLETED", "COMPLETED"),
        ("CANCELLED by 0", "CANCELLED"),
        ("RUNNING", "RUNNING"),
        ("", "UNKNOWN"),
        ("FAILED+", "FAILED"),
    ],
)
def test_state_normalisation(raw: str, state: str) -> None:
    assert normalise_state(raw) == state


def test_sacct_parsing_keeps_array_tasks_apart() -> None:
    output = "12_0|COMPLETED\n12_1|CANCELLED by 0\n12_[2-3]|PENDING\n13|REQUEUED\n"
    states = parse_sacct_states(output)
    assert states == {"12_0": "COMPLETED", "12_1": "CANCELLED", "12_[2-3]": "PENDING", "13": "REQUEUED"}
    assert "REQUEUED" not in TERMINAL_STATES and "PENDING" not in TERMINAL_STATES


def cli(*args: str, env_home: Path) -> subprocess.CompletedProcess[str]:
    return hpctrain(*args, env=isolated_env(env_home, state=env_home))


def test_logs_prints_the_tail_of_a_rank_log(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, job_id="55")
    (submitit_dir(run_dir) / "55_1_log.out").write_text("".join(f"line {i}\n" for i in range(100)))
    result = cli("logs", "55", "--rank", "1", "-n", "3", env_home=tmp_path / "state")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "line 97\nline 98\nline 99\n"
    missing = cli("logs", "55", "--rank", "2", env_home=tmp_path / "state")
    assert missing.returncode == 2 and "no log yet" in missing.stderr and "Traceback" not in missing.stderr


def test_status_of_a_run_shows_training_progress(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, job_id="66", backend="local")
    atomic_write_text(
        summary_path(run_dir),
        json.dumps({"status": "stopped", "epochs_completed": 3, "val_top1": 61.25, "restarts": 1}),
    )
    result = cli("status", str(run_dir), "--json", env_home=tmp_path / "state")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["status"] == "stopped" and status["epochs_completed"] == 3 and status["restarts"] == 1
    listing = cli("status", env_home=tmp_path / "state")
    assert listing.returncode == 0 and "66" in listing.stdout


def test_resume_refuses_a_sweep_parent(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, job_id="70")
    info = read_run_info(run_dir)
    write_run_info(run_dir, {**info, "trials": 3})
    result = cli("resume", str(run_dir), env_home=tmp_path / "state")
    assert result.returncode == 2 and "sweep" in result.stderr and "Traceback" not in result.stderr


def test_status_names_the_failed_task_when_rank_zero_could_not(tmp_path: Path) -> None:
    from hpctrain.launch.run_state import reconcile

    run_dir = fake_run(tmp_path, job_id="81")
    (submitit_dir(run_dir) / "81_0_log.err").write_text(
        "some warning\nsrun: error: n2: task 3: Killed\nsrun: error: n1: tasks 0-1: Terminated\n"
    )
    summary = reconcile({"status": "running", "global_step": 4}, "FAILED", run_dir)
    assert summary["status"] == "failed" and summary["global_step"] == 4
    assert (summary["failed_rank"], summary["failed_node"], summary["failed_reason"]) == (3, "n2", "Killed")
    # what the run itself recorded wins; a finished or still-running job is left alone
    recorded = {"status": "failed", "failed_rank": 1}
    assert reconcile(recorded, "FAILED", run_dir) == recorded
    assert reconcile({"status": "running"}, "RUNNING", run_dir) == {"status": "running"}
    assert reconcile({"status": "running"}, "CANCELLED", run_dir)["status"] == "stopped"


def test_cancel_waits_for_the_stop_checkpoint_and_prints_the_final_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = fake_run(tmp_path, job_id="77")
    atomic_write_text(summary_path(run_dir), json.dumps({"status": "running", "global_step": 4}))
    fake = FakeSlurm({"77": "RUNNING"}, settle_on_cancel=False).install(monkeypatch)

    def ranks_stop() -> None:  # the ranks finish the stop checkpoint ~1.5 s after Slurm already says CANCELLED
        step = checkpoints_dir(run_dir) / "step-00000007"
        step.mkdir(parents=True)
        (step / "state.pt").write_bytes(b"abc")
        meta = {"format_version": 1, "global_step": 7, "files": {"state.pt": {"size": 3}}}
        (step / "meta.json").write_text(json.dumps(meta))
        atomic_write_text(summary_path(run_dir), json.dumps({"status": "stopped", "global_step": 7}))
        time.sleep(0.5)
        fake.settle("77")  # the ranks exit: COMPLETING ends

    writer = threading.Timer(1.5, ranks_stop)
    writer.start()
    result = in_process(capsys, "cancel", str(run_dir))
    writer.join(timeout=30)
    assert result.returncode == 0, result.stderr
    assert "job 77: CANCELLED; run status: stopped" in result.stdout
    assert "last complete checkpoint: step 7" in result.stdout
    assert json.loads(cancel_marker_path(run_dir).read_text())["job_ids"] == ["77"]


def test_cancel_gives_up_waiting_after_kill_wait_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = fake_run(tmp_path, job_id="77")
    atomic_write_text(summary_path(run_dir), json.dumps({"status": "running", "global_step": 4}))
    FakeSlurm({"77": "RUNNING"}, settle_on_cancel=False).install(monkeypatch)
    monkeypatch.setattr("hpctrain.launch.cancel.SETTLE_MARGIN_S", 1.0)  # KillWait 0 + 1 s: the ranks never exit
    result = in_process(capsys, "cancel", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert "run status: running" in result.stdout and "may still be writing" in result.stdout


def test_resume_refuses_while_the_cancelled_job_is_still_stopping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = fake_run(tmp_path, job_id="77")
    fake = FakeSlurm({"77": "CANCELLED"}).install(monkeypatch)
    fake.stopping.add("77")
    result = in_process(capsys, "resume", str(run_dir))
    assert result.returncode == 2 and "still stopping" in result.stderr and "Traceback" not in result.stderr
    fake.settle("77")
    fake.jobs["77"] = "RUNNING"
    running = in_process(capsys, "resume", str(run_dir))
    assert running.returncode == 2 and "still RUNNING" in running.stderr


def test_corrupt_registry_lines_and_a_list_run_json_never_crash(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, job_id="81")
    with job_registry.registry_path().open("a") as registry:
        registry.write('[1, 2]\n{"job_id": 5, "run_dir": null}\n{"job_id": "9"}\nnot json\n')
    assert [entry["job_id"] for entry in job_registry.entries()] == ["81"]
    listing = cli("status", env_home=tmp_path / "state")
    assert listing.returncode == 0 and "81" in listing.stdout, listing.stderr
    run_info_path(run_dir).write_text("[]")
    for command in (["status", str(run_dir)], ["logs", str(run_dir)]):
        result = cli(*command, env_home=tmp_path / "state")
        assert result.returncode == 2 and "not the run's record" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_logs_refuses_a_negative_count_and_a_rank_the_job_lacks(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, job_id="82")
    write_run_info(run_dir, {**read_run_info(run_dir), "world_size": 4})
    negative = cli("logs", "82", "-n", "-3", env_home=tmp_path / "state")
    assert negative.returncode == 2 and "negative" in negative.stderr
    rank = cli("logs", "82", "--rank", "99", env_home=tmp_path / "state")
    assert rank.returncode == 2 and "this job has 4 tasks" in rank.stderr and "pending" not in rank.stderr
    write_run_info(run_dir, {**read_run_info(run_dir), "tasks": 2})  # a script per node (or torchrun): a log per node
    node = cli("logs", "82", "--rank", "3", env_home=tmp_path / "state")
    assert node.returncode == 2 and "this job has 2 tasks, one log per node" in node.stderr, node.stderr


def test_status_output_dir_lists_the_runs_under_it_and_pending_cancelled_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registered = fake_run(tmp_path / "a", job_id="77")
    other = tmp_path / "elsewhere"
    elsewhere = create_run_dir(str(other), "demo")
    write_run_info(elsewhere, {"name": "demo", "job_id": "88", "backend": "slurm", "submitted_at": 1.0})
    FakeSlurm({"77": "CANCELLED by 1000", "88": "CANCELLED by 1000"}).install(monkeypatch)
    under = in_process(capsys, "status", "--output-dir", str(other), "--json")
    assert under.returncode == 0, under.stderr
    assert [row["run_dir"] for row in json.loads(under.stdout)] == [str(elsewhere)]
    registry = in_process(capsys, "status", "--json")
    rows = json.loads(registry.stdout)
    assert [row["run_dir"] for row in rows] == [str(registered)] and rows[0]["status"] == "cancelled"
    one = in_process(capsys, "status", "77", "--json")
    assert json.loads(one.stdout)["status"] == "cancelled"


def test_status_words_from_slurm_when_the_run_never_started() -> None:
    from hpctrain.launch.run_state import display_status

    assert display_status(None, "PENDING") == "pending"
    assert display_status(None, "CANCELLED") == "cancelled"
    assert display_status(None, "NODE_FAIL") == "failed"
    assert display_status("stopped", "CANCELLED") == "stopped"
    assert display_status(None, None) is None


@pytest.mark.parametrize("job_id", ["--user=root", "-1", "77,78", "77 78", "", "all", "77_[1-3]"])
def test_cancel_of_a_run_json_naming_no_single_job_sends_nothing(
    tmp_path: Path, job_id: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """run.json is a file anyone may edit: '--user=root' would have become an option of scancel."""
    run_dir = fake_run(tmp_path, job_id="77")
    info = json.loads(run_info_path(run_dir).read_text())
    atomic_write_text(run_info_path(run_dir), json.dumps({**info, "job_id": job_id}))
    fake = FakeSlurm({"77": "RUNNING"}).install(monkeypatch)
    result = in_process(capsys, "cancel", str(run_dir))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "run.json" in result.stderr and "is not a Slurm job id" in result.stderr
    assert fake.commands == []
    assert not cancel_marker_path(run_dir).exists()


def test_status_lists_the_runs_of_the_project_here_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared account: runs submitted from another project are left to --all; a long run dir is never cut."""
    from cli_helpers import hpctrain, isolated_env

    from hpctrain.observe import run_status

    mine, theirs = tmp_path / "me" / "project", tmp_path / "them"
    mine.mkdir(parents=True), theirs.mkdir()
    monkeypatch.chdir(mine)
    here = fake_run(mine / ("deep" * 12), "71717")  # a run dir far longer than 80 columns
    monkeypatch.chdir(theirs)
    elsewhere = fake_run(tmp_path / "scratch", "82828")  # submitted from their folder, output outside both
    assert [run[2] for run in run_status.registry_runs(under=mine)] == [here]
    assert [run[2] for run in run_status.registry_runs(under=theirs)] == [elsewhere]
    assert {run[2] for run in run_status.registry_runs()} == {here, elsewhere}

    env = {**isolated_env(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    listed = hpctrain("status", env=env, cwd=mine)
    assert listed.returncode == 0, listed.stderr
    assert str(here) in listed.stdout and "82828" not in listed.stdout  # whole, on one line, though piped
    assert f"submitted from {mine} (--all: every run of this account)" in " ".join(listed.stdout.split())
    assert "82828" in hpctrain("status", "--all", env=env, cwd=mine).stdout
    nothing = hpctrain("status", env=env, cwd=tmp_path / "me")  # the parent of a project sees it; a sibling not
    assert str(here) in nothing.stdout
    (tmp_path / "other").mkdir()
    none_here = hpctrain("status", env=env, cwd=tmp_path / "other")
    assert "no runs submitted from" in none_here.stdout and "hpctrain status --all" in none_here.stdout


def test_a_registry_entry_from_before_submit_dir_is_still_listed(tmp_path: Path) -> None:
    from hpctrain.observe import run_status

    run_dir = fake_run(tmp_path / "elsewhere", "93939")
    registry = job_registry.registry_path()
    registry.write_text(json.dumps({"job_id": "93939", "run_dir": str(run_dir), "time": 1.7e9}) + "\n")
    assert [run[2] for run in run_status.registry_runs(under=tmp_path / "project")] == [run_dir]

"""The batch step's supervisor against fake ``srun`` and ``scontrol`` commands: what it starts after a
failed step, what it records, when it requeues and when it stops (healing/supervisor.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.rundir import read_json_object, read_summary, spec_path, write_summary
from hpctrain.healing import supervisor
from hpctrain.healing.evidence import NodeProbe
from hpctrain.healing.record import HealRecord, load_spec
from hpctrain.jobspec.yaml_source import dump_yaml
from hpctrain.runtime import stop_signals

# Each call of the fake srun takes its behaviour from the next line of plan.txt:
# "ok", "raise NODE TASK" (a task exits 1), "kill NODE TASK" (a task is killed) or "hang NODE TASK"
# (the hang watchdog names the task: it claims the report, writes it into summary.json, the ranks exit 87).
FAKE_SRUN = """#!{python}
import json, os, sys
from pathlib import Path
here = Path(os.environ["FAKE_DIR"])
calls = sorted(here.glob("call-*.json"))
json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, open(here / f"call-{{len(calls)}}.json", "w"))
plan = (here / "plan.txt").read_text().split("\\n")[len(calls)].split()
if plan[0] == "ok":
    sys.exit(0)
if plan[0] == "hang":
    run = here / "run"
    (run / "stacks").mkdir(exist_ok=True)
    (run / "stacks" / ".hang-reported-7").write_text("1\\n")
    report = dict(status="failed", hung_rank=int(plan[2]), hung_node=plan[1], hung_phase="forward_backward")
    report.update(hung_step=5, hung_frozen_s=21.4, hang_job_id="7")
    (run / "summary.json").write_text(json.dumps(report))
    print("srun: error: n1: task 0: Exited with exit code 87", file=sys.stderr, flush=True)
    sys.exit(87)
reason = "Exited with exit code 1" if plan[0] == "raise" else "Killed"
print(f"srun: error: {{plan[1]}}: task {{plan[2]}}: {{reason}}", file=sys.stderr, flush=True)
sys.exit(1)
"""
FAKE_SLURM = """#!{python}
import os, sys
from pathlib import Path
with open(Path(os.environ["FAKE_DIR"]) / "slurm.txt", "a") as log:
    log.write(" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) + "\\n")
if sys.argv[1:3] == ["--oneliner", "show"]:
    print("JobId=7 JobState=RUNNING")
if Path(sys.argv[0]).name == "sinfo":
    print(os.environ.get("FAKE_SINFO", ""))
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in [("srun", FAKE_SRUN), *((n, FAKE_SLURM) for n in ("scontrol", "squeue", "sinfo", "scancel"))]:
        path = bin_dir / name
        path.write_text(text.format(python=sys.executable))
        path.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    monkeypatch.setattr(supervisor, "POLL_S", 0.05)
    monkeypatch.setattr(supervisor, "START_GUARDIAN", False)  # its srun would take a line of the plan
    return tmp_path


def run(
    tmp: Path, plan: list[str], resources: dict[str, Any], restart: int = 0, **signals: Any
) -> tuple[int, list[dict[str, Any]]]:
    (tmp / "plan.txt").write_text("\n".join(plan) + "\n")
    run_dir = tmp / "run"
    run_dir.mkdir(exist_ok=True)
    spec = {
        "name": "heal",
        "entrypoint": "x.y:z",
        "resources": {"nodes": 2, "tasks_per_node": 2, **resources},
        "signals": signals,
    }
    spec_path(run_dir).write_text(dump_yaml(spec))
    environ = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURMD_NODENAME": "n1"}
    environ["SLURM_RESTART_COUNT"] = str(restart)
    rc = supervisor.main([str(run_dir), "--", "srun", "--kill-on-bad-exit=1", "python", "-m", "task"], environ=environ)
    calls = [json.loads(p.read_text()) for p in sorted(tmp.glob("call-*.json"))]
    return rc, calls


def slurm_log(tmp: Path) -> str:
    path = tmp / "slurm.txt"
    return path.read_text() if path.exists() else ""


def test_a_step_that_ends_well_runs_once_on_the_training_nodes(fake: Path) -> None:
    rc, calls = run(fake, ["ok"], {"spare_nodes": 1})
    assert rc == 0 and len(calls) == 1
    argv = calls[0]["argv"]
    assert argv[:5] == ["--overlap", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--nodelist=n1,n2"]
    assert argv[5:] == ["--kill-on-bad-exit=1", "python", "-m", "task"]
    assert "MASTER_PORT" not in calls[0]["env"] and "HPCTRAIN_STEP_NODES" not in calls[0]["env"]


def test_a_killed_rank_moves_the_run_to_the_spare(fake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, calls = run(fake, ["kill n2 2", "ok"], {"spare_nodes": 1})
    assert rc == 0 and len(calls) == 2
    assert "--nodelist=n1,n3" in calls[1]["argv"] and calls[1]["env"]["MASTER_PORT"].isdigit()
    summary = read_summary(fake / "run")
    assert summary is not None and summary.excluded_nodes == ["n2"]
    [failure] = summary.node_failures or []
    assert (failure["node"], failure["reason"], failure["action"], failure["nodes"]) == (
        "n2",
        "rank 2 killed",
        "continue",
        ["n1", "n3"],
    )
    assert "node n2 lost before the first step (rank 2 killed); continuing on n1,n3 from the start" in (
        capsys.readouterr().err
    )


def test_without_a_spare_the_run_goes_on_with_fewer_nodes(fake: Path) -> None:
    rc, calls = run(fake, ["kill n2 3", "ok"], {"min_nodes": 1, "nodes": 3})
    assert rc == 0
    assert calls[0]["argv"][1] == "--nodes=3" and calls[1]["argv"][1:5] == [
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--nodelist=n1,n3",
    ]
    assert calls[1]["env"]["HPCTRAIN_STEP_NODES"] == "2"


def test_a_hung_rank_moves_the_run_off_its_node_naming_its_phase(fake: Path) -> None:
    rc, calls = run(fake, ["hang n2 2", "ok"], {"spare_nodes": 1})
    assert rc == 0 and len(calls) == 2 and "--nodelist=n1,n3" in calls[1]["argv"]
    summary = read_summary(fake / "run")
    assert summary is not None and summary.excluded_nodes == ["n2"]
    [failure] = summary.node_failures or []
    assert (failure["node"], failure["action"]) == ("n2", "continue")
    expected = "rank 2 hung in phase forward_backward at step 5 (its process froze: heartbeat silent 21 s)"
    assert failure["reason"] == expected


def test_a_hang_report_of_an_earlier_start_blames_nothing(fake: Path) -> None:
    run_dir = fake / "run"
    (run_dir / "stacks").mkdir(parents=True)
    (run_dir / "stacks" / ".hang-reported-7").write_text("1\n")  # the same job id: a requeued job
    report = {"status": "running", "hung_rank": 2, "hung_node": "n2", "hung_phase": "data", "hang_job_id": "7"}
    write_summary(run_dir, report)
    rc, calls = run(fake, ["raise n2 2", "ok"], {"spare_nodes": 1}, restart=1)
    assert rc == 1 and len(calls) == 1  # the code raised: no node to blame, as without healing
    summary = read_summary(run_dir)
    assert summary is not None and not summary.node_failures


def test_a_rank_that_raised_ends_the_job_as_without_healing(fake: Path) -> None:
    rc, calls = run(fake, ["raise n2 2", "ok"], {"spare_nodes": 1})
    assert rc == 1 and len(calls) == 1
    summary = read_summary(fake / "run")
    assert summary is None or not summary.node_failures


def test_the_batch_nodes_rank_killed_requeues_without_it(fake: Path) -> None:
    rc, calls = run(fake, ["kill n1 0", "ok"], {"spare_nodes": 1})
    assert rc == 0 and len(calls) == 1
    log = slurm_log(fake)
    assert "scontrol requeue 7" in log and "scontrol update JobId=7 ExcNodeList=n1" in log
    assert log.index("requeue 7") < log.index("ExcNodeList")  # Slurm takes it only from a pending job
    summary = read_summary(fake / "run")
    assert summary is not None and summary.node_failures[0]["action"] == "requeue"  # type: ignore[index]


def test_a_crash_loop_stops_with_the_attempts(fake: Path) -> None:
    rc, calls = run(fake, ["kill n2 2", "kill n3 2", "ok"], {"spare_nodes": 1, "min_nodes": 1}, crash_loop_attempts=2)
    assert rc == 1 and len(calls) == 2
    summary = read_summary(fake / "run")
    assert summary is not None and summary.status == "failed"
    assert [(f["node"], f["action"]) for f in summary.node_failures or []] == [("n2", "continue"), ("n3", "fail")]
    assert summary.error is not None and summary.error.startswith("crash loop: 2 attempts in a row")
    assert "attempt 1 (job 7): n2" in summary.error and "attempt 2 (job 7): n3" in summary.error
    assert "requeue" not in slurm_log(fake)


def test_an_unreadable_spec_runs_the_step_once_unsupervised(tmp_path: Path) -> None:
    ran: list[list[str]] = []
    rc = supervisor.main([str(tmp_path), "--", "srun", "task"], environ={}, execv=lambda path, argv: ran.append(argv))
    assert ran == [["srun", "task"]] and rc == 1


def test_a_start_after_the_batch_node_died_records_it_and_keeps_it_out(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctrain.contract.rundir import supervisor_record_path, write_json_atomic

    record = {"job_id": "7", "restart": 0, "batch_node": "n2", "ended": False, "nodes": ["n2", "n3"]}
    write_json_atomic(supervisor_record_path(fake / "run"), record)
    monkeypatch.setenv("FAKE_SINFO", "n2 down*")
    rc, calls = run(fake, ["ok"], {"spare_nodes": 1}, restart=1)
    assert rc == 0 and "--nodelist=n1,n3" in calls[0]["argv"]
    summary = read_summary(fake / "run")
    assert summary is not None and summary.excluded_nodes == ["n2"]
    [failure] = summary.node_failures or []
    assert (failure["node"], failure["action"]) == ("n2", "requeue")
    assert failure["reason"] == "the batch step's node went down (Slurm marks it down*)"
    assert read_json_object(supervisor_record_path(fake / "run"))["ended"] is True  # type: ignore[index]


def test_a_start_after_a_clean_end_blames_nothing(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.contract.rundir import supervisor_record_path, write_json_atomic

    record = {"job_id": "7", "restart": 0, "batch_node": "n2", "ended": True}
    write_json_atomic(supervisor_record_path(fake / "run"), record)
    monkeypatch.setenv("FAKE_SINFO", "n2 down*")
    rc, calls = run(fake, ["ok"], {"spare_nodes": 1}, restart=1)
    assert rc == 0 and "--nodelist=n1,n2" in calls[0]["argv"]
    assert read_summary(fake / "run") is None


def test_the_guardian_requeues_without_a_batch_node_that_went_silent(fake: Path) -> None:
    from hpctrain.contract.rundir import supervisor_record_path, write_json_atomic
    from hpctrain.healing import guardian

    run(fake, ["ok"], {"spare_nodes": 1})  # writes the spec and a first, ended record
    environ = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURMD_NODENAME": "n3"}
    log = guardian.log_path(fake / "run", "7")
    log.parent.mkdir()  # submitit's folder: the batch step's log is there
    say = guardian.log_writer(log)
    sup = HealRecord(fake / "run", load_spec(fake / "run"), environ, say=say)
    record = {"job_id": "7", "restart": 0, "batch_node": "n1", "ended": False, "time": 0.0}
    write_json_atomic(supervisor_record_path(fake / "run"), record)
    probe = NodeProbe()
    probe.lost_reason = lambda node: "its slurmd does not answer" if node == "n1" else None  # type: ignore[method-assign]
    assert guardian.guard(sup, probe, "n1", say, poll_s=0.01) == 0
    assert log.read_text() == (
        "hpctrain guardian: node n1 lost before the first step (the batch step's node does not answer); "
        "requeueing without n1 (it ran the batch step)\n"
    )
    log = slurm_log(fake)
    assert "scontrol requeue 7" in log and "ExcNodeList=n1" in log
    summary = read_summary(fake / "run")
    assert summary is not None and summary.excluded_nodes == ["n1"]
    assert summary.node_failures[-1]["reason"] == "the batch step's node does not answer"  # type: ignore[index]
    assert read_json_object(supervisor_record_path(fake / "run"))["ended"] is True  # type: ignore[index]


def test_the_guardian_leaves_when_the_supervisor_ends_or_lives(fake: Path) -> None:
    import time

    from hpctrain.contract.rundir import supervisor_record_path, write_json_atomic
    from hpctrain.healing import guardian

    run(fake, ["ok"], {"spare_nodes": 1})
    environ = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]"}
    sup = HealRecord(fake / "run", load_spec(fake / "run"), environ)
    probe = NodeProbe()
    probe.lost_reason = lambda node: "gone"  # type: ignore[method-assign]
    ended = {"job_id": "7", "restart": 0, "batch_node": "n1", "ended": True, "time": 0.0}
    write_json_atomic(supervisor_record_path(fake / "run"), ended)
    assert guardian.guard(sup, probe, "n1", print, poll_s=0.01) == 0
    fresh = {**ended, "ended": False, "time": time.time()}
    write_json_atomic(supervisor_record_path(fake / "run"), fresh)
    probe.lost_reason = lambda node: None  # type: ignore[method-assign]
    other = {**fresh, "restart": 1}
    write_json_atomic(supervisor_record_path(fake / "run"), other)  # a later start's record: not ours
    assert guardian.guard(sup, probe, "n1", print, poll_s=0.01) == 0
    assert "requeue" not in slurm_log(fake)


def test_the_guardian_has_no_log_until_it_has_something_to_say(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.healing import guardian

    run(fake, ["ok"], {"spare_nodes": 1})  # the supervisor ended: the guardian leaves at once
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert guardian.main([str(fake / "run"), "n1"]) == 0
    assert not guardian.log_path(fake / "run", "7").exists()
    (fake / "broken" / "submitit").mkdir(parents=True)  # no spec: the guardian cannot start
    assert guardian.main([str(fake / "broken"), "n1"]) == 1
    text = guardian.log_path(fake / "broken", "7").read_text()
    assert text.startswith("hpctrain guardian: failed:\nTraceback") and "spec" in text


def test_the_guardian_step_leaves_srun_no_file_to_create(tmp_path: Path) -> None:
    from hpctrain.healing import guardian

    step = guardian.GuardianStep("true", tmp_path, "n1", {"PATH": os.environ.get("PATH", "")})
    step.start(["n1", "n2", "n3"], excluded=["n3"], step_nodes=["n1"])
    step.stop()
    assert step.process is not None
    argv = step.process.args
    assert "--nodelist=n2" in argv and "--output=/dev/null" in argv and "--error=/dev/null" in argv  # type: ignore[operator]


def test_a_sigterm_before_the_first_step_starts_none(
    fake: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Counted by stop_signals from the supervisor's first line, before its own handlers (issue 30).
    monkeypatch.setattr(stop_signals, "_recorder", stop_signals.Recorder({"TERM": 1}))
    rc, calls = run(fake, ["ok"], {"spare_nodes": 1})
    assert (rc, calls) == (0, [])
    assert "the job is ending (SIGTERM): no training step is started" in capsys.readouterr().err


def test_a_start_of_a_run_this_job_completed_starts_no_step(fake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (fake / "run").mkdir()
    write_summary(fake / "run", {"status": "completed", "job_id": "7", "global_step": 12})
    rc, calls = run(fake, ["ok"], {"spare_nodes": 1})
    assert (rc, calls) == (0, [])
    assert "this job completed the run already (step 12)" in capsys.readouterr().err
    assert "scontrol update JobId=7 Requeue=0" in slurm_log(fake)  # nothing may start it again

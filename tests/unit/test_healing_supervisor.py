"""The batch step's supervisor against fake ``srun`` and ``scontrol`` commands: what it starts after a
failed step, what it records, when it requeues and when it stops (healing/supervisor.py)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.rundir import read_json_object, spec_path, stacks_dir, submitit_dir
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.healing import supervisor
from hpctrain.healing.evidence import NodeProbe
from hpctrain.healing.record import HealRecord, load_spec
from hpctrain.jobspec.yaml_source import dump_yaml
from hpctrain.runtime import stop_signals
from tests.fake_slurm import FakeSlurm

# Each call of the fake srun takes its behaviour from the next line of plan.txt:
# "ok", "raise NODE TASK" (a task exits 1), "kill NODE TASK" (a task is killed) or "hang NODE TASK"
# (the hang watchdog names the task: it claims the report, writes it into summary.json, the ranks exit 87),
# "flag NODE" (the burn-in flagged NODE) or "slow NODE" (heartbeats say NODE's steps compute 4x slower).
FAKE_SRUN = """#!{python}
import json, os, sys
from pathlib import Path
here = Path(os.environ["FAKE_DIR"])
calls = sorted(here.glob("call-*.json"))
json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, open(here / f"call-{{len(calls)}}.json", "w"))
plan = (here / "plan.txt").read_text().split("\\n")[len(calls)].split()
if plan[0] == "ok":
    sys.exit(0)
nodes = next(a for a in sys.argv if a.startswith("--nodelist=")).split("=", 1)[1].split(",")
if plan[0] == "flag":  # the burn-in flagged a node: rank 0 records it for this step, every rank exits 75
    run = here / "run"
    why = "compute 400 ms per pass vs 100 on the other nodes (4.0x worse)"
    scores = [dict(node=n, compute_ms=400.0 if n == plan[1] else 100.0, flagged=n == plan[1],
                   reason=why if n == plan[1] else None) for n in nodes]
    record = dict(step_id=os.environ["HPCTRAIN_STEP_ID"], nodes=nodes, flagged=[plan[1]], scores=scores)
    (run / "summary.json").write_text(json.dumps(dict(burn_in=[record])))
    print("srun: error: n1: task 0: Exited with exit code 75", file=sys.stderr, flush=True)
    sys.exit(75)
if plan[0] == "slow":  # every rank's heartbeat: the node plan[1] computes 4x slower; then train until ended
    import time
    beats = here / "run" / "heartbeats"
    beats.mkdir(exist_ok=True)
    for index, node in enumerate(nodes * 2):
        median = 0.4 if node == plan[1] else 0.1
        beat = dict(rank=index, node=node, time=time.time() + 1, compute_time_median_s=median, compute_count=50,
                    compute_kind="step")
        (beats / f"rank-{{index:05d}}.json").write_text(json.dumps(beat))
    time.sleep(60)
    sys.exit(0)
if plan[0] == "hang-quiet":  # as "hang", as the real watchdog does it: every rank's heartbeat thread is in
    import time               # the watchdog (silent) for a while before the ranks exit
    run = here / "run"
    (run / "stacks").mkdir(exist_ok=True)
    (run / "heartbeats").mkdir(exist_ok=True)
    for index, node in enumerate(nodes * 2):
        beat = dict(rank=index, node=node, time=time.time(), step=5, phase="forward_backward")
        (run / "heartbeats" / f"rank-{{index:05d}}.json").write_text(json.dumps(beat))
    (run / "stacks" / ".hang-reported-7").write_text("1\\n")
    time.sleep(1.0)  # the watch loop polls every 50 ms: every node has been silent all this second
    report = dict(status="failed", hung_rank=int(plan[2]), hung_node=plan[1], hung_phase="forward_backward")
    report.update(hung_step=5, hung_frozen_s=21.4, hang_job_id="7")
    (run / "summary.json").write_text(json.dumps(report))
    for node in nodes:
        print(f"srun: error: {{node}}: task 0: Exited with exit code 87", file=sys.stderr, flush=True)
    sys.exit(87)
if plan[0] == "hang":
    run = here / "run"
    (run / "stacks").mkdir(exist_ok=True)
    (run / "stacks" / ".hang-reported-7").write_text("1\\n")
    report = dict(status="failed", hung_rank=int(plan[2]), hung_node=plan[1], hung_phase="forward_backward")
    report.update(hung_step=5, hung_frozen_s=21.4, hang_job_id="7")
    (run / "summary.json").write_text(json.dumps(report))
    print("srun: error: n1: task 0: Exited with exit code 87", file=sys.stderr, flush=True)
    sys.exit(87)
if plan[0] in ("torchrun-kill", "torchrun-raise"):  # launcher: torchrun: a worker (global rank plan[2]) on
    control = here / "run" / ".hpctrain"                 # plan[1] died; its node task reports it, then exits 1
    control.mkdir(exist_ok=True)
    reason = "Killed" if plan[0] == "torchrun-kill" else "Exited with exit code 1"
    with open(control / "torchrun-failures.log", "a") as log:
        log.write(f"torchrun: error: {{plan[1]}}: task {{plan[2]}}: {{reason}}\\n")
    print(f"srun: error: {{plan[1]}}: task {{nodes.index(plan[1])}}: Exited with exit code 1", file=sys.stderr)
    sys.exit(1)
reason = "Exited with exit code 1" if plan[0] == "raise" else "Killed"
print(f"srun: error: {{plan[1]}}: task {{plan[2]}}: {{reason}}", file=sys.stderr, flush=True)
sys.exit(1)
"""
_SLURMS: dict[Path, FakeSlurm] = {}  # tmp_path -> the Slurm its supervisor asks (in-process: nothing on PATH)


def slurm_answers() -> FakeSlurm:
    """The job runs (``scontrol show job``); ``sinfo`` says what ``FAKE_SINFO`` holds of the nodes' states, and
    its partition has ``FAKE_PARTITION``'s nodes (``n1|debug*|idle|(null)`` lines; by default n1..n6, idle)."""
    six = "".join(f"n{i}|debug*|idle|(null)|(null)|4|3900\n" for i in range(1, 7))

    def sinfo(argv: list[str]) -> tuple[int, str]:
        if "%N|%P|%T|%f|%G|%c|%m" in argv:
            return 0, os.environ.get("FAKE_PARTITION", six)
        return 0, os.environ.get("FAKE_SINFO", "") + "\n"

    return FakeSlurm(
        {"7": "RUNNING"}, answers={"scontrol --oneliner show job": (0, "JobId=7 JobState=RUNNING\n"), "sinfo": sinfo}
    )


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"  # srun starts the step's processes: a program, not a question to Slurm
    srun.write_text(FAKE_SRUN.format(python=sys.executable))
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    _SLURMS[tmp_path] = slurm_answers().install(monkeypatch)
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the bad-node ledger
    monkeypatch.setattr(supervisor, "POLL_S", 0.05)
    monkeypatch.setattr(supervisor, "START_GUARDIAN", False)  # its srun would take a line of the plan
    return tmp_path


def run(
    tmp: Path, plan: list[str], resources: dict[str, Any], restart: int = 0, launcher: str = "srun", **signals: Any
) -> tuple[int, list[dict[str, Any]]]:
    (tmp / "plan.txt").write_text("\n".join(plan) + "\n")
    run_dir = tmp / "run"
    run_dir.mkdir(exist_ok=True)
    spec = {
        "name": "heal",
        "entrypoint": "x.y:z",
        "launcher": launcher,
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
    """Every Slurm command the supervisor ran, one a line."""
    return "".join(" ".join(argv) + "\n" for argv in _SLURMS[tmp].commands)


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
        "swap",
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
    assert (failure["node"], failure["action"]) == ("n2", "swap")
    expected = "rank 2 hung in phase forward_backward at step 5 (its process froze: heartbeat silent 21 s)"
    assert failure["reason"] == expected


def test_nodes_silent_while_the_hang_watchdog_reports_are_not_probed_as_lost(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog runs in each rank's heartbeat thread: while it waits for the report every node goes silent.
    A probe then that failed on the batch node (CI #58: the run requeued without a reason to) must not be asked;
    the hung rank's node is the one blamed."""
    from hpctrain.healing import evidence

    probed: list[str] = []

    def lost_reason(self: NodeProbe, node: str) -> str:
        probed.append(node)
        return "its slurmd does not answer"

    monkeypatch.setattr(evidence, "SILENT_BEATS", 0.01)  # silent after 0.1 s of the 10 s heartbeat interval
    monkeypatch.setattr(NodeProbe, "lost_reason", lost_reason)
    rc, calls = run(fake, ["hang-quiet n2 2", "ok"], {"spare_nodes": 1})
    assert probed == []
    assert rc == 0 and len(calls) == 2 and "--nodelist=n1,n3" in calls[1]["argv"]
    summary = read_summary(fake / "run")
    assert summary is not None and summary.excluded_nodes == ["n2"]
    [failure] = summary.node_failures or []
    assert (failure["node"], failure["action"]) == ("n2", "swap")


def test_a_hang_report_of_an_earlier_start_blames_nothing(fake: Path) -> None:
    run_dir = fake / "run"
    stacks_dir(run_dir).mkdir(parents=True)
    (stacks_dir(run_dir) / ".hang-reported-7").write_text("1\n")  # the same job id: a requeued job
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
    assert "scontrol update JobId=7 Requeue=0" in slurm_log(fake)  # expedite: ended, not held (REQUEUE_HOLD)


def test_under_torchrun_a_killed_worker_moves_the_run_to_the_spare(fake: Path) -> None:
    """srun's report names the node task (``Exited with exit code 1``: no node to blame); the node task's own
    report, in srun's words, names the worker it saw killed. A line from before the step blames nothing."""
    control = fake / "run" / ".hpctrain"
    control.mkdir(parents=True)
    (control / "torchrun-failures.log").write_text("torchrun: error: n1: task 0: Killed\n")  # an earlier start's
    rc, calls = run(fake, ["torchrun-kill n2 3", "ok"], {"spare_nodes": 1}, launcher="torchrun")
    assert rc == 0 and len(calls) == 2
    assert calls[0]["argv"][:5] == ["--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2"]
    assert "--nodelist=n1,n3" in calls[1]["argv"] and calls[1]["env"]["MASTER_PORT"].isdigit()
    summary = read_summary(fake / "run")
    assert summary is not None and summary.excluded_nodes == ["n2"]
    [failure] = summary.node_failures or []
    assert (failure["node"], failure["reason"], failure["action"]) == ("n2", "rank 3 killed", "swap"), failure


def test_under_torchrun_a_worker_that_raised_ends_the_job_as_without_healing(fake: Path) -> None:
    rc, calls = run(fake, ["torchrun-raise n2 3", "ok"], {"spare_nodes": 1}, launcher="torchrun")
    assert rc == 1 and len(calls) == 1
    summary = read_summary(fake / "run")
    assert summary is None or not summary.node_failures


def test_the_launchers_report_is_read_from_the_steps_offset_in_whole_lines_and_only_from_a_regular_file(
    tmp_path: Path,
) -> None:
    from hpctrain.healing import evidence

    control = tmp_path / ".hpctrain"
    control.mkdir()
    log = control / "torchrun-failures.log"
    assert evidence.launcher_report_size(tmp_path) == 0 and evidence.launcher_report(tmp_path, 0) == ""
    log.write_text("torchrun: error: n1: task 0: Killed\n")
    since = evidence.launcher_report_size(tmp_path)
    with log.open("a") as handle:
        handle.write("torchrun: error: n2: task 3: Killed\ntorchrun: error: n2: ta")  # the last line half written
    assert evidence.launcher_report(tmp_path, since) == "torchrun: error: n2: task 3: Killed\n"
    assert evidence.launcher_report(tmp_path, 10**9) == evidence.launcher_report(tmp_path, 0)  # truncated: all
    log.write_text("torchrun: error: n2: task 3: Killed\x1b[2J\n")  # a control sequence is not passed on
    assert evidence.launcher_report(tmp_path, 0) == "torchrun: error: n2: task 3: Killed\\x1b[2J\n"
    log.unlink()
    os.mkfifo(log)  # another user's run directory: never blocks, never read
    assert evidence.launcher_report_size(tmp_path) == 0 and evidence.launcher_report(tmp_path, 0) == ""
    log.unlink()
    outside = tmp_path.parent / f"{tmp_path.name}-outside.log"
    outside.write_text("torchrun: error: n1: task 0: Killed\n")
    log.symlink_to(outside)  # a link out of the run directory is not followed
    assert evidence.launcher_report(tmp_path, 0) == ""


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
    assert [(f["node"], f["action"]) for f in summary.node_failures or []] == [("n2", "swap"), ("n3", "fail")]
    assert summary.error is not None and summary.error.startswith("crash loop: 2 attempts in a row")
    assert "attempt 1 (job 7): n2" in summary.error and "attempt 2 (job 7): n3" in summary.error
    assert "requeue" not in slurm_log(fake) and "scontrol update JobId=7 Requeue=0" in slurm_log(fake)


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
        "requeueing without n1 (n1 ran the batch step)\n"
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
    submitit_dir(fake / "broken").mkdir(parents=True)  # no spec: the guardian cannot start
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


def test_a_guardian_that_ended_while_the_step_trains_is_started_again_a_bounded_number_of_times(
    tmp_path: Path,
) -> None:
    """CI #52: the batch node died and no guardian requeued the job (it had ended, unseen). Its srun (here
    ``false``: ends at once, exit 1) is started again each time the supervisor looks, at most MAX_STARTS_AGAIN
    times per step, on the same node; a new step may start it again as often."""
    from hpctrain.healing import guardian

    step = guardian.GuardianStep("false", tmp_path, "n1", {"PATH": os.environ.get("PATH", ""), "SLURM_JOB_ID": "7"})
    assert step.keep_up() is None  # never started: nothing to keep up
    step.start(["n1", "n2"], excluded=[], step_nodes=["n1", "n2"])
    lines = []
    for _ in range(guardian.MAX_STARTS_AGAIN + 2):
        assert step.process is not None
        step.process.wait()
        lines.append(step.keep_up())
    again = [line for line in lines if line]
    assert len(again) == guardian.MAX_STARTS_AGAIN and lines[-1] is None
    assert "ended (exit 1)" in again[0] and f"started again (1 of {guardian.MAX_STARTS_AGAIN}" in again[0]
    assert "7_guardian_log.err" in again[0]
    assert "--nodelist=n2" in step.process.args  # type: ignore[operator]
    step.start(["n1", "n2"], excluded=[], step_nodes=["n1", "n2"])  # the next step: counted afresh
    step.process.wait()
    assert step.keep_up() is not None
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nexec sleep 60\n")
    srun.chmod(0o755)
    sleeping = guardian.GuardianStep(str(srun), tmp_path, "n1", {"PATH": os.environ.get("PATH", "")})
    sleeping.start(["n1", "n2"], excluded=[], step_nodes=["n1"])  # a guardian that runs is left alone
    assert sleeping.process is not None
    first = sleeping.process
    assert sleeping.keep_up() is None and sleeping.process is first
    first.kill()
    first.wait()


def guardian_thread(fake: Path, lost: set[str], **kwargs: float) -> tuple[Any, list[int], Path]:
    """The guardian of job 7's first start watching n1, in a thread: (thread, [exit status], its log).
    ``lost``: the nodes whose slurmd does not answer (the caller may add to it later)."""
    import threading

    from hpctrain.healing import guardian

    run(fake, ["ok"], {"spare_nodes": 1})  # writes the spec
    environ = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURMD_NODENAME": "n3"}
    log = guardian.log_path(fake / "run", "7")
    log.parent.mkdir(exist_ok=True)
    say = guardian.log_writer(log)
    sup = HealRecord(fake / "run", load_spec(fake / "run"), environ, say=say)
    probe = NodeProbe()
    probe.lost_reason = lambda node: "its slurmd does not answer" if node in lost else None  # type: ignore[method-assign]
    status: list[int] = []
    thread = threading.Thread(
        target=lambda: status.append(guardian.guard(sup, probe, "n1", say, poll_s=0.01, **kwargs)),
        daemon=True,
    )
    return thread, status, log


@pytest.fixture
def no_signal_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guardian sets SIGTERM handlers, which only the main thread may: here it runs in a thread."""
    import signal

    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)


@pytest.mark.usefixtures("no_signal_handlers")
def test_a_record_dated_in_the_future_does_not_hide_a_dead_batch_node(fake: Path) -> None:
    import time

    from hpctrain.contract.rundir import supervisor_record_path, write_json_atomic

    thread, status, log = guardian_thread(fake, {"n1"}, silent_s=0.3)
    future = {"job_id": "7", "restart": 0, "batch_node": "n1", "ended": False, "time": time.time() + 86400 * 365}
    write_json_atomic(supervisor_record_path(fake / "run"), future)  # a clock a year ahead, or a planted record
    thread.start()
    thread.join(timeout=20)
    assert status == [0], "the guardian never took the silent batch node out"
    text = log.read_text()
    assert re.search(r"the supervisor's record is dated 3153[56]\d{3} s ahead of this node's clock", text), text
    assert "node n1 lost" in text and "requeueing without n1" in text
    assert "scontrol requeue 7" in slurm_log(fake)


@pytest.mark.usefixtures("no_signal_handlers")
def test_a_live_supervisor_whose_clock_is_ahead_is_not_taken_out(fake: Path) -> None:
    import time

    from hpctrain.contract.rundir import supervisor_record_path, write_json_atomic

    thread, status, log = guardian_thread(fake, {"n1"}, silent_s=0.5)
    record = {"job_id": "7", "restart": 0, "batch_node": "n1", "ended": False}
    write_json_atomic(supervisor_record_path(fake / "run"), {**record, "time": time.time() + 3600})
    thread.start()
    deadline = time.monotonic() + 1.5  # three silences long: the record changes every 0.05 s meanwhile
    while time.monotonic() < deadline:
        write_json_atomic(supervisor_record_path(fake / "run"), {**record, "time": time.time() + 3600})
        time.sleep(0.05)
    assert thread.is_alive() and "requeue" not in slurm_log(fake)
    write_json_atomic(supervisor_record_path(fake / "run"), {**record, "ended": True, "time": time.time()})
    thread.join(timeout=10)
    assert status == [0] and "requeue" not in slurm_log(fake)


@pytest.mark.usefixtures("no_signal_handlers")
@pytest.mark.parametrize("kind", ["not json", "a directory", "a FIFO", "a list"])
def test_an_unreadable_record_is_said_and_the_batch_node_still_guarded(fake: Path, kind: str) -> None:
    import time

    from hpctrain.contract.rundir import supervisor_record_path

    lost: set[str] = set()
    thread, status, log = guardian_thread(fake, lost, silent_s=0.2)
    path = supervisor_record_path(fake / "run")
    path.unlink()
    if kind == "not json":
        path.write_text('{"job_id": "7", "resta')
    elif kind == "a directory":
        path.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(path)
    else:
        path.write_text("[1, 2]")
    thread.start()
    time.sleep(0.6)  # silent for longer than silent_s, while the batch node answers
    assert thread.is_alive(), "the guardian left on an unreadable record"
    text = log.read_text()
    assert text.count("the supervisor's record is unreadable") == 1, text  # said once, not once per poll
    lost.add("n1")  # now the batch node stops answering: taken out without a readable record
    thread.join(timeout=20)
    assert status == [0]
    assert "node n1 lost" in log.read_text() and "scontrol requeue 7" in slurm_log(fake)


# -- burn-in and slow-node eviction ---------------------------------------------------------------------------
def ledger_nodes(fake: Path) -> list[tuple[str, str]]:
    from hpctrain.contract.bad_nodes import read_ledger

    return [(e.node, e.kind) for e in read_ledger(fake / "state" / "hpctrain" / "bad-nodes.jsonl").entries]


def test_a_node_the_burn_in_flags_is_swapped_for_the_spare(fake: Path) -> None:
    rc, calls = run(fake, ["flag n2", "ok"], {"spare_nodes": 1})
    assert rc == 0 and len(calls) == 2 and "--nodelist=n1,n3" in calls[1]["argv"]
    assert calls[0]["env"]["HPCTRAIN_STEP_ID"] == "7.0.0" and calls[1]["env"]["HPCTRAIN_STEP_ID"] == "7.0.1"
    summary = read_summary(fake / "run")
    assert summary is not None and summary.excluded_nodes == ["n2"]
    [event] = summary.node_failures or []
    assert (event["node"], event["kind"], event["action"], event["nodes"]) == ("n2", "burn-in", "swap", ["n1", "n3"])
    assert event["reason"].startswith("compute 400 ms per pass vs 100")
    assert ledger_nodes(fake) == [("n2", "burn-in")]


def test_a_flagged_node_that_cannot_be_replaced_is_kept_and_the_next_step_skips_the_burn_in(fake: Path) -> None:
    # all three nodes of the allocation train: no spare left in it, and min_nodes is nodes
    rc, calls = run(fake, ["flag n2", "ok"], {"nodes": 3, "spare_nodes": 1}, max_requeues=0)
    assert rc == 0 and len(calls) == 2 and "--nodelist=n1,n2,n3" in calls[1]["argv"]
    assert calls[1]["env"].get("HPCTRAIN_BURN_IN") == "off" and "HPCTRAIN_BURN_IN" not in calls[0]["env"]
    summary = read_summary(fake / "run")
    assert summary is not None and [e["action"] for e in summary.node_failures or []] == ["keep"]


def test_a_flagged_node_without_a_spare_requeues_the_job_without_it(fake: Path) -> None:
    rc, calls = run(fake, ["flag n2"], {"nodes": 3, "spare_nodes": 1})
    assert rc == 0 and len(calls) == 1
    assert "requeue 7" in slurm_log(fake) and "ExcNodeList=n2" in slurm_log(fake)


def partition(*nodes: str) -> str:
    """``FAKE_PARTITION``: these nodes usable in partition debug, l9 drained."""
    usable = "".join(f"{node}|debug*|allocated|(null)|(null)|4|3900\n" for node in nodes)
    return usable + "l9|debug*|drained|(null)|(null)|4|3900\n"


def test_a_flagged_node_the_partition_cannot_spare_is_kept_not_requeued_away_from(
    fake: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the job asks for 4 nodes (3 + a spare) and its partition has 4 usable ones: without n2, 3 are left
    monkeypatch.setenv("FAKE_PARTITION", partition("n1", "n2", "n3", "n4"))
    rc, calls = run(fake, ["flag n2", "ok"], {"nodes": 3, "spare_nodes": 1})
    assert rc == 0 and len(calls) == 2 and "--nodelist=n1,n2,n3" in calls[1]["argv"]
    assert calls[1]["env"].get("HPCTRAIN_BURN_IN") == "off"  # kept: the next step trains without a burn-in
    assert "requeue" not in slurm_log(fake) and "ExcNodeList" not in slurm_log(fake)
    why = "excluding n2 would leave 3 usable nodes in partition debug, the job needs 4: kept"
    assert f"training on it anyway: {why}" in capsys.readouterr().err
    summary = read_summary(fake / "run")
    assert summary is not None and not summary.excluded_nodes
    assert [(e["action"], e["why"]) for e in summary.node_failures or []] == [("keep", why)]


def test_nodes_too_small_for_one_of_the_jobs_nodes_are_not_counted_as_room(
    fake: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """n5 and n6 are usable but have one CPU and no GPU: the job's 2 tasks x 1 CPU (and, the second time,
    its 4 GPUs a node) never start there, so they are no room to requeue into."""
    small = "n5|debug*|idle|(null)|(null)|1|3900\nn6|debug*|idle|(null)|(null)|1|3900\n"
    monkeypatch.setenv("FAKE_PARTITION", partition("n1", "n2", "n3", "n4") + small)
    rc, calls = run(fake, ["flag n2", "ok"], {"nodes": 3, "spare_nodes": 1})
    assert rc == 0 and len(calls) == 2 and "requeue" not in slurm_log(fake)
    kept = "excluding n2 would leave 3 usable nodes in partition debug, the job needs 4: kept"
    assert kept in capsys.readouterr().err


def test_nodes_without_the_jobs_gpus_are_not_counted_as_room(
    fake: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = "".join(f"n{i}|debug*|idle|(null)|gpu:v100:{4 if i < 5 else 2}(S:0-1)|160|191000\n" for i in range(1, 7))
    monkeypatch.setenv("FAKE_PARTITION", gpus)  # n5 and n6 have 2 GPUs: a node of 4 GPUs fits n1..n4 only
    rc, calls = run(fake, ["flag n2", "ok"], {"nodes": 3, "spare_nodes": 1, "gpus_per_node": 4, "tasks_per_node": 4})
    assert rc == 0 and len(calls) == 2 and "requeue" not in slurm_log(fake)
    kept = "excluding n2 would leave 3 usable nodes in partition debug, the job needs 4: kept"
    assert kept in capsys.readouterr().err


def test_a_lost_batch_node_the_partition_cannot_spare_fails_the_run_instead_of_pending_forever(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PARTITION", partition("n2", "n3"))  # n1 is down: sinfo lists it not usable
    rc, calls = run(fake, ["kill n1 0", "ok"], {"spare_nodes": 1})
    assert rc == 1 and len(calls) == 1
    assert "requeue 7" not in slurm_log(fake) and "scontrol update JobId=7 Requeue=0" in slurm_log(fake)
    summary = read_summary(fake / "run")
    assert summary is not None and summary.status == "failed"
    expected = "excluding n1 would leave 2 usable nodes in partition debug, the job needs 3"
    assert summary.error == f"{expected}: a requeue could never start (it would pend forever)"


def test_a_lost_batch_node_slurm_still_runs_jobs_on_is_requeued_without_being_kept_out(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PARTITION", partition("n1", "n2", "n3"))
    rc, calls = run(fake, ["kill n1 0", "ok"], {"spare_nodes": 1})
    assert rc == 0 and len(calls) == 1
    assert "scontrol requeue 7" in slurm_log(fake) and "ExcNodeList" not in slurm_log(fake)
    summary = read_summary(fake / "run")
    assert summary is not None and not summary.excluded_nodes
    [event] = summary.node_failures or []
    assert event["action"] == "requeue" and event["why"].endswith("is not kept out")


def test_when_sinfo_cannot_count_the_partition_the_run_requeues_as_before(
    fake: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_PARTITION", "garbage\n")
    rc, calls = run(fake, ["flag n2"], {"nodes": 3, "spare_nodes": 1})
    assert rc == 0 and len(calls) == 1
    assert "requeue 7" in slurm_log(fake) and "ExcNodeList=n2" in slurm_log(fake)
    assert "sinfo listed no usable node of the cluster: requeued without checking" in capsys.readouterr().err


def test_a_node_that_stays_slow_is_evicted_and_the_run_goes_on_with_the_spare(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctrain.healing import eviction

    monkeypatch.setattr(supervisor, "EVICTION_POLL_S", 0.05)
    monkeypatch.setattr(supervisor, "STOP_WAIT_S", 0.5)
    real = eviction.SlowWatch
    monkeypatch.setattr(eviction, "SlowWatch", lambda margin, window_s, min_steps: real(margin, 0.2, min_steps))
    rc, calls = run(fake, ["slow n2", "ok"], {"spare_nodes": 1})
    assert rc == 0 and len(calls) == 2 and "--nodelist=n1,n3" in calls[1]["argv"]
    summary = read_summary(fake / "run")
    assert summary is not None
    [event] = summary.node_failures or []
    assert (event["node"], event["kind"], event["action"]) == ("n2", "slow", "swap")
    [evicted] = summary.evictions or []
    assert (evicted["node"], evicted["ratio"], evicted["node_ms"], evicted["others_ms"]) == ("n2", 4.0, 400.0, 100.0)
    assert evicted["compute_kind"] == "step" and event["reason"].startswith("step compute 400 ms vs 100 ms")
    assert ledger_nodes(fake) == [("n2", "slow")]


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


class _SlowStderr:
    """sys.stderr whose writes take a while, as on a loaded node: srun exits before its last line is read."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.buffer = self

    def write(self, data: Any) -> int:
        import time

        time.sleep(0.5)
        return len(data)

    def flush(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_the_killed_task_named_after_srun_exited_is_still_blamed(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's failure: srun printed "n2: task 3: Killed" and exited; the reader thread had not yet taken the line
    when the step was judged, so no node was blamed and the job ended instead of going on without n2."""
    monkeypatch.setattr(sys, "stderr", _SlowStderr(sys.stderr))
    rc, calls = run(fake, ["kill n2 3", "ok"], {"min_nodes": 1, "nodes": 3})
    assert rc == 0 and len(calls) == 2 and "--nodelist=n1,n3" in calls[1]["argv"]

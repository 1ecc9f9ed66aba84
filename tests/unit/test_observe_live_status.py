"""``status --watch`` and the status snapshot: the pure snapshot, its plain and rich renderings, and the
watch loop on fake run directories with a scripted Slurm (its answers go through the runner boundary),
an injected clock and no real sleeping."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import hpctrain, isolated_env
from rich.console import Console

from hpctrain.contract.heartbeat_files import Heartbeat
from hpctrain.contract.rundir import (
    atomic_write_text,
    checkpoints_dir,
    heartbeat_path,
    heartbeats_dir,
    metrics_path,
    read_run_info,
    summary_path,
    write_run_info,
)
from hpctrain.contract.slurm import Slurm
from hpctrain.contract.summary import Summary
from hpctrain.observe.live_status import MetricsTail, RunInputs, build_snapshot, read_run
from hpctrain.observe.live_view import final_lines, plain_changes, rich_view
from hpctrain.observe.watch import JobPoller, watch
from tests.fake_slurm import on_path

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


def make_run(tmp_path: Path, *, job_id: str = "4242", backend: str = "slurm") -> Path:
    run_dir = tmp_path / "runs" / "demo" / "20261123-020000"
    run_dir.mkdir(parents=True)
    write_run_info(run_dir, {"name": "demo", "job_id": job_id, "job_ids": [job_id], "backend": backend})
    return run_dir


def write_summary(run_dir: Path, **fields: Any) -> None:
    atomic_write_text(summary_path(run_dir), json.dumps({"epochs": 2, "steps_per_epoch": 4, **fields}))


def step_record(global_step: int, time: float, *, steps_per_epoch: int = 4, **values: Any) -> dict[str, Any]:
    epoch, step = divmod(global_step - 1, steps_per_epoch)
    return {
        "kind": "train_step",
        "epoch": epoch,
        "step": step + 1,
        "global_step": global_step,
        "images_per_s": 100.0,
        "data_wait_fraction": 0.25,
        "time": time,
        **values,
    }


def append_metrics(run_dir: Path, *records: dict[str, Any], torn: str = "") -> None:
    with metrics_path(run_dir).open("a") as handle:
        handle.write("".join(json.dumps(record) + "\n" for record in records) + torn)


def write_beat(run_dir: Path, rank: int, **fields: Any) -> None:
    beat = {"rank": rank, "node": f"n{rank // 2 + 1}", "step": 5, "phase": "forward_backward", "time": NOW - 1}
    path = heartbeat_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**beat, **fields}))


def write_checkpoint(run_dir: Path, step: int) -> None:
    folder = checkpoints_dir(run_dir) / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(b"abc")
    meta = {"format_version": 1, "global_step": step, "files": {"state.pt": {"size": 3}}}
    (folder / "meta.json").write_text(json.dumps(meta))


def snapshot(run_dir: Path, state: str = "RUNNING", now: float = NOW, *, final: bool = False) -> Any:
    inputs = read_run(run_dir, read_run_info(run_dir), MetricsTail(metrics_path(run_dir)))
    return build_snapshot(inputs, state, now, final=final)


# ---------------------------------------------------------------- the snapshot


def test_snapshot_has_progress_rate_eta_checkpoint_and_ranks(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=4, restarts=1, epochs_completed=1)
    append_metrics(run_dir, *(step_record(step, NOW - 60 + 10 * step) for step in range(1, 6)))
    write_checkpoint(run_dir, 4)
    for rank in range(4):
        write_beat(run_dir, rank, step_time_median_s=0.5 if rank == 3 else 0.2)
    snap = snapshot(run_dir)
    assert (snap.epoch, snap.epochs, snap.step_in_epoch, snap.steps_per_epoch) == (2, 2, 1, 4)
    assert (snap.global_step, snap.total_steps, snap.restarts) == (5, 8, 1)
    assert snap.steps_per_s == pytest.approx(0.1)  # 4 steps in 40 s of wall clock
    assert snap.eta_s == pytest.approx(30.0)  # 3 steps left
    assert snap.images_per_s == 100.0 and snap.data_wait_fraction == 0.25
    assert snap.checkpoint_step == 4 and snap.checkpoint_age_s is not None
    assert [view.rank for view in snap.ranks] == [0, 1, 2, 3]
    assert snap.stragglers == (3,) and snap.stale_ranks == ()


def test_stale_heartbeats_are_flagged_only_while_the_job_runs(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=5)
    write_beat(run_dir, 0, time=NOW - 5)
    write_beat(run_dir, 1, time=NOW - 600, node="n9", phase="allreduce")
    write_beat(run_dir, 2, time=NOW - 600, phase="done")
    assert snapshot(run_dir).stale_ranks == (1,)
    assert snapshot(run_dir, "COMPLETED", final=True).stale_ranks == ()
    assert snapshot(run_dir, "PENDING").stale_ranks == ()
    lines = plain_changes(None, snapshot(run_dir))
    assert any("stale heartbeat: rank 1 on n9 last wrote 10m00s ago (step 5, allreduce)" in line for line in lines)


def test_a_hang_in_the_summary_is_an_alert(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=5, hung_rank=3, hung_node="n2", hung_phase="allreduce")
    snap = snapshot(run_dir)
    assert (snap.hung_rank, snap.hung_node, snap.hung_phase) == (3, "n2", "allreduce")
    assert any(line.endswith("HANG: rank 3 on n2 stopped in allreduce") for line in plain_changes(None, snap))


def test_missing_files_give_an_empty_snapshot_not_an_error(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    snap = snapshot(run_dir, "PENDING")
    assert snap.global_step is None and snap.eta_s is None and snap.ranks == () and snap.checkpoint_step is None
    assert "global step ?" in plain_changes(None, snap)[0]
    heartbeats_dir(run_dir).mkdir()
    (heartbeats_dir(run_dir) / "rank-00000.json").write_text('{"rank": 0, "step": ')  # half-written
    summary_path(run_dir).write_text('{"status": "runn')
    assert snapshot(run_dir).ranks == ()


def test_metrics_tail_reads_incrementally_and_waits_for_a_torn_line(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    tail = MetricsTail(metrics_path(run_dir))
    tail.read()  # no file yet
    first = json.dumps(step_record(1, NOW))
    append_metrics(run_dir, torn=first[:20])
    tail.read()
    assert list(tail.steps) == []
    with metrics_path(run_dir).open("a") as handle:
        handle.write(first[20:] + "\nnot json\n")
    tail.read()
    assert [record["global_step"] for record in tail.steps] == [1]
    offset = tail.offset
    tail.read()
    assert tail.offset == offset and len(tail.steps) == 1
    append_metrics(run_dir, step_record(2, NOW + 1), {"kind": "epoch", "epoch": 0, "step": 4, "global_step": 4})
    tail.read()
    assert [record["global_step"] for record in tail.steps] == [1, 2] and tail.last_epoch["step"] == 4
    append_metrics(run_dir, step_record(1, NOW + 2))  # a resume replays from its checkpoint
    tail.read()
    assert [record["global_step"] for record in tail.steps] == [1]


def test_the_first_read_of_a_long_metrics_file_reads_only_its_end(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    append_metrics(run_dir, *(step_record(step, NOW + step) for step in range(1, 201)))
    tail = MetricsTail(metrics_path(run_dir), window=5, first_read_bytes=1000)
    tail.read()
    assert [record["global_step"] for record in tail.steps] == [196, 197, 198, 199, 200]
    assert tail.offset == metrics_path(run_dir).stat().st_size
    append_metrics(run_dir, step_record(201, NOW + 201))
    tail.read()
    assert tail.steps[-1]["global_step"] == 201


def test_steps_per_epoch_comes_from_the_epoch_record_when_the_summary_lacks_it(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    atomic_write_text(summary_path(run_dir), json.dumps({"status": "running", "epochs": 3}))
    append_metrics(run_dir, {"kind": "epoch", "epoch": 0, "step": 6, "global_step": 6, "time": NOW})
    snap = snapshot(run_dir)
    assert (snap.steps_per_epoch, snap.total_steps, snap.epoch, snap.step_in_epoch) == (6, 18, 1, 6)


def test_a_user_loop_that_counts_steps_gives_its_total(tmp_path: Path) -> None:
    """hpctrain.task's loops log global steps only and may stop before an epoch ends: total_steps wins."""
    run_dir = make_run(tmp_path)
    summary = {"status": "running", "epochs": 3, "steps_per_epoch": 8, "total_steps": 18}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary))
    append_metrics(run_dir, {"kind": "train_step", "global_step": 9, "epoch": 1, "loss": 1.0, "time": NOW})
    snap = snapshot(run_dir)
    assert (snap.total_steps, snap.global_step, snap.epoch, snap.step_in_epoch) == (18, 9, 2, 1)


# ---------------------------------------------------------------- plain lines


def test_plain_output_prints_a_line_per_change_not_per_poll(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=3)
    append_metrics(run_dir, step_record(2, NOW - 10), step_record(3, NOW))
    first = snapshot(run_dir)
    lines = plain_changes(None, first)
    assert len(lines) == 1
    assert lines[0].endswith(
        "job 4242 RUNNING, run running | epoch 1/2 step 3/4 | global step 3/8 (38%) | 100.0 img/s "
        "| data-wait 25% | eta 50 s | checkpoint none yet"
    )
    assert plain_changes(first, snapshot(run_dir, now=NOW + 5)) == []  # only ages moved
    append_metrics(run_dir, step_record(4, NOW + 10))
    later = snapshot(run_dir, now=NOW + 10)
    assert len(plain_changes(first, later)) == 1 and "global step 4/8" in plain_changes(first, later)[0]


def test_the_watch_shows_where_the_last_windows_steps_went(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=4)
    split = {"kind": "step_split", "global_step": 4, "epoch": 0, "time": NOW, "slowest_rank": 3}
    split |= {"forward_s": 0.1, "backward_s": 0.2, "comm_s": 0.06, "straggler_s": 0.04}
    append_metrics(run_dir, step_record(2, NOW - 10), step_record(4, NOW), split)
    snap = snapshot(run_dir)
    assert snap.step_split == "bwd 50% fwd 25% comm 15% straggler(rank 3) 10%"
    assert (
        "| eta 20 s | step: bwd 50% fwd 25% comm 15% straggler(rank 3) 10% | checkpoint" in plain_changes(None, snap)[0]
    )
    console = Console(file=io.StringIO(), width=120)
    console.print(rich_view(snap))
    assert "step time" in console.file.getvalue()
    assert snapshot(run_dir, final=True).step_split is None  # an ended run: the report explains it


def test_rank_lines_come_when_ranks_first_report_and_with_show_ranks(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=5)
    before = snapshot(run_dir)
    write_beat(run_dir, 0, step_time_median_s=0.2)
    write_beat(run_dir, 1, step_time_median_s=0.2)
    first = snapshot(run_dir)
    lines = plain_changes(before, first)
    assert [line.split(" ", 2)[2] for line in lines] == [
        "rank 0 n1 step 5 forward_backward step time 0.200 s, heartbeat 1 s ago",
        "rank 1 n1 step 5 forward_backward step time 0.200 s, heartbeat 1 s ago",
    ]
    assert plain_changes(first, snapshot(run_dir)) == []
    write_beat(run_dir, 1, step=6, phase="allreduce")
    moved = snapshot(run_dir)
    assert plain_changes(first, moved) == []
    assert [line.split(" ", 2)[2] for line in plain_changes(first, moved, show_ranks=True)] == [
        "rank 1 n1 step 6 allreduce step time ?, heartbeat 1 s ago"
    ]


def test_final_lines_end_with_how_the_job_ended(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="completed", global_step=8, stop_reason="epochs done")
    write_beat(run_dir, 0, phase="done", gpu_util_pct=87.4)
    lines = final_lines(snapshot(run_dir, "COMPLETED", final=True))
    assert "rank 0 n1 step 5 done step time ?, gpu 87%, heartbeat" in lines[0]
    assert lines[-1].endswith("job 4242 ended COMPLETED; run status: completed (epochs done)")
    assert "eta" not in lines[-2]


# ---------------------------------------------------------------- rich


def test_rich_view_renders_on_a_terminal(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=5, hung_rank=1, hung_node="n1", hung_phase="allreduce")
    append_metrics(run_dir, step_record(4, NOW - 10), step_record(5, NOW))
    write_beat(run_dir, 0, step_time_median_s=0.2)
    write_beat(run_dir, 1, step_time_median_s=0.9)
    write_beat(run_dir, 2, step_time_median_s=0.2, gpu_util_pct=55.0)
    console = Console(file=io.StringIO(), force_terminal=True, width=120, color_system="truecolor")
    console.print(rich_view(snapshot(run_dir), interval_s=5))
    text = console.file.getvalue()
    assert "\x1b[" in text  # styled, as on a terminal
    plain = Console(file=io.StringIO(), width=120)
    plain.print(rich_view(snapshot(run_dir), interval_s=5))
    shown = plain.file.getvalue()
    for needle in ("job 4242 RUNNING", "5/8", "100.0 img/s", "25%", "HANG: rank 1 on n1", "straggler: rank 1"):
        assert needle in shown, shown
    assert "STRAGGLER" in shown and "ranks' last heartbeats" in shown and "55%" in shown


# ---------------------------------------------------------------- the watch loop


class ScriptedSlurm:
    """A Slurm runner answering ``sacct`` from a list of states, one per call; records every command."""

    def __init__(self, job_id: str, states: list[str]) -> None:
        self.job_id, self.states, self.commands = job_id, list(states), []

    def __call__(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return subprocess.CompletedProcess(command, 0, stdout=f"{self.job_id}|{state}\n", stderr="")


class Clock:
    def __init__(self) -> None:
        self.now, self.sleeps = NOW, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_watch_ends_when_the_job_completes(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=1)
    append_metrics(run_dir, step_record(1, NOW))
    slurm = ScriptedSlurm("4242", ["PENDING", "RUNNING", "RUNNING", "COMPLETED"])
    clock, out = Clock(), io.StringIO()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 2:  # training moves on between two looks, then finishes
            append_metrics(run_dir, step_record(8, clock.now))
            write_summary(run_dir, status="completed", global_step=8, epochs_completed=2)

    code = watch(
        run_dir,
        interval_s=0.5,
        out=out,
        tty=False,
        poller=JobPoller(Slurm(slurm, which=on_path)),
        clock=clock,
        sleep=sleep,
    )
    lines = out.getvalue().splitlines()
    assert code == 0
    assert clock.sleeps == [2.0, 2.0, 2.0]  # the interval is at least 2 s
    assert len(slurm.commands) == 4 and all(command[0] == "sacct" for command in slurm.commands)
    assert lines[-1].endswith("job 4242 ended COMPLETED; run status: completed")
    assert sum("global step" in line for line in lines) == 4  # PENDING, RUNNING, step 8, final


@pytest.mark.parametrize(
    ("state", "summary", "code", "status"),
    [("FAILED", "running", 1, "failed"), ("CANCELLED", "stopped", 10, "stopped"), ("TIMEOUT", "failed", 1, "failed")],
)
def test_watch_exit_code_says_how_the_job_ended(
    tmp_path: Path, state: str, summary: str, code: int, status: str
) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status=summary, global_step=3)
    clock, out = Clock(), io.StringIO()
    poller = JobPoller(Slurm(ScriptedSlurm("4242", [state]), which=on_path))
    assert watch(run_dir, out=out, tty=False, poller=poller, clock=clock, sleep=clock.sleep, settle_s=10) == code
    assert out.getvalue().splitlines()[-1].endswith(f"ended {state}; run status: {status}")
    assert clock.now - NOW <= 10  # a summary that stays "running" is waited for at most settle_s


def test_watch_falls_back_to_squeue_when_accounting_is_off(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=3)
    commands = []
    squeue = iter([(0, "RUNNING\n", ""), (1, "", "slurm_load_jobs error: Invalid job id specified")])

    def runner(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        commands.append(command[0])
        if command[0] == "sacct":
            return subprocess.CompletedProcess(command, 1, stdout="", stderr="Slurm accounting storage is disabled")
        return subprocess.CompletedProcess(command, *next(squeue))

    clock, out = Clock(), io.StringIO()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 2:
            write_summary(run_dir, status="completed", global_step=8)

    code = watch(run_dir, out=out, tty=False, poller=JobPoller(Slurm(runner, which=on_path)), clock=clock, sleep=sleep)
    assert commands == ["sacct", "squeue", "squeue"]  # one command per look
    assert code == 0 and out.getvalue().splitlines()[-1].endswith("ended unknown (unknown-job); run status: completed")


def test_a_resumed_run_is_not_over_because_the_last_attempt_stopped() -> None:
    from hpctrain.observe.watch import job_ended

    stopped = Summary(status="stopped", job_id="41")
    assert not job_ended("UNKNOWN", stopped, "42")  # sacct does not list the new job yet
    assert not job_ended("PENDING", stopped, "42") and not job_ended("REQUEUED", stopped, "41")
    assert job_ended("UNKNOWN", Summary(status="completed", job_id="42"), "42")
    assert job_ended("unknown (no Slurm here)", Summary(status="completed"), "42")
    assert job_ended("CANCELLED", Summary(status="running", job_id="42"), "42")
    assert not job_ended("local", Summary(status="running"))


def test_watch_on_a_tty_uses_the_live_view_and_still_ends_with_the_final_line(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="completed", global_step=8)
    clock, out = Clock(), io.StringIO()
    poller = JobPoller(Slurm(ScriptedSlurm("4242", ["COMPLETED"]), which=on_path))
    assert watch(run_dir, out=out, tty=True, poller=poller, clock=clock, sleep=clock.sleep) == 0
    text = out.getvalue()
    assert "global step" in text and text.rstrip().endswith("job 4242 ended COMPLETED; run status: completed")


def test_watch_of_a_local_run_ends_with_its_summary(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, backend="local")
    write_summary(run_dir, status="stopped", global_step=3, stop_reason="preempted")
    clock, out = Clock(), io.StringIO()
    assert watch(run_dir, out=out, tty=False, clock=clock, sleep=clock.sleep) == 10
    assert out.getvalue().splitlines()[-1].endswith(" local run ended; run status: stopped (preempted)")


def test_ctrl_c_leaves_quietly_with_130(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_summary(run_dir, status="running", global_step=3)

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    out = io.StringIO()
    poller = JobPoller(Slurm(ScriptedSlurm("4242", ["RUNNING"]), which=on_path))
    assert watch(run_dir, out=out, tty=False, poller=poller, clock=lambda: NOW, sleep=interrupt) == 130
    assert "Traceback" not in out.getvalue() and len(out.getvalue().splitlines()) == 1


# ---------------------------------------------------------------- the command


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return hpctrain(*args, env=isolated_env(home, state=home))


def test_status_shows_stragglers_hang_and_the_rank_table(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, backend="local")
    write_summary(run_dir, status="running", global_step=5, hung_rank=2, hung_node="n2", hung_phase="allreduce")
    for rank in range(3):
        write_beat(run_dir, rank, step_time_median_s=0.9 if rank == 2 else 0.2)
    result = cli("status", str(run_dir), home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        "stragglers: [2]" in result.stdout
        and "hung_rank: 2" in result.stdout
        and "hung_phase: allreduce" in result.stdout
    )
    assert "ranks' last heartbeats" in result.stdout and "STRAGGLER" in result.stdout
    for rank in range(3, 10):
        write_beat(run_dir, rank, step_time_median_s=0.2)
    many = cli("status", str(run_dir), home=tmp_path).stdout
    assert "ranks: 10 wrote heartbeats (--ranks shows each)" in many and "ranks' last heartbeats" not in many
    as_json = json.loads(cli("status", str(run_dir), "--json", "--ranks", home=tmp_path).stdout)
    assert as_json["stragglers"] == [2] and [row["rank"] for row in as_json["ranks"]] == list(range(10))


def test_status_watch_of_a_finished_local_run_prints_the_final_state(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, backend="local")
    write_summary(run_dir, status="completed", global_step=8)
    result = cli("status", str(run_dir), "--watch", "--interval", "2", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].endswith(" local run ended; run status: completed")
    no_run = cli("status", "--watch", home=tmp_path)
    assert no_run.returncode == 2 and "--watch follows one run" in no_run.stderr and "Traceback" not in no_run.stderr


def test_a_heartbeat_from_long_ago_is_stale_while_the_job_runs() -> None:
    inputs = RunInputs(
        info={}, summary=Summary(), tail=MetricsTail(Path("/nonexistent")), heartbeats=[Heartbeat(rank=0)]
    )
    snap = build_snapshot(inputs, "RUNNING", NOW, final=False)
    assert snap.ranks[0].rank == 0 and snap.ranks[0].stale  # written at time 0: very old


def test_a_script_that_reports_no_steps_says_so_instead_of_question_marks(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    atomic_write_text(summary_path(run_dir), json.dumps({"status": "running", "script": "/x/train.py"}))
    write_beat(run_dir, 0)
    line = plain_changes(None, snapshot(run_dir))[0]
    assert "epoch ?" not in line and "global step ?" not in line
    assert "steps not reported (the script's hpctrain.task.step/log would report them)" in line
    panel = io.StringIO()
    Console(file=panel, width=160).print(rich_view(snapshot(run_dir)))
    assert "flags" in panel.getvalue()  # the rank table's last column is named
    assert "epoch" not in panel.getvalue().split("global step")[0]
    write_summary(run_dir, status="running", script="/x/train.py", global_step=3, total_steps=10)
    assert "global step 3/10 (30%)" in plain_changes(None, snapshot(run_dir))[0]

"""The launcher's torch-free parts: login-node imports, entry-point loading, failure lines."""

from __future__ import annotations

import io
import json
import pickle
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.errors import DistributedSetupError, HpctrainError
from hpctrain.jobspec.models import JobSpec
from hpctrain.programs.launcher import (
    TaskLauncher,
    check_world_size,
    end_if_completed,
    listen_for_stop,
    load_user_code,
    report_failure,
    stop_before_start,
    stopped_before_start,
    thread_env,
)
from hpctrain.runtime import stop_signals
from hpctrain.runtime.hang import HangWatchdog
from hpctrain.runtime.stop import StopRequest
from hpctrain.runtime.task_env import derive_task_env


def test_login_node_imports_do_not_pull_in_torch() -> None:
    code = (
        "import sys\n"
        "import hpctrain.programs.launcher, hpctrain.runtime.rank_plan, hpctrain.runtime.task_env\n"
        "import hpctrain.runtime.master, hpctrain.runtime.heartbeat, hpctrain.runtime.hang\n"
        "import hpctrain.runtime.gpu_monitor\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_launcher_pickles_by_reference() -> None:
    launcher = TaskLauncher({"name": "t"}, "/tmp/run")
    copy = pickle.loads(pickle.dumps(launcher))
    assert (copy.spec_data, copy.run_dir) == ({"name": "t"}, "/tmp/run")


def test_load_user_code() -> None:
    assert load_user_code("json:dumps")({"a": 1}) == '{"a": 1}'


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [
        ("no_such_package_xyz.module:main", "'no_such_package_xyz.module' is not importable"),
        ("json:no_such_function", "'json' has no function 'no_such_function'"),
        ("json:JSONDecodeError.__name__", "has no function"),
    ],
)
def test_load_user_code_errors_are_clear(entrypoint: str, expected: str) -> None:
    with pytest.raises(HpctrainError, match=expected) as raised:
        load_user_code(entrypoint)
    assert raised.value.hint


def test_load_user_code_reports_a_broken_module_differently(tmp_path, monkeypatch) -> None:
    (tmp_path / "broken_entry_mod.py").write_text("import not_installed_dependency_xyz\ndef main(ctx): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HpctrainError, match="failed to import .*not_installed_dependency_xyz"):
        load_user_code("broken_entry_mod:main")


def test_world_size_mismatch_is_caught_for_submitted_jobs() -> None:
    spec = JobSpec.model_validate({"name": "t", "resources": {"nodes": 1, "tasks_per_node": 4}})
    slurm = {
        "SLURM_JOB_ID": "1",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "n1",
    }
    with pytest.raises(DistributedSetupError, match="asks for 4 tasks .* but 2 were started"):
        check_world_size(spec, derive_task_env(slurm))
    check_world_size(spec, derive_task_env({}))  # a single process started by hand is fine


def test_failure_line_for_user_mistakes_has_no_traceback() -> None:
    stream = io.StringIO()
    report_failure(3, DistributedSetupError("port 1 on n1 is taken", hint="set it"), stream)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("hpctrain: rank 3 on node ")
    assert lines[0].endswith("failed: DistributedSetupError: port 1 on n1 is taken")
    assert lines[1] == "HINT: set it"
    assert "Traceback" not in stream.getvalue()


def test_failure_line_for_bugs_has_the_traceback() -> None:
    stream = io.StringIO()
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError as exc:
        report_failure(0, exc, stream)
    assert "failed: ZeroDivisionError: division by zero" in stream.getvalue()
    assert "Traceback" in stream.getvalue()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"SLURM_CPUS_PER_TASK": "4"}, {"OMP_NUM_THREADS": "4"}),
        ({"SLURM_CPUS_PER_TASK": "4", "OMP_NUM_THREADS": "2"}, {}),  # the user's choice wins
        ({}, {}),  # no Slurm CPU share: torch's default
        ({"SLURM_CPUS_PER_TASK": "0"}, {}),
        ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2"}, {"OMP_NUM_THREADS": "4"}),
        ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "16"}, {"OMP_NUM_THREADS": "1"}),
        ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "1"}, {}),  # alone: torch's default
    ],
)
def test_threads_follow_the_task_cpu_share(environ: dict[str, str], expected: dict[str, str]) -> None:
    assert thread_env(environ, cpu_count=8) == expected


def test_heartbeats_start_with_the_watchdog_where_the_run_dir_exists(tmp_path) -> None:
    spec = JobSpec.model_validate({"name": "t", "distributed": {"timeout_s": 60, "hang_timeout_s": 30}})
    slurm = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    env = derive_task_env({**slurm, "SLURM_JOB_NODELIST": "n1"})
    monitor = TaskLauncher({}, str(tmp_path)).start_heartbeats(spec, env)
    assert monitor is not None
    try:
        assert isinstance(monitor.watchdog, HangWatchdog) and monitor.watchdog.watch.limit_s == 30
    finally:
        monitor.stop()
    [beat] = read_heartbeats(tmp_path)
    assert (beat.rank, beat.node, beat.job_id, beat.phase) == (0, "n1", "5", "done")


def test_no_heartbeats_where_the_run_dir_is_not_shared(tmp_path, capsys) -> None:
    spec = JobSpec.model_validate({"name": "t", "distributed": {"hang_timeout_s": None}})
    launcher = TaskLauncher({}, str(tmp_path / "elsewhere"))
    assert launcher.start_heartbeats(spec, derive_task_env({})) is None
    assert "does not exist on this node" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere").exists()


# -- the first seconds of a start (issue 30) ---------------------------------------------------------------------
SLURM_RANK1 = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1"}
SLURM_RANK1 |= {"SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "2"}


def test_signals_counted_before_the_stop_request_existed_are_handed_to_it(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stop_signals, "_recorder", stop_signals.Recorder({"TERM": 1}))
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        stop = listen_for_stop(str(tmp_path), derive_task_env(SLURM_RANK1), "USR2")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert (stop.local_reason, stop.term_signals) == ("preempted", 1)


def test_a_stop_before_the_start_skips_the_entry_point_and_says_so(tmp_path, capsys: pytest.CaptureFixture) -> None:
    spec = SimpleNamespace(entrypoint="mine:main")
    ctx = SimpleNamespace(env=derive_task_env({}), stop=StopRequest(), is_main=True, spec=spec, run_dir=tmp_path)
    assert stop_before_start(ctx) is None  # not under Slurm: nobody to ask, nothing requested
    ctx.stop.request("timeout")
    assert stop_before_start(ctx) == "timeout"
    result = stopped_before_start(ctx, "timeout")
    assert result["status"] == "stopped" and result["stop_reason"] == "timeout"
    said = "stopping (timeout) before training: the stop came during set-up; nothing new to save\n"
    assert capsys.readouterr().out == said
    assert not (tmp_path / "summary.json").exists()  # an entry point's run keeps its own summary (or none)


def test_a_stop_during_set_up_ends_the_start_before_the_burn_in(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = TaskLauncher({}, str(tmp_path))
    burnt: list[object] = []
    monkeypatch.setattr(launcher, "burn_in", burnt.append)
    spec = SimpleNamespace(entrypoint="mine:main", entrypoint_args={"lr": 0.1})
    ctx = SimpleNamespace(env=derive_task_env({}), stop=StopRequest(), is_main=True, spec=spec, run_dir=tmp_path)
    result = launcher.train_or_stop(ctx, lambda ctx, lr: {"status": "completed", "lr": lr})
    assert result == {"status": "completed", "lr": 0.1}
    assert burnt == [ctx]
    ctx.stop.request("preempted")
    result = launcher.train_or_stop(ctx, lambda ctx, lr: pytest.fail("the entry point ran after a stop during set-up"))
    assert result["status"] == "stopped" and burnt == [ctx], "no burn-in once a stop came"


def test_the_trainers_summary_says_stopped_and_keeps_counting_restarts(tmp_path) -> None:
    earlier = {"status": "stopped", "stop_reason": "timeout", "global_step": 4, "restarts": 1, "job_id": "77"}
    (tmp_path / "summary.json").write_text(json.dumps(earlier))
    env = derive_task_env({**SLURM_RANK1, "SLURM_PROCID": "0", "SLURM_RESTART_COUNT": "2"})
    ctx = SimpleNamespace(env=env, is_main=True, spec=SimpleNamespace(entrypoint=None), run_dir=tmp_path)
    stopped_before_start(ctx, "preempted")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {k: summary[k] for k in earlier} == {**earlier, "stop_reason": "preempted", "restarts": 2}


def test_a_script_rank_slower_than_rank_zero_of_its_own_start_still_runs(tmp_path) -> None:
    env = derive_task_env(SLURM_RANK1)
    exits: list[int] = []
    done = {"status": "completed", "job_id": "77", "restarts": 1}
    (tmp_path / "summary.json").write_text(json.dumps(done))  # rank 0's script of start 1 finished first
    end_if_completed(str(tmp_path), env, exits.append, this_start=1)
    end_if_completed(str(tmp_path), env, exits.append, this_start=0)  # (a summary of a later start: not ours)
    assert exits == []
    end_if_completed(str(tmp_path), env, exits.append, this_start=2)  # Slurm started the completed job again
    assert exits == [0]


def test_a_start_of_a_run_this_job_completed_ends_at_once(tmp_path, capsys: pytest.CaptureFixture) -> None:
    env = derive_task_env(SLURM_RANK1)  # not rank 0: no scontrol here
    exits: list[int] = []
    end_if_completed(str(tmp_path), env, exits.append)  # no summary: a start like any other
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "job_id": "12", "global_step": 9}))
    end_if_completed(str(tmp_path), env, exits.append)  # completed by another job: 'hpctrain resume'
    assert exits == []
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "job_id": "77", "global_step": 9}))
    end_if_completed(str(tmp_path), env, exits.append)
    assert exits == [0]
    assert "this job completed the run already (step 9); Slurm started it again" in capsys.readouterr().err


def test_rank_zero_records_its_start_with_the_runs_step_and_a_torchrun_workers_node_start(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctrain.contract.starts import BEGAN_VAR, read_starts
    from hpctrain.contract.summary import write_summary
    from hpctrain.programs.launcher import record_this_start

    write_summary(tmp_path, {"status": "stopped", "global_step": 40})
    monkeypatch.setenv(BEGAN_VAR, "900.0")  # a node launcher's, inherited: not this plain Slurm task's
    slurm = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    record_this_start(str(tmp_path), derive_task_env({**slurm, "SLURM_JOB_NODELIST": "n1"}), 1000.0)
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    torchrun |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400", "GROUP_RANK": "0"}
    record_this_start(str(tmp_path), derive_task_env(torchrun), 1000.0)
    plain, worker = read_starts(tmp_path)
    assert (plain.began, plain.job_id, plain.step_before, plain.first) == (1000.0, "5", 40, False)
    assert worker.began == 900.0  # the node launcher's process began this start


def test_a_start_that_cannot_be_recorded_is_warned_about_not_fatal(tmp_path, capsys) -> None:
    from hpctrain.programs.launcher import record_this_start

    (tmp_path / ".hpctrain").write_text("a file where the folder goes")
    record_this_start(str(tmp_path), derive_task_env({}), 1000.0)
    assert "could not record this start" in capsys.readouterr().err


def test_rank_zeros_own_error_takes_the_requeue_flag_away_but_a_lost_peer_does_not(tmp_path, monkeypatch) -> None:
    """With ``--requeue=expedite`` Slurm holds a failed job (REQUEUE_HOLD) unless its Requeue flag is gone; a
    bug on rank 0 ends the run for good, a broken collective may be a lost node, which Slurm should requeue."""
    from tests.fake_slurm import FakeSlurm

    fake = FakeSlurm({"77": "RUNNING"})
    monkeypatch.setattr("hpctrain.runtime.slurm_relay.slurm_runner", lambda environ=None: fake)
    launcher = TaskLauncher({}, str(tmp_path))
    launcher._env = derive_task_env({**SLURM_RANK1, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    launcher.record_failure(RuntimeError("Connection closed by peer [10.0.0.2]:4242"))
    assert fake.asked("scontrol") == []
    launcher.record_failure(ValueError("trainer.lr must be positive"))
    assert fake.asked("scontrol") == [["scontrol", "update", "JobId=77", "Requeue=0"]]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"

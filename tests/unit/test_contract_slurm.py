"""hpctrain.contract.slurm: the one client's runner and its failure classes, its questions and actions
(the argv each one runs), and the one wait."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract import slurm
from hpctrain.contract.slurm import Slurm, SlurmCommandError, classify_failure, run_slurm, show_job_command
from hpctrain.contract.slurm_answers import (
    DEFAULT_REQUEUE_HOLD_S,
    parse_kill_wait_s,
    parse_max_array_size,
    requeue_hold_s,
)
from hpctrain.errors import ClusterError
from hpctrain.jobscript.sbatch_script import signal_parameter
from tests.fake_slurm import FakeSlurm, nowhere, on_path

# The shape of ``scontrol show config`` (Slurm 22.05), trimmed.
CONFIG = """\
Configuration data as of 2026-11-22T10:00:00
InactiveLimit           = 0 sec
KillOnBadExit           = 0
KillWait                = 5 sec
LaunchParameters        = (null)
"""


def answer(code: int = 0, out: str = "", err: str = "", raises: BaseException | None = None) -> Any:
    def runner(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert kwargs["timeout"] > 0 and kwargs["check"] is False
        if raises is not None:
            raise raises
        return subprocess.CompletedProcess(command, code, stdout=out, stderr=err)

    return runner


def test_stdout_on_success() -> None:
    assert run_slurm(["squeue"], runner=answer(out="RUNNING\n")) == "RUNNING\n"


@pytest.mark.parametrize(
    ("runner", "kind", "needle"),
    [
        (answer(raises=FileNotFoundError("sacct")), "missing", "not on this machine"),
        (answer(raises=subprocess.TimeoutExpired(["sacct"], 30)), "timeout", "did not answer"),
        (
            answer(1, err="sacct: error: slurm_persist_conn_open_without_init: failed to open persistent "
                   "connection to host:ctl:6819: Connection refused"),
            "unreachable",
            "could not reach the Slurm controller",
        ),
        (
            answer(1, err="squeue: error: Unable to contact slurm controller (connect failure)"),
            "unreachable",
            "could not reach",
        ),
        (
            answer(1, err="scancel: error: Kill job error on job id 99: Invalid job id specified"),
            "unknown-job",
            "does not know",
        ),
        (answer(1, err="scontrol: error: Requested operation is presently disabled"), "refused", "presently disabled"),
        (answer(2), "refused", "no output"),
    ],
)  # fmt: skip
def test_failures_become_cluster_errors_with_a_kind(runner: Any, kind: str, needle: str) -> None:
    with pytest.raises(SlurmCommandError) as info:
        run_slurm(["sacct", "-j", "99"], runner=runner)
    assert isinstance(info.value, ClusterError)
    assert info.value.kind == kind
    assert needle in info.value.message
    assert info.value.hint or kind == "refused"


def test_classify_failure_is_pure() -> None:
    error = classify_failure(["scancel", "7"], 1, "Invalid job id specified")
    assert (error.kind, error.exit_code) == ("unknown-job", 3)
    assert "MinJobAge" in (error.hint or "")


def test_kill_wait_from_scontrol_show_config() -> None:
    assert parse_kill_wait_s(CONFIG) == 5.0
    assert parse_kill_wait_s("garbage") is None


def test_signal_parameter_and_commands() -> None:
    assert signal_parameter("USR1", 300) == "USR1@300"
    assert show_job_command("12_3") == ["scontrol", "--oneliner", "show", "job", "12_3"]


def client(runner: Any) -> Slurm:
    return Slurm(runner, which=on_path, sleep=lambda seconds: None)


def test_max_array_size_from_scontrol_show_config() -> None:
    assert parse_max_array_size("KillWait                = 30 sec\nMaxArraySize            = 40001\n") == 40001
    assert parse_max_array_size("KillWait = 30 sec\n") is None

    def answers(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 0, "MaxArraySize = 77\n", "")

    def unreachable(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "Unable to contact slurm controller")

    assert client(answers).max_array_size() == 77
    assert client(unreachable).max_array_size() == slurm.DEFAULT_MAX_ARRAY_SIZE
    assert Slurm(answers, which=nowhere).max_array_size() == slurm.DEFAULT_MAX_ARRAY_SIZE  # no scontrol here


def test_config_is_asked_once_per_client() -> None:
    fake = FakeSlurm(kill_wait_s=7)
    one = fake.client()
    assert one.kill_wait_s() == 7.0 and one.slurmd_port() == slurm.DEFAULT_SLURMD_PORT
    assert fake.asked("scontrol") == [["scontrol", "show", "config"]]


def test_job_state_asks_squeue_only_while_sacct_has_not_caught_up() -> None:
    def job_state(job_id: str, *, runner: Any, source: Any = "sacct") -> str:
        return client(runner).job_state(job_id, source=source)

    asked: list[str] = []

    def fresh_job(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        asked.append(command[0])
        return subprocess.CompletedProcess(command, 0, stdout="" if command[0] == "sacct" else "PENDING\n", stderr="")

    assert job_state("12_3", runner=answer(out="12_3|CANCELLED by 0\n")) == "CANCELLED"
    assert job_state("12", runner=fresh_job) == "PENDING" and asked == ["sacct", "squeue"]
    assert job_state("12", runner=answer(out="")) == "UNKNOWN"  # neither lists it
    assert job_state("12", source="squeue", runner=answer(out="RUNNING\n")) == "RUNNING"
    assert job_state("12", source="squeue", runner=answer(out="")) == "UNKNOWN"
    with pytest.raises(SlurmCommandError) as raised:
        job_state("12", source="squeue", runner=answer(code=1, err="Invalid job id specified"))
    assert raised.value.kind == "unknown-job"


@pytest.mark.parametrize("good", ["48121", "48121_3", "48121+1", " 48121 "])
def test_a_job_id_names_one_job(good: str) -> None:
    assert slurm.checked_job_id(good) == good.strip()


@pytest.mark.parametrize("bad", ["--user=root", "-1", "1,2", "1 2", "", "12_[1-3]", "abc", "1" * 30, None])
def test_anything_else_is_refused_before_a_command_runs(bad: object) -> None:
    calls: list[list[str]] = []

    def runner(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    with pytest.raises(slurm.SlurmCommandError, match="is not a Slurm job id"):
        slurm.checked_job_id(bad)
    asking = client(runner)
    for ask in (asking.show_job, asking.job_state, asking.processes_may_run, asking.cancel_job, asking.job_steps):
        with pytest.raises(slurm.SlurmCommandError):
            ask(bad)  # type: ignore[arg-type]
    for act in (lambda: asking.signal_job(bad, "USR2"), lambda: asking.exclude_nodes(bad, ["n1"])):  # type: ignore[arg-type]
        with pytest.raises(slurm.SlurmCommandError):
            act()
    assert asking.job_states([str(bad)]) == {} and calls == []


def test_a_requeued_job_is_released_only_after_the_second_of_its_requeue() -> None:
    """Slurm 22.05 fails a job released within the second of its requeue ("Job credential revoked")."""
    events: list[object] = []
    fake = FakeSlurm({"42": "PENDING"})
    Slurm(
        lambda command, **kwargs: events.append(command) or fake(command), which=on_path, sleep=events.append
    ).release_job("42")
    assert events == [slurm.RELEASE_AFTER_REQUEUE_S, ["scontrol", "update", "JobId=42", "StartTime=now"]]
    assert slurm.RELEASE_AFTER_REQUEUE_S >= 1.0  # Slurm's credential times are whole seconds


def test_wait_for_polls_until_the_state_it_waits_for_and_times_out_with_the_last_state() -> None:
    states = iter(["PENDING", "RUNNING", "RUNNING", "RUNNING", "COMPLETED"])
    now = [0.0]

    def runner(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 0, f"12|{next(states)}\n", "")

    def sleep(seconds: float) -> None:
        now[0] += seconds

    waiting = Slurm(runner, which=on_path, sleep=sleep, clock=lambda: now[0])
    assert waiting.wait_for("12", until=lambda state: state == "RUNNING", poll_s=2.0) == "RUNNING" and now == [2.0]
    with pytest.raises(slurm.WaitTimedOut) as late:
        waiting.wait_for("12", until=lambda state: False, timeout_s=1.0, poll_s=2.0)
    assert (
        late.value.state == "RUNNING"
        and late.value.kind == "timeout"
        and "still RUNNING after 1 s" in late.value.message
    )
    assert waiting.wait_for("12") == "COMPLETED"  # by default: until the job ended


def test_the_healing_supervisors_commands_keep_their_argv() -> None:
    fake = FakeSlurm(
        {"12": "RUNNING"},
        answers={
            "squeue -h -s": (0, "12.0 hpctrain-step\n12.1 hpctrain-guardian\n"),
            "sinfo": (0, "n1 idle\nn2 down*\n"),
        },
    )
    asking = fake.client()
    assert asking.job_steps("12") == [("12.0", "hpctrain-step"), ("12.1", "hpctrain-guardian")]
    asking.kill_step("12.0")
    assert asking.node_states(["n1", "n2"]) == {"n1": "idle", "n2": "down*"}
    asking.exclude_nodes("12", ["n2", "n3"])
    asking.requeue_job("12")
    assert fake.commands == [
        ["squeue", "-h", "-s", "-j", "12", "-o", "%i %j"],
        ["scancel", "--signal=KILL", "12.0"],
        ["sinfo", "-h", "-N", "-n", "n1,n2", "-o", "%N %T"],
        ["scontrol", "update", "JobId=12", "ExcNodeList=n2,n3"],
        ["scontrol", "requeue", "12"],
    ]
    with pytest.raises(SlurmCommandError, match="not a Slurm job step id"):
        asking.kill_step("--user=me")


def test_available_asks_for_sbatch_and_a_way_to_follow_a_job() -> None:
    assert Slurm(FakeSlurm(), which=on_path).available()
    assert not Slurm(FakeSlurm(), which=nowhere).available()
    assert not Slurm(FakeSlurm(), which=lambda name: None if name == "sbatch" else on_path(name)).available()
    assert Slurm(FakeSlurm(), which=lambda name: None if name == "sacct" else on_path(name)).available()
    assert Slurm(FakeSlurm(), which=lambda name: None if name == "scancel" else on_path(name)).missing_clients() == [
        "scancel"
    ]


def test_a_refused_helper_job_says_what_to_change(tmp_path: Path) -> None:
    fake = FakeSlurm(
        answers={"sbatch": (1, "sbatch: error: Batch job submission failed: Invalid partition name specified")}
    )
    command = slurm.sbatch_wrap_command(job_name="x", wrap="true", output=tmp_path / "o", time_min=2)
    with pytest.raises(SlurmCommandError) as refused:
        fake.client().submit_wrapped(command)
    assert refused.value.message.startswith("sbatch: the partition does not exist: sbatch: error:")
    assert "sinfo -s" in (refused.value.hint or "")


def test_expedited_requeue_is_asked_of_scontrol_show_config_and_never_raises() -> None:
    on = "SLURM_VERSION           = 26.05.5\nSlurmctldParameters     = enable_expedited_requeue\n"
    fake = FakeSlurm(answers={"scontrol show config": (0, on)})
    assert fake.client().expedited_requeue().available
    down = FakeSlurm(
        answers={"scontrol show config": (1, "slurm_load_ctl_conf error: Unable to contact slurm controller")}
    )
    support = down.client().expedited_requeue()
    assert not support.available and "did not answer" in support.why


def test_the_requeue_hold_is_the_job_credentials_lifetime() -> None:
    assert requeue_hold_s({"AuthInfo": "cred_expire=300,socket=/run/munge.sock"}) == 300
    assert requeue_hold_s({"CredExpire": "45 sec"}) == 45
    assert requeue_hold_s({"AuthInfo": "(null)"}) == DEFAULT_REQUEUE_HOLD_S == 120


# -- which nodes a requeued job could still get (healing/decide.py's Room) -------------------------------------------
def test_node_states_that_can_never_run_a_job_are_told_apart() -> None:
    from hpctrain.contract.slurm_answers import node_runs_jobs

    runs = ["idle", "mixed", "allocated", "completing", "reserved", "maint", "planned", "idle~", "mixed-", "idle#"]
    never = ["down", "down*", "idle*", "drained", "draining", "drain", "fail", "failing", "future", "inval", "unknown"]
    never += ["idle+drain", "mixed+fail", "drained*", ""]
    assert [state for state in runs if not node_runs_jobs(state)] == []
    assert [state for state in never if node_runs_jobs(state)] == []


def test_a_partitions_usable_nodes_are_read_per_partition_with_their_features() -> None:
    from hpctrain.contract.slurm_answers import NodeNeeds, parse_partition_nodes

    text = (
        "l1|debug*|idle|(null)|(null)|4|8000\nl2|debug*|drained|(null)|(null)|4|8000\nl3|debug*|mixed|gpu,ib|(null)|4|8000\n"
        "l3|big|mixed|gpu,ib|(null)|4|8000\nl4|big|down*|gpu|(null)|4|8000\nl5|big|allocated|gpu|(null)|4|8000\n"
        "nonsense line\n|debug|idle|x|(null)|4|8000\nl6|debug|idle|(null)\n"
    )
    assert parse_partition_nodes(text) == {"debug": ["l1", "l3"], "big": ["l3", "l5"]}
    assert parse_partition_nodes(text, NodeNeeds(features=("gpu", "ib"))) == {"debug": ["l3"], "big": ["l3"]}
    assert parse_partition_nodes("") == {}


def test_a_node_without_the_jobs_gpus_or_cpus_is_not_counted() -> None:
    """HAL's shape: 4 V100 a node; a partition that also holds 2-GPU and CPU-only nodes. A job of 4 GPUs (and
    4 x 10 CPUs) a node can start on neither: a requeue's room and a submit's ledger trim must not count them."""
    from hpctrain.contract.slurm_answers import NodeNeeds, parse_partition_nodes

    text = (
        "h1|gpu*|idle|v100|gpu:v100:4(S:0-1)|160|191000\n"
        "h2|gpu*|mixed|v100|gpu:v100:2(S:0)|160|191000\n"
        "h3|gpu*|idle|(null)|(null)|160|191000\n"
        "h4|gpu*|idle|a100|gpu:a100:2(S:0),gpu:v100:2(S:1)|160|191000\n"
        "h5|gpu*|idle|v100|gpu:v100:4(S:0-1)|32|191000\n"
        "h6|gpu*|idle|v100|gpu:v100:4,mps:400|160|191000\n"
    )
    four_gpus = NodeNeeds(gpus=4, cpus=40)
    assert parse_partition_nodes(text, four_gpus) == {"gpu": ["h1", "h4", "h6"]}
    assert parse_partition_nodes(text, NodeNeeds(gpus=2, cpus=40)) == {"gpu": ["h1", "h2", "h4", "h6"]}
    assert parse_partition_nodes(text, NodeNeeds(gpus=4, features=("v100",), cpus=160)) == {"gpu": ["h1", "h6"]}
    assert parse_partition_nodes(text, NodeNeeds()) == {"gpu": ["h1", "h2", "h3", "h4", "h5", "h6"]}


def test_gres_it_cannot_read_counts_the_node_as_before() -> None:
    from hpctrain.contract.slurm_answers import NodeNeeds, gres_gpus, parse_partition_nodes

    assert [gres_gpus(g) for g in ("(null)", "", "gpu", "gpu:2", "gpu:tesla", "mps:100", "gpu:v100:4(IDX:0,2)")] == [
        0,
        0,
        1,
        2,
        1,
        0,
        4,
    ]
    assert gres_gpus("gpu:v100:4K") is None
    text = "x1|p|idle|(null)|gpu:v100:4K|4+|lots\n"  # shapes sinfo never printed here: judged by state only
    assert parse_partition_nodes(text, NodeNeeds(gpus=8, cpus=64, mem_mb=512000)) == {"p": ["x1"]}


def test_only_a_plain_constraint_filters_the_nodes_by_feature() -> None:
    from hpctrain.contract.slurm_answers import plain_features

    assert plain_features(None) == () and plain_features("v100&ib") == ("v100", "ib")
    assert [plain_features(c) for c in ("v100|a100", "[rack1*2]", "!old", "gpu*2")] == [None] * 4


def test_the_client_asks_sinfo_for_the_partitions_nodes() -> None:
    fake = FakeSlurm(partition={"l1": "idle", "l2": "down*", "l3": "mixed"})
    client = fake.client()
    assert client.usable_nodes("debug,big") == {"debug": ["l1", "l3"]}
    assert client.partition_nodes(None) == ["l1", "l3"]
    assert fake.commands == [
        ["sinfo", "-h", "-N", "-o", "%N|%P|%T|%f|%G|%c|%m", "-p", "debug,big"],
        ["sinfo", "-h", "-N", "-o", "%N|%P|%T|%f|%G|%c|%m"],
    ]

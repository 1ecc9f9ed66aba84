"""hpctrain's Slurm parsers on answers recorded from each tested Slurm release (22.05, 24.11, 26.05).

The files under golden/slurm/VERSION/ are what that release's commands printed on
the test cluster (``tests/cluster/record-slurm-outputs``); record them again
after the cluster or a parser changes. What differs between releases, and how
hpctrain handles it, is listed in docs/clusters.md ("Tested Slurm versions").
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.slurm import Slurm, classify_failure
from hpctrain.contract.slurm_answers import (
    ExpeditedRequeue,
    classify_sbatch_failure,
    expedited_requeue_support,
    parse_config,
    parse_job_record,
    parse_kill_wait_s,
    parse_max_array_size,
    parse_partitions,
    parse_sacct_states,
    parse_version,
)
from hpctrain.contract.slurm_states import ACTIVE_STATES, TERMINAL_STATES, normalise_state
from hpctrain.diagnose.doctor import ClusterView, check_slurm
from hpctrain.runtime.requeue import job_phase, rank_zero_action
from hpctrain.runtime.task_env import derive_task_env
from tests.fake_slurm import on_path

GOLDEN = Path(__file__).parent / "golden" / "slurm"
VERSIONS = ["22.05", "24.11", "26.05"]


def recorded(version: str, name: str) -> str:
    return (GOLDEN / version / name).read_text()


def version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


pytestmark = pytest.mark.parametrize("version", VERSIONS)


def test_every_version_is_recorded(version: str) -> None:
    assert (GOLDEN / version / "sbatch_version.txt").is_file(), f"run tests/cluster/record-slurm-outputs on {version}"


def test_version(version: str) -> None:
    assert parse_version(recorded(version, "sbatch_version.txt")) == version_tuple(version)
    assert parse_version("slurm 24.11.5") == (24, 11) and parse_version("no version") is None


def test_sacct_states(version: str) -> None:
    states = parse_sacct_states(recorded(version, "sacct_states.txt"))
    assert {"COMPLETED", "FAILED", "CANCELLED"} <= set(states.values())  # "CANCELLED by 0" normalised
    assert all(state in TERMINAL_STATES | {"REQUEUED", "PREEMPTED", "PENDING"} for state in states.values())
    assert any("_" in job_id for job_id in states)  # array tasks: 12_0, 12_1


def test_job_records_and_phases(version: str) -> None:
    running = parse_job_record(recorded(version, "scontrol_show_job_running.txt"))
    assert (running["JobState"], running["Restarts"], running["Requeue"]) == ("RUNNING", "0", "1")
    assert job_phase(running, restart_count=0) == "running"
    preempting = parse_job_record(recorded(version, "scontrol_show_job_preempting.txt"))
    assert job_phase(preempting, restart_count=0) == "preempting", preempting
    requeued = parse_job_record(recorded(version, "scontrol_show_job_requeued.txt"))
    assert int(requeued["Restarts"]) == 1 and job_phase(requeued, restart_count=0) == "requeued"


def test_rank_zero_leaves_a_preemption_to_slurm_from_24_05(version: str) -> None:
    # Measured: from 24.05, requeueing a preempting job ourselves makes its next run requeue once more.
    action = rank_zero_action("slurm-requeues", "preempting", False, version_tuple(version))
    assert action == ("requeue" if version_tuple(version) < (24, 5) else "exit")


def test_squeue_states(version: str) -> None:
    assert normalise_state(recorded(version, "squeue_running.txt")) == "RUNNING"
    assert normalise_state(recorded(version, "squeue_requeued.txt")) in ACTIVE_STATES | {"PENDING", "REQUEUED"}


def test_config_and_partitions(version: str) -> None:
    config = recorded(version, "scontrol_show_config.txt")
    assert parse_kill_wait_s(config) == 5.0  # the test cluster's KillWait
    assert parse_max_array_size(config) == 1001
    partitions = parse_partitions(recorded(version, "scontrol_show_partition.txt"))
    assert set(partitions) == {"debug", "urgent", "short"}
    assert partitions["debug"]["Default"] == "YES" and partitions["short"]["MaxTime"] == "00:02:00"
    assert partitions["debug"]["PreemptMode"] == "REQUEUE" and partitions["urgent"]["PriorityTier"] == "10"


def test_task_env_from_a_real_step(version: str) -> None:
    environ = dict(line.split("=", 1) for line in recorded(version, "srun_env_rank3.txt").splitlines() if "=" in line)
    env = derive_task_env(environ)
    assert (env.global_rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.num_nodes, env.hostnames) == (1, 2, ("n1", "n2"))


def test_refusals_are_explained(version: str) -> None:
    unknown = classify_failure(["scontrol"], 1, recorded(version, "scontrol_show_job_unknown.txt"))
    assert unknown.kind == "unknown-job"
    assert classify_sbatch_failure(recorded(version, "sbatch_invalid_partition.txt"))[0] == (
        "the partition does not exist"
    )
    assert classify_sbatch_failure(recorded(version, "sbatch_gres.txt"))[0] == "no node can ever satisfy the request"
    too_many_nodes = recorded(version, "sbatch_too_many_nodes.txt")
    if version == "24.11":
        assert classify_sbatch_failure(too_many_nodes)[0] == "no node can ever satisfy the request"
    else:
        # With EnforcePartLimits=NO (the default) 22.05 and 26.05 queue a job asking for more
        # nodes than the partition has: it pends forever. submit's preflight refuses it first,
        # from the partition's TotalNodes (test_diagnose_preflight.py).
        assert too_many_nodes.startswith("Submitted batch job")
        assert parse_partitions(recorded(version, "scontrol_show_partition.txt"))["debug"]["TotalNodes"] == "2"


def test_doctor_reads_every_version(version: str) -> None:
    answers = {
        ("sbatch", "--version"): "sbatch_version.txt",
        ("scontrol", "ping"): "scontrol_ping.txt",
        ("scontrol", "show", "config"): "scontrol_show_config.txt",
        ("scontrol", "--oneliner", "show", "partition"): "scontrol_show_partition.txt",
        ("scontrol", "--oneliner", "show", "node"): "scontrol_show_node.txt",
    }

    def runner(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        name = answers.get(tuple(command))
        out = recorded(version, name) if name else "1|\n"  # sacct answers
        return subprocess.CompletedProcess(command, 0, stdout=out, stderr="")

    view = ClusterView(Slurm(runner, which=on_path))
    assert [check.level for check in check_slurm(view)] == ["ok", "ok", "ok"]
    assert view.config["PreemptType"] == "preempt/partition_prio"
    nodes = {node["NodeName"]: node for node in view.nodes}
    assert set(nodes) == {"n1", "n2"} and nodes["n1"]["CPUTot"] == "4" and nodes["n1"]["RealMemory"] == "4000"


def test_expedited_requeue_needs_25_11_and_the_switch(version: str) -> None:
    """The recorded test clusters: 22.05 and 24.11 have no expedited requeue; 26.05 has it once slurm.conf
    says ``SlurmctldParameters=enable_expedited_requeue`` (the test cluster says it since this was recorded)."""
    config = parse_config(recorded(version, "scontrol_show_config.txt"))
    support = expedited_requeue_support(config)
    if version == "26.05":
        switched_on = "enable_expedited_requeue" in config.get("SlurmctldParameters", "")
        assert support.available is switched_on, support
        off = expedited_requeue_support({**config, "SlurmctldParameters": "(null)"})
        assert "lacks SlurmctldParameters=enable_expedited_requeue" in off.why, off
        switched = {**config, "SlurmctldParameters": "enable_stepmgr,enable_expedited_requeue"}
        assert expedited_requeue_support(switched) == ExpeditedRequeue(
            True, "Slurm 26.05 with SlurmctldParameters=enable_expedited_requeue"
        )
    else:
        assert not support.available and "it came with 25.11" in support.why, support
        assert not expedited_requeue_support({**config, "SlurmctldParameters": "enable_expedited_requeue"}).available
    assert "did not say its version" in expedited_requeue_support({}).why

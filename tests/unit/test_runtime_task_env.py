"""derive_task_env over plain dicts: every launcher, every hostlist form, every inconsistency."""

from __future__ import annotations

import pytest

from hpctrain.errors import DistributedSetupError
from hpctrain.runtime.master import PORT_RANGE_END, PORT_RANGE_START, derive_master_port
from hpctrain.runtime.task_env import (
    derive_task_env,
    detect_source,
    export_torchrun_env,
    parse_hostlist,
    parse_tasks_per_node,
)


def slurm_env(**overrides: str) -> dict[str, str]:
    """Rank 3 of a 2 nodes x 2 tasks job, as measured on the test cluster."""
    env = {
        "SLURM_JOB_ID": "1234",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    env.update(overrides)
    return {key: value for key, value in env.items() if value != "<unset>"}


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("linux[1,2]", ["linux1", "linux2"]),
        ("nodeA,nodeB[001,003],nodeC", ["nodeA", "nodeB001", "nodeB003", "nodeC"]),
        ("host-[001-002]", ["host-001", "host-002"]),
        ("gpu-node-a,gpu-node-b", ["gpu-node-a", "gpu-node-b"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[1-2,5],m[001-002]", ["n1", "n2", "n5", "m001", "m002"]),
        ("rack[1-2]-gpu[01-02]", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"]),
        (" n[1-2] ", ["n1", "n2"]),
    ],
)
def test_parse_hostlist_forms(nodelist: str, expected: list[str]) -> None:
    assert parse_hostlist(nodelist) == expected


@pytest.mark.parametrize("nodelist", ["", "n[1-2", "n]1", "n[a-b]"])
def test_parse_hostlist_rejects_garbage_naming_the_variable(nodelist: str) -> None:
    with pytest.raises(DistributedSetupError, match="SLURM_STEP_NODELIST"):
        parse_hostlist(nodelist, variable="SLURM_STEP_NODELIST")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("4", [4]), ("2(x2)", [2, 2]), ("4,2", [4, 2]), ("2(x3),1", [2, 2, 2, 1]), ("8(x1)", [8])],
)
def test_parse_tasks_per_node(value: str, expected: list[int]) -> None:
    assert parse_tasks_per_node(value) == expected


@pytest.mark.parametrize("value", ["", "2x2", "2(2)", "a", "2(x2),"])
def test_parse_tasks_per_node_rejects_garbage(value: str) -> None:
    with pytest.raises(DistributedSetupError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node(value)


def test_slurm_two_by_two() -> None:
    env = derive_task_env(slurm_env())
    assert env.source == "slurm"
    assert (env.global_rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.num_nodes, env.hostnames) == (1, 2, ("n1", "n2"))
    assert env.hostname == "n2"
    assert env.master_addr == "n1"
    assert env.master_port == derive_master_port("1234", 0)
    assert (env.job_id, env.restart_count, env.is_main) == ("1234", 0, False)


def test_slurm_uneven_tasks_per_node() -> None:
    env = derive_task_env(
        slurm_env(
            SLURM_PROCID="5",
            SLURM_NTASKS="6",
            SLURM_NODEID="1",
            SLURM_LOCALID="1",
            SLURM_TASKS_PER_NODE="4,2",
            SLURM_JOB_NODELIST="gpu-[001,003]",
        )
    )
    assert (env.local_world_size, env.hostname, env.master_addr) == (2, "gpu-003", "gpu-001")


def test_slurm_single_node_without_tasks_per_node() -> None:
    env = derive_task_env(
        slurm_env(
            SLURM_PROCID="0",
            SLURM_NTASKS="1",
            SLURM_LOCALID="0",
            SLURM_NODEID="0",
            SLURM_JOB_NUM_NODES="1",
            SLURM_JOB_NODELIST="n1",
            SLURM_TASKS_PER_NODE="<unset>",
        )
    )
    assert (env.world_size, env.local_world_size, env.master_addr, env.is_main) == (1, 1, "n1", True)


def test_slurm_step_variables_win_over_job_variables() -> None:
    # A step on 2 of the job's 3 nodes: ranks and node ids are the step's.
    env = derive_task_env(
        slurm_env(
            SLURM_JOB_NUM_NODES="3",
            SLURM_JOB_NODELIST="n[1-3]",
            SLURM_TASKS_PER_NODE="2(x3)",
            SLURM_STEP_NODELIST="n[2-3]",
            SLURM_STEP_NUM_NODES="2",
            SLURM_STEP_TASKS_PER_NODE="2(x2)",
        )
    )
    assert (env.hostnames, env.master_addr, env.hostname) == (("n2", "n3"), "n2", "n3")


def test_slurm_array_task_gets_its_own_port_and_a_submitit_style_id() -> None:
    first = derive_task_env(slurm_env(SLURM_JOB_ID="1001", SLURM_ARRAY_JOB_ID="1000", SLURM_ARRAY_TASK_ID="0"))
    second = derive_task_env(slurm_env(SLURM_JOB_ID="1002", SLURM_ARRAY_JOB_ID="1000", SLURM_ARRAY_TASK_ID="1"))
    # The last array task gets the base id as its SLURM_JOB_ID.
    last = derive_task_env(slurm_env(SLURM_JOB_ID="1000", SLURM_ARRAY_JOB_ID="1000", SLURM_ARRAY_TASK_ID="2"))
    assert (first.job_id, second.job_id, last.job_id) == ("1000_0", "1000_1", "1000_2")
    assert len({first.master_port, second.master_port, last.master_port}) == 3


def test_slurm_restart_changes_the_port() -> None:
    ports = [derive_task_env(slurm_env(SLURM_RESTART_COUNT=str(k))).master_port for k in range(5)]
    assert len(set(ports)) == 5
    assert derive_task_env(slurm_env(SLURM_RESTART_COUNT="2")).restart_count == 2


def test_explicit_ports_win_spec_first() -> None:
    assert derive_task_env(slurm_env(MASTER_PORT="23456")).master_port == 23456
    assert derive_task_env(slurm_env(MASTER_PORT="23456"), spec_master_port=24000).master_port == 24000


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2"),
        ({"SLURM_JOB_NUM_NODES": "3"}, "SLURM_JOB_NUM_NODES=3"),
        ({"SLURM_TASKS_PER_NODE": "2(x3)"}, "SLURM_TASKS_PER_NODE='2(x3)'"),
        ({"SLURM_TASKS_PER_NODE": "3,2"}, "SLURM_TASKS_PER_NODE='3,2'"),
        ({"SLURM_NTASKS": "<unset>"}, "SLURM_NTASKS"),
        ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS=0"),
        ({"SLURM_LOCALID": "<unset>"}, "SLURM_LOCALID"),
        ({"SLURM_NODEID": "one"}, "SLURM_NODEID='one'"),
        ({"SLURM_PROCID": "-1"}, "SLURM_PROCID=-1"),
        ({"SLURM_JOB_NODELIST": "<unset>"}, "SLURM_JOB_NODELIST"),
        ({"SLURM_JOB_NODELIST": "n[1-2"}, "SLURM_JOB_NODELIST"),
        ({"SLURM_RESTART_COUNT": "x"}, "SLURM_RESTART_COUNT='x'"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
        ({"MASTER_PORT": ""}, "MASTER_PORT"),
    ],
)
def test_slurm_inconsistencies_name_the_variable(overrides: dict[str, str], variable: str) -> None:
    with pytest.raises(DistributedSetupError) as raised:
        derive_task_env(slurm_env(**overrides))
    assert variable in raised.value.message


def submitit_local_env(rank: int, ntasks: int = 2) -> dict[str, str]:
    """What submitit's LocalExecutor controller gives each task."""
    return {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": "4242",
        "SUBMITIT_LOCAL_NTASKS": str(ntasks),
        "SUBMITIT_LOCAL_GLOBALID": str(rank),
        "SUBMITIT_LOCAL_LOCALID": str(rank),
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
    }


def test_submitit_local() -> None:
    env = derive_task_env(submitit_local_env(1, ntasks=3))
    assert env.source == "submitit-local"
    assert (env.global_rank, env.world_size, env.local_rank, env.local_world_size) == (1, 3, 1, 3)
    assert (env.num_nodes, env.master_addr, env.job_id) == (1, "127.0.0.1", "4242")
    assert env.master_port == derive_master_port("4242", 0)
    assert env.job_aliases == ("4242",)  # a cancel marker naming the controller's PID applies


def test_submitit_local_wins_inside_an_salloc_shell() -> None:
    environ = slurm_env() | submitit_local_env(0)
    assert detect_source(environ) == "submitit-local"
    assert derive_task_env(environ).world_size == 2


def test_submitit_local_rank_out_of_range() -> None:
    environ = submitit_local_env(2) | {"SUBMITIT_LOCAL_LOCALID": "0"}
    with pytest.raises(DistributedSetupError, match="SUBMITIT_LOCAL_GLOBALID=2"):
        derive_task_env(environ)


def torchrun_env(**overrides: str) -> dict[str, str]:
    """Worker 5 of `torchrun --nnodes 2 --nproc-per-node 4`."""
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "abc",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    env.update(overrides)
    return {key: value for key, value in env.items() if value != "<unset>"}


def test_torchrun() -> None:
    env = derive_task_env(torchrun_env(), spec_master_port=20000)
    assert env.source == "torchrun"
    assert (env.global_rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert (env.node_rank, env.num_nodes, env.master_addr) == (1, 2, "10.0.0.1")
    # torchrun's agent may already host its store there: its port wins over the spec's.
    assert env.master_port == 29400
    assert (env.job_id, env.restart_count) == ("abc", 1)


def test_torchrun_inside_a_slurm_step_is_torchrun() -> None:
    environ = slurm_env(SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="1(x2)") | torchrun_env()
    assert derive_task_env(environ).world_size == 8


def test_hand_made_torchrun_style_env_defaults() -> None:
    env = derive_task_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert (env.local_world_size, env.node_rank, env.num_nodes) == (2, 0, 1)


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"MASTER_ADDR": "<unset>"}, "MASTER_ADDR"),
        ({"MASTER_PORT": "<unset>"}, "MASTER_PORT"),
        ({"RANK": "8"}, "RANK=8"),
        ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4"),
        ({"GROUP_RANK": "2"}, "GROUP_RANK=2"),
        ({"LOCAL_RANK": "<unset>"}, "LOCAL_RANK"),
    ],
)
def test_torchrun_inconsistencies_name_the_variable(overrides: dict[str, str], variable: str) -> None:
    with pytest.raises(DistributedSetupError) as raised:
        derive_task_env(torchrun_env(**overrides))
    assert variable in raised.value.message


def test_single_process() -> None:
    env = derive_task_env({"HOME": "/root"})
    assert env.source == "single"
    assert (env.global_rank, env.world_size, env.local_world_size, env.num_nodes) == (0, 1, 1, 1)
    assert env.master_addr == "127.0.0.1"
    assert PORT_RANGE_START <= env.master_port < PORT_RANGE_END
    assert derive_task_env({"MASTER_PORT": "20001"}).master_port == 20001


def test_export_torchrun_env_round_trips() -> None:
    env = derive_task_env(slurm_env())
    environ: dict[str, str] = {"PATH": "/bin"}
    export_torchrun_env(env, environ)
    assert environ["RANK"] == "3" and environ["WORLD_SIZE"] == "4" and environ["LOCAL_RANK"] == "1"
    assert environ["LOCAL_WORLD_SIZE"] == "2" and environ["MASTER_ADDR"] == "n1"
    assert environ["MASTER_PORT"] == str(env.master_port) and environ["PATH"] == "/bin"
    # The exported variables are consistent with Slurm's: deriving again gives the same layout.
    assert derive_task_env(slurm_env() | environ) == env


def hpctrain_torchrun_env(**overrides: str) -> dict[str, str]:
    """Worker 3 (node 1, local rank 1) of hpctrain's torchrun launcher, 2 nodes x 2 processes.

    torchrun's variables over what the worker inherits from its node task: the
    Slurm task of node 1 (one task per node), restarted once by a requeue.
    """
    node_task = slurm_env(
        SLURM_PROCID="1",
        SLURM_NTASKS="2",
        SLURM_LOCALID="0",
        SLURM_NODEID="1",
        SLURM_TASKS_PER_NODE="1(x2)",
        SLURM_RESTART_COUNT="1",
        SLURM_CPUS_PER_TASK="2",
    )
    worker = torchrun_env(
        RANK="3",
        WORLD_SIZE="4",
        LOCAL_RANK="1",
        LOCAL_WORLD_SIZE="2",
        GROUP_RANK="1",
        GROUP_WORLD_SIZE="2",
        MASTER_ADDR="n1",
        MASTER_PORT="23456",
        TORCHELASTIC_RUN_ID="1234",
        TORCHELASTIC_RESTART_COUNT="0",
    )
    env = node_task | worker | {"HPCTRAIN_LAUNCHER": "torchrun"}
    env.update(overrides)
    return {key: value for key, value in env.items() if value != "<unset>"}


def test_hpctrain_torchrun_worker_takes_ranks_from_torchrun_and_the_job_from_slurm() -> None:
    env = derive_task_env(hpctrain_torchrun_env(), spec_master_port=20000)
    assert env.source == "slurm-torchrun" and env.under_slurm
    assert (env.global_rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.num_nodes, env.hostnames, env.hostname) == (1, 2, ("n1", "n2"), "n2")
    assert (env.master_addr, env.master_port) == ("n1", 23456)  # torchrun's store, not the spec's port
    # Slurm's restart count (requeues), not torchrun's (always 0: --max-restarts 0).
    assert (env.job_id, env.slurm_job_id, env.restart_count, env.job_aliases) == ("1234", "1234", 1, ("1234",))


def test_hpctrain_torchrun_worker_names_its_own_node_whatever_order_torchrun_chose() -> None:
    # c10d numbers nodes by sorted address: node1, node10, node2 -- not Slurm's order.
    environ = hpctrain_torchrun_env(
        SLURM_JOB_NODELIST="node[1-3]", SLURM_JOB_NUM_NODES="3", SLURM_NODEID="2", SLURM_TASKS_PER_NODE="1(x3)"
    ) | {"GROUP_WORLD_SIZE": "3", "GROUP_RANK": "1", "RANK": "3", "WORLD_SIZE": "6"}
    env = derive_task_env(environ)
    assert (env.node_rank, env.hostname) == (1, "node3")


def test_hpctrain_torchrun_worker_of_an_array_task() -> None:
    env = derive_task_env(hpctrain_torchrun_env(SLURM_ARRAY_JOB_ID="1200", SLURM_ARRAY_TASK_ID="34"))
    assert (env.job_id, env.slurm_job_id) == ("1200_34", "1200_34")
    assert env.job_aliases == ("1234", "1200", "1200_34")


def test_torchrun_without_hpctrains_marker_stays_plain_torchrun() -> None:
    environ = hpctrain_torchrun_env(HPCTRAIN_LAUNCHER="<unset>")
    assert detect_source(environ) == "torchrun"
    assert not derive_task_env(environ).under_slurm


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"GROUP_WORLD_SIZE": "3", "WORLD_SIZE": "6"}, "GROUP_WORLD_SIZE=3"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2"),
        ({"SLURM_JOB_NODELIST": "<unset>"}, "SLURM_JOB_NODELIST"),
        ({"RANK": "4"}, "RANK=4"),
    ],
)
def test_hpctrain_torchrun_inconsistencies_name_the_variable(overrides: dict[str, str], variable: str) -> None:
    with pytest.raises(DistributedSetupError) as raised:
        derive_task_env(hpctrain_torchrun_env(**overrides))
    assert variable in raised.value.message


def test_rank_hint_of_a_torchrun_worker_is_its_global_rank() -> None:
    from hpctrain.runtime.task_env import rank_hint

    assert rank_hint(hpctrain_torchrun_env()) == "3"
    assert rank_hint(slurm_env()) == "3"

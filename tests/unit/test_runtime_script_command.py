"""What each process of a script job gets (hpctrain/runtime/script/command.py): pure functions over plain data."""

from __future__ import annotations

import pytest

from hpctrain.contract import script_env
from hpctrain.contract.script_env import ScriptCode
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.script.command import (
    command,
    environ,
    layout,
    node_devices,
    placeholder_values,
    plan_commands,
    restart_count,
    stop_timeout_s,
    workdir,
)
from hpctrain.runtime.task_env import derive_task_env

CODE = ScriptCode("/runs/x/code/proj/train.py", None, "/runs/x/code/proj")
# every name but those set only sometimes: the hang timeout (when set), the run's micro-batches (a smaller step)
SOMETIMES = {script_env.HANG_TIMEOUT_VAR, script_env.RUN_MICRO_BATCHES_VAR}
HPCTRAIN_AND_TORCHRUN = {*script_env.HPCTRAIN_VARS, *script_env.TORCHRUN_VARS} - SOMETIMES


def spec(per: str = "rank", **script: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "s",
            "resources": {"nodes": 2, "tasks_per_node": 2},
            "script": {"path": "/p/train.py", "per": per, **script},
        }
    )


def slurm_env(procid: int, ntasks: int, tasks_per_node: str, **extra: str) -> dict[str, str]:
    per_node = int(tasks_per_node.split("(")[0])
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": str(procid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_LOCALID": str(procid % per_node),
        "SLURM_NODEID": str(procid // per_node),
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        **extra,
    }


def test_per_rank_a_process_is_a_rank_with_the_torchrun_environment() -> None:
    job = spec(args=["--rank={rank}", "--local={local_rank}", "tcp://{master_addr}:{master_port}", "{world_size}"])
    env = derive_task_env(slurm_env(3, 4, "2(x2)", SLURM_CPUS_PER_TASK="4", RANK="99"))
    place = layout(env, job)
    values = placeholder_values(place, "/runs/x", CODE, 2)
    assert command("/venv/bin/python", CODE, job.script, values) == [  # type: ignore[arg-type]
        "/venv/bin/python",
        "/runs/x/code/proj/train.py",
        "--rank=3",
        "--local=1",
        f"tcp://n1:{env.master_port}",
        "4",
    ]
    child = environ({"PATH": "/bin", "RANK": "99"}, place, job, run_dir="/runs/x", job_id="4242", restart=2, code=CODE)
    expected = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": str(env.master_port),
        script_env.RUN_DIR_VAR: "/runs/x",
        script_env.CHECKPOINT_DIR_VAR: "/runs/x/checkpoints",
        script_env.RESTART_COUNT_VAR: "2",
        script_env.JOB_ID_VAR: "4242",
        script_env.STOP_SIGNAL_VAR: "TERM",
        script_env.HEARTBEAT_INTERVAL_VAR: "10",
        script_env.HANG_TIMEOUT_VAR: "240",  # 80 % of distributed.timeout_s
        "PYTHONUNBUFFERED": "1",
        "PATH": "/bin",
    }
    assert {key: child.get(key) for key in expected} == expected
    assert child.keys() >= HPCTRAIN_AND_TORCHRUN, "every name of the contract"
    assert "OMP_NUM_THREADS" not in child, "nothing says: the task's environment has no CPU count"


def test_per_node_a_process_has_no_rank_and_counts_its_node() -> None:
    job = spec("node", args=["--world-size", "{nnodes}", "--rank", "{node_rank}", "--nproc", "{nproc_per_node}"])
    env = derive_task_env(slurm_env(1, 2, "1(x2)", SLURM_CPUS_PER_TASK="8"))
    place = layout(env, job)
    values = placeholder_values(place, "/runs/x", CODE, 0)
    assert "rank" not in values and "local_rank" not in values
    assert command("py", CODE, job.script, values)[2:] == ["--world-size", "2", "--rank", "1", "--nproc", "2"]  # type: ignore[arg-type]
    child = environ(
        {"RANK": "0", "LOCAL_RANK": "0", "OMP_NUM_THREADS": "7"},
        place,
        job,
        run_dir="/r",
        job_id="1",
        restart=0,
        code=CODE,
    )
    assert "RANK" not in child and "LOCAL_RANK" not in child, "an inherited rank would mislead the node's process"
    assert (child["WORLD_SIZE"], child["LOCAL_WORLD_SIZE"], child["GROUP_RANK"]) == ("4", "2", "1")
    assert child["OMP_NUM_THREADS"] == "7", "the user's own value wins"
    fresh = environ({"SLURM_CPUS_PER_TASK": "8"}, place, job, run_dir="/r", job_id="1", restart=0, code=CODE)
    assert fresh["OMP_NUM_THREADS"] == "4", "the node's CPUs shared by its workers"


def test_a_local_run_counts_node_tasks_as_nodes() -> None:
    job = spec("node")
    local = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "77", "SUBMITIT_LOCAL_GLOBALID": "1"}
    env = derive_task_env({**local, "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_LOCALID": "1"})
    place = layout(env, job)
    assert (place.node_rank, place.nnodes, place.world_size, place.master_addr) == (1, 2, 4, "127.0.0.1")


def test_a_local_node_sees_its_own_gpus() -> None:
    job = JobSpec.model_validate(
        {
            "name": "s",
            "resources": {"nodes": 2, "tasks_per_node": 2, "gpus_per_node": 2},
            "script": {"path": "/p/train.py", "per": "node"},
        }
    )
    local = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "77", "SUBMITIT_LOCAL_GLOBALID": "1"}
    place = layout(derive_task_env({**local, "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_LOCALID": "1"}), job)
    base = {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"}
    mine = environ(base, place, job, run_dir="/r", job_id="77", restart=0, code=CODE, local=True)
    assert mine["CUDA_VISIBLE_DEVICES"] == "GPU-c,GPU-d", "node 1's mp.spawn workers take cuda:0,1: its own two"
    on_slurm = environ(base, place, job, run_dir="/r", job_id="77", restart=0, code=CODE)
    assert on_slurm["CUDA_VISIBLE_DEVICES"] == base["CUDA_VISIBLE_DEVICES"], "a real node's GPUs are Slurm's"
    assert node_devices("0,1,2", 1, 2) is None, "no full share: left as it is"


def test_a_module_runs_with_its_copy_first_on_pythonpath() -> None:
    job = JobSpec.model_validate({"name": "s", "script": {"module": "pkg.train", "args": ["{script_dir}"]}})
    code = ScriptCode(None, "pkg.train", "/r/code/src/pkg", "/r/code/src")
    env = derive_task_env({})
    place = layout(env, job)
    values = placeholder_values(place, "/r", code, 0)
    assert command("py", code, job.script, values) == ["py", "-m", "pkg.train", "/r/code/src/pkg"]  # type: ignore[arg-type]
    child = environ({"PYTHONPATH": "/mine"}, place, job, run_dir="/r", job_id="1", restart=0, code=code)
    assert child["PYTHONPATH"] == "/r/code/src:/mine"


def test_workdir_defaults_to_the_run_directory_and_may_use_placeholders() -> None:
    values = {"run_dir": "/r", "rank": "2"}
    assert workdir(spec().script, values, "/r") == "/r"  # type: ignore[arg-type]
    assert workdir(spec(workdir="{run_dir}/rank{rank}").script, values, "/r") == "/r/rank2"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("job_ids", "job_id", "slurm", "steps", "expected"),
    [
        (["10"], "10", 0, 0, 0),
        (["10"], "10", 2, 0, 2),  # two requeues
        (["10", "11"], "11", 0, 0, 1),  # a resume
        (["10"], "11", 0, 0, 1),  # the resume's id not recorded yet: it comes after the recorded ones
        (None, "10", 0, 1, 1),  # run.json unreadable; a healing job's second step
        (["5_0", "5_1"], "5_1", 1, 0, 2),
    ],
)
def test_restart_count(job_ids: object, job_id: str, slurm: int, steps: int, expected: int) -> None:
    assert restart_count(job_ids, job_id, slurm, steps) == expected


def test_stop_timeouts() -> None:
    job = spec()
    assert stop_timeout_s("timeout", job, None) == 105  # signal_delay_s 120 - 15 for the requeue
    assert stop_timeout_s("preempted", job, 60) == 55  # GraceTime - 5
    assert stop_timeout_s("preempted", job, 5) is None, "too short to cut: Slurm ends it"
    assert stop_timeout_s("preempted", job, None) is None
    assert stop_timeout_s("cancelled", job, 60) is None, "KillWait bounds a cancel"
    own = spec(stop_timeout_s=30)
    assert [stop_timeout_s(reason, own, 60) for reason in ("timeout", "preempted", "cancelled")] == [30, 30, 30]


def test_the_dry_runs_plan_names_every_process() -> None:
    rows = plan_commands(spec(args=["{rank}@{master_addr}:{master_port}"]), "/r", CODE, "py")
    assert [(who, folder, argv[-1]) for who, folder, argv in rows] == [
        ("rank 0 (node0)", "/r", "0@node0:<port from job id>"),
        ("rank 1 (node0)", "/r", "1@node0:<port from job id>"),
        ("rank 2 (node1)", "/r", "2@node0:<port from job id>"),
        ("rank 3 (node1)", "/r", "3@node0:<port from job id>"),
    ]
    per_node = plan_commands(spec("node", args=["{node_rank}/{nnodes}"]), "/r", CODE, "py")
    assert [(who, argv[-1]) for who, _, argv in per_node] == [("node 0 (node0)", "0/2"), ("node 1 (node1)", "1/2")]

"""``hpctrain bench-data --slurm``'s job (launch/bench_job.py): its sbatch options, the report back from the
node, the node's user error, a silent job and one that does not end in time."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from hpctrain.contract import slurm
from hpctrain.diagnose import data_bench_job
from hpctrain.diagnose.data_bench import BenchReport, Demand, ReadResult
from hpctrain.diagnose.data_bench_job import BenchOptions
from hpctrain.errors import ClusterError, HpctrainError
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import BUILTIN_PROFILES, apply_profile
from hpctrain.launch.bench_job import bench_sbatch_options, run_on_slurm
from tests.fake_slurm import FakeSlurm


def test_bench_job_is_one_task_with_at_most_one_gpu_and_no_requeue(tmp_path: Path) -> None:
    hal = BUILTIN_PROFILES["hal"]
    spec = apply_profile(JobSpec.model_validate({"name": "big", "cluster": "hal", "resources": {"nodes": 4}}), hal)
    options = dict(bench_sbatch_options(spec, hal, tmp_path))
    assert options["gres"] == "gpu:v100:1" and options["cpus-per-task"] == 40 and options["partition"] == "gpu"
    assert not {"requeue", "signal", "nodes", "ntasks-per-node"} & set(options)
    command = slurm.sbatch_wrap_command(
        job_name="big-bench-data", wrap="true", output=tmp_path / "o", time_min=10, options=list(options.items())
    )
    assert {"--nodes=1", "--ntasks=1", "--time=10", "--no-requeue", "--gres=gpu:v100:1"} <= set(command)


def bench_report(**changes: object) -> dict:
    report = BenchReport(
        spec="s.yaml", decoder="cpu", read=ReadResult("/d/train", 30, 30_000, 0.5), stage_read=None,
        decode_img_s_per_core=120.0, decode_note="", cores_per_gpu=1, cores_source="SLURM_CPUS_PER_TASK",
        gpus_per_node=0, gpu="v100", demand=Demand(1200.0, "table"),
    )  # fmt: skip
    return {**report.as_dict(), **changes}


def node_answers(tmp_path: Path, result: dict | None, state: str = "COMPLETED") -> FakeSlurm:
    """sbatch writes what the node would have printed into the job's output file; the job then ends."""
    fake = FakeSlurm()

    def sbatch(argv: list[str]) -> tuple[int, str]:
        output = Path(next(a for a in argv if a.startswith("--output=")).split("=", 1)[1].replace("%j", "91"))
        lines = ["loading...", *([data_bench_job.MARKER + json.dumps(result)] if result is not None else [])]
        output.write_text("\n".join(lines) + "\n")
        fake.jobs["91"] = state
        return 0, "91\n"

    fake.answers["sbatch"] = sbatch
    return fake


def slurm_job(tmp_path: Path):  # type: ignore[no-untyped-def]
    spec = JobSpec.model_validate({"name": "b", "cluster": "slurm", "output_dir": str(tmp_path / "runs")})
    return apply_profile(spec, BUILTIN_PROFILES["slurm"]), BUILTIN_PROFILES["slurm"]


def test_bench_on_slurm_is_a_wrapped_job_whose_report_comes_back(tmp_path: Path) -> None:
    spec, profile = slurm_job(tmp_path)
    fake = node_answers(tmp_path, bench_report())
    report = run_on_slurm(spec, profile, BenchOptions(gpu="v100"), "s.yaml", timeout_s=60, slurm=fake.client())
    assert report.as_dict() == bench_report() and report.verdict().startswith("data keeps up: no")
    (sbatch,) = fake.asked("sbatch")
    wrap = sbatch[sbatch.index("--wrap") + 1]
    assert "-m hpctrain.runtime.cleanup exec" in wrap and "-m hpctrain.diagnose.data_bench_job --request" in wrap
    request = json.loads(Path(shlex.split(wrap.splitlines()[-1])[-1]).read_text())
    assert request["options"]["gpu"] == "v100" and request["spec"]["name"] == "b"


def test_bench_on_slurm_returns_the_nodes_user_error_and_a_silent_job_as_a_cluster_error(tmp_path: Path) -> None:
    spec, profile = slurm_job(tmp_path)
    error = {"error": "--measure-gpu: this machine has no CUDA GPU", "hint": "add --slurm", "exit_code": 2}
    with pytest.raises(HpctrainError, match="on the compute node: --measure-gpu") as raised:
        run_on_slurm(
            spec, profile, BenchOptions(), "s.yaml", timeout_s=60, slurm=node_answers(tmp_path, error).client()
        )
    assert raised.value.exit_code == 2
    silent = node_answers(tmp_path, None, state="FAILED")
    with pytest.raises(ClusterError, match=r"bench-data job 91 failed \(FAILED\): loading"):
        run_on_slurm(spec, profile, BenchOptions(), "s.yaml", timeout_s=60, slurm=silent.client())


def test_bench_on_slurm_cancels_a_job_that_does_not_end_in_time(tmp_path: Path) -> None:
    spec, profile = slurm_job(tmp_path)
    fake = node_answers(tmp_path, bench_report(), state="PENDING")
    with pytest.raises(ClusterError, match="did not finish within 0 s; cancelled it"):
        run_on_slurm(spec, profile, BenchOptions(), "s.yaml", timeout_s=0, slurm=fake.client())
    assert fake.asked("scancel") == [["scancel", "91"]]

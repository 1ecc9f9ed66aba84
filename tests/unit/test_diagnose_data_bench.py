"""``hpctrain bench-data``: the verdict from plain numbers, the demand table, cores per GPU, and the real
command here (plain, a missing data.root; --json and the stage disk in this process); the one-task Slurm job:
test_launch_bench_job.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import in_process

from hpctrain.dataset.generate import make_dataset
from hpctrain.diagnose.data_bench import (
    BenchReport,
    Demand,
    ReadResult,
    cores_needed,
    cores_per_gpu,
    gpu_type,
    gpu_type_from_name,
    image_files,
    read_throughput,
    render_plain,
    table_demand,
)
from hpctrain.errors import UsageError
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import BUILTIN_PROFILES, apply_profile

REPO = Path(__file__).resolve().parents[2]


def _report(**changes: object) -> BenchReport:
    values: dict[str, object] = {
        "spec": "job.yaml",
        "decoder": "cpu",
        "read": ReadResult("/data/train", 1000, 110_000_000, 1.0),  # 110 MB/s, 110 kB per file
        "stage_read": None,
        "decode_img_s_per_core": 250.0,
        "decode_note": "",
        "cores_per_gpu": 10,
        "cores_source": "resources.cpus_per_task",
        "gpus_per_node": 4,
        "gpu": "v100",
        "demand": Demand(1200.0, "table"),
    }
    values.update(changes)
    return BenchReport(**values)  # type: ignore[arg-type]


def test_verdict_counts_worker_cores_plus_the_training_process() -> None:
    report = _report()
    assert cores_needed(1200.0, 250.0) == 6 and report.cores_needed_per_gpu == 6
    assert report.keeps_up is False  # 4 GPUs x 1200 img/s x 110 kB = 528 MB/s, but the disk gives 110
    assert report.read_needed_mb_s == pytest.approx(528.0)
    fast_disk = _report(stage_read=ReadResult("/local", 1000, 900_000_000, 1.0))
    assert fast_disk.keeps_up is True and fast_disk.verdict() == "data keeps up: yes; cores needed per GPU: 6"
    assert _report(cores_per_gpu=5, stage_read=fast_disk.stage_read).keeps_up is False
    unknown = _report(demand=Demand(None, "unknown GPU model"))
    assert unknown.keeps_up is None and unknown.verdict() == "data keeps up: unknown; cores needed per GPU: unknown"


def test_a_slow_gpu_decoder_is_a_no() -> None:
    report = _report(decoder="gpu", gpu_decode_img_s=900.0, stage_read=ReadResult("/local", 10, 10**10, 1.0))
    assert report.keeps_up is False


def test_json_document_has_the_verdict_and_the_numbers() -> None:
    data = json.loads(json.dumps(_report().as_dict()))
    assert data["keeps_up"] is False and data["cores_needed_per_gpu"] == 6
    assert data["read"]["mb_per_s"] == 110.0 and data["demand"]["img_s_per_gpu"] == 1200.0
    assert data["verdict"].startswith("data keeps up: no")


def test_plain_output_is_one_line_per_figure_and_the_verdict_last() -> None:
    text = render_plain(_report())
    assert text.splitlines()[-1] == "data keeps up: no; cores needed per GPU: 6"
    assert "read from data.root: 110.0 MB/s" in text and "GPU demand: 1200 img/s per GPU" in text


@pytest.mark.parametrize(
    ("args", "rate", "needle"),
    [
        (("h100", "resnet50", "fp16", True, 224), 3826.3, "table: h100 resnet50 fp16 channels-last"),
        (("h100", "resnet50", "bf16", False, 224), 2154.7, "bf16"),
        (("V100", "resnet50", "fp16", False, 224), 1200.0, "v100 resnet50 mixed"),
        (("v100", "resnet50", "O2", True, 224), 1200.0, "mixed"),
        (("a100", "resnet50", "fp32", False, 224), 938.0, "a100 resnet50 fp32"),
        (("v100", "resnet18", "fp32", True, 224), 367.0 * 4.09 / 1.81, "scaled by FLOPs"),
        (("v100", "resnet50", "fp32", True, 112), 367.0 * 4, "scaled"),
    ],
)
def test_demand_table(args: tuple, rate: float, needle: str) -> None:
    demand = table_demand(*args)
    assert demand.img_s_per_gpu == pytest.approx(rate) and needle in demand.source


@pytest.mark.parametrize("args", [("k80", "resnet50", "fp32", False), ("v100", "convnext_tiny", "fp16", True)])
def test_demand_outside_the_table_says_what_to_do(args: tuple) -> None:
    demand = table_demand(*args)
    assert demand.img_s_per_gpu is None and "--measure-gpu" in demand.source and "--demand" in demand.source


def test_gpu_model_comes_from_the_profile_or_the_device_name() -> None:
    hal = BUILTIN_PROFILES["hal"]
    spec = apply_profile(JobSpec(name="a", cluster="hal"), hal)
    assert gpu_type(spec, hal) == "v100"
    assert gpu_type(apply_profile(JobSpec(name="a"), BUILTIN_PROFILES["slurm"]), BUILTIN_PROFILES["slurm"]) is None
    constrained = JobSpec.model_validate({"name": "a", "resources": {"constraint": "a100&ib"}})
    assert gpu_type(constrained, BUILTIN_PROFILES["slurm"]) == "a100"
    assert gpu_type_from_name("NVIDIA H100 80GB HBM3") == "h100" and gpu_type_from_name("Tesla T4") is None


def test_cores_per_gpu() -> None:
    hal = BUILTIN_PROFILES["hal"]
    ddp = apply_profile(JobSpec(name="a", cluster="hal"), hal)  # 4 tasks x 40 cpus
    assert cores_per_gpu(ddp, {}, 2) == (40, "resources.cpus_per_task")
    dp = apply_profile(JobSpec.model_validate({"name": "a", "cluster": "hal", "trainer": {"strategy": "dp"}}), hal)
    per_gpu, source = cores_per_gpu(dp, {}, 2)
    assert per_gpu == 10 and "4 GPUs per task" in source
    assert cores_per_gpu(ddp, {"SLURM_CPUS_PER_TASK": "8"}, 2) == (8, "SLURM_CPUS_PER_TASK")
    local = JobSpec(name="a")
    assert cores_per_gpu(local, {}, 3)[0] == 3


def test_files_are_taken_round_robin_over_classes(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(3):
            (tmp_path / name / f"{i}.jpg").write_bytes(b"x" * 10)
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    picked = list(image_files(tmp_path, 4))
    assert sorted(p.parent.name for p in picked) == ["a", "a", "b", "b"]
    result = read_throughput(tmp_path, max_files=10)
    assert result.files == 6 and result.bytes == 60 and result.mb_per_s > 0


# --- the command, in a subprocess like a user runs it ------------------------------------------------------------


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench") / "ds"
    make_dataset(root, classes=2, per_class=6, val_per_class=2, image_size=40)
    return root


def _bench_here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The command in this process (with the ``isolated`` fixture): a child would import torch and torchvision
    again (~5 CPU s, most of such a test's); the plain test below runs the real command as a child."""
    return in_process(capsys, "bench-data", str(REPO / "jobs" / "quickstart.yaml"), *args)


def _bench(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCTRAIN_CONFIG_DIR": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "state")}
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "bench-data", "jobs/quickstart.yaml", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_bench_data_prints_figures_and_the_verdict(data_root: Path, tmp_path: Path) -> None:
    done = _bench("--set", f"data.root={data_root}", "--gpu", "v100", "--seconds", "2", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("data keeps up: ") and "cores needed per GPU: " in lines[-1]
    assert any(line.startswith("  read from data.root: ") for line in lines)
    assert any("decode+augment (cpu):" in line for line in lines)


@pytest.mark.usefixtures("isolated")
def test_bench_data_json(data_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = _bench_here(capsys, "--set", f"data.root={data_root}", "--demand", "100", "--json", "--seconds", "2")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["demand"] == {"img_s_per_gpu": 100.0, "source": "--demand"}
    assert data["read"]["files"] == 12 and data["decoder"] == "cpu" and data["decode_img_s_per_core"] > 0
    assert isinstance(data["keeps_up"], bool) and data["cores_needed_per_gpu"] >= 2


def test_bench_data_with_a_missing_data_root_is_a_clear_error(tmp_path: Path) -> None:
    done = _bench("--set", f"data.root={tmp_path / 'nowhere'}", tmp=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "data.root" in done.stderr and "does not exist" in done.stderr and "hint:" in done.stderr


def test_bench_data_slurm_without_slurm_says_so(data_root: Path, tmp_path: Path) -> None:
    done = _bench("--set", f"data.root={data_root}", "--slurm", tmp=tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr and "--slurm" in done.stderr


@pytest.mark.usefixtures("isolated")
def test_bench_data_measures_the_stage_disk_and_leaves_nothing_there(
    data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stage = tmp_path / "local-disk"
    args = ["--set", f"data.root={data_root}", "--stage-dir", str(stage), "--demand", "100", "--json"]
    done = _bench_here(capsys, *args, "--seconds", "2")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["stage_read"]["files"] == 12 and data["stage_read"]["path"].startswith(str(stage))
    assert not stage.exists()  # it created the missing folder for the sample and removed it again


@pytest.mark.usefixtures("isolated")
def test_bench_data_with_data_stage_node_does_not_stage_the_dataset(
    data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stage = tmp_path / "node-local"
    args = ["--set", f"data.root={data_root}", "--set", "data.stage=node", "--set", f"data.stage_dir={stage}"]
    done = _bench_here(capsys, *args, "--demand", "100", "--json", "--seconds", "2")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stage_read"]["files"] == 12
    assert not stage.exists()  # a sample was copied, read back and removed; no staged copy, no folder left


def test_stage_dir_under_a_missing_parent_is_refused_and_nothing_is_created(data_root: Path, tmp_path: Path) -> None:
    """--stage-dir made any missing tree and left it (issue 19): only the last folder may be missing."""
    from hpctrain.diagnose.data_bench import stage_read_throughput

    with pytest.raises(UsageError, match="does not exist") as info:
        stage_read_throughput(data_root / "train", tmp_path / "typo" / "deep" / "stage", max_files=4, max_s=5)
    assert "--stage-dir" in (info.value.hint or "")
    assert not (tmp_path / "typo").exists()


def test_an_existing_stage_dir_is_kept_and_left_as_it_was(data_root: Path, tmp_path: Path) -> None:
    from hpctrain.diagnose.data_bench import stage_read_throughput

    stage = tmp_path / "scratch"
    stage.mkdir()
    (stage / "mine.txt").write_text("keep")
    result = stage_read_throughput(data_root / "train", stage, max_files=4, max_s=5)
    assert result.files == 4 and [p.name for p in stage.iterdir()] == ["mine.txt"]


def test_an_unwritable_stage_dir_is_one_message() -> None:
    from hpctrain.diagnose.data_bench import stage_read_throughput

    with pytest.raises(UsageError, match="cannot write there"):
        stage_read_throughput(Path("/nonexistent-src"), Path("/sys/hpctrain-stage"), max_files=1, max_s=1)
    assert not Path("/sys/hpctrain-stage").exists()

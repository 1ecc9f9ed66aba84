"""The single-device trainer end to end: metrics, TensorBoard, summary, evaluate-only, early stop, bf16."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_harness import job_spec, read_jsonl, train

from hpctrain.contract.rundir import checkpoints_dir, metrics_path, summary_path, tb_dir
from hpctrain.errors import TrainingConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

SUMMARY_KEYS = {
    "status",
    "world_size",
    "num_nodes",
    "hostnames",
    "strategy",
    "precision",
    "epochs_completed",
    "global_step",
    "train_top1",
    "val_top1",
    "val_top5",
    "best_val_top1",
    "train_images_per_s",
    "data_wait_fraction",
    "wall_s",
    "restarts",
    "weights_sha256",
    "arch",
    "job_id",
    "stop_reason",
    "started_at",
    "updated_at",
}


@pytest.fixture(scope="module")
def finished_run(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("run")
    spec = job_spec(data_root, trainer={"epochs": 2, "max_steps_per_epoch": 3, "log_every_steps": 2})
    torch.set_num_threads(1)
    return run_dir, train(run_dir, spec)


def test_trains_and_writes_a_sane_summary(finished_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, result = finished_run
    summary = json.loads(summary_path(run_dir).read_text())
    assert summary.keys() >= SUMMARY_KEYS
    assert summary == result
    assert summary["status"] == "completed" and summary["stop_reason"] is None
    assert summary["epochs_completed"] == 2 and summary["global_step"] == 6
    assert (summary["world_size"], summary["num_nodes"], summary["strategy"]) == (1, 1, "single")
    assert summary["arch"] == "resnet18" and summary["job_id"] == "4242" and summary["restarts"] == 0
    assert 0 <= summary["val_top1"] <= summary["val_top5"] <= 100 and summary["val_top5"] == 100  # 4 classes
    assert summary["best_val_top1"] >= summary["val_top1"]
    assert summary["train_images_per_s"] > 0 and summary["wall_s"] > 0
    assert 0 <= summary["data_wait_fraction"] <= 1
    assert len(summary["weights_sha256"]) == 64


def test_metrics_jsonl_lines(finished_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, _ = finished_run
    records = read_jsonl(metrics_path(run_dir))
    kinds = [r["kind"] for r in records]
    assert kinds.count("epoch") == 2 and kinds.count("val") == 2
    steps = [r for r in records if r["kind"] == "train_step"]
    assert [r["global_step"] for r in steps] == [2, 3, 5, 6]  # every 2 steps and at each epoch's end
    for record in steps:
        keys = {"epoch", "step", "loss", "lr", "top1", "top5", "images_per_s", "data_s", "step_s", "time"}
        assert keys | {"data_wait_fraction"} <= set(record)
        assert record["loss"] > 0 and record["lr"] > 0 and record["step_s"] > 0
        assert 0 <= record["data_wait_fraction"] <= 1
    for record in (r for r in records if r["kind"] == "epoch"):
        assert 0 <= record["data_wait_fraction"] <= 1
    val = [r for r in records if r["kind"] == "val"]
    assert val[-1]["top1"] == json.loads(summary_path(run_dir).read_text())["val_top1"]


def test_tensorboard_events_readable(finished_run: tuple[Path, dict[str, Any]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = finished_run
    events = EventAccumulator(str(tb_dir(run_dir)))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {
        "train/loss",
        "train/lr",
        "train/top1",
        "train/top5",
        "val/top1",
        "val/top5",
        "perf/images_per_s",
        "perf/data_s",
        "perf/step_s",
        "perf/data_wait_fraction",
    }
    assert expected <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [2, 3, 5, 6]
    assert [e.step for e in events.Scalars("val/top1")] == [3, 6]


def test_checkpoints_kept(finished_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, _ = finished_run
    names = sorted(p.name for p in checkpoints_dir(run_dir).iterdir())
    assert "step-00000006" in names and not any(n.startswith(".tmp") for n in names)


def test_evaluate_only_reproduces_the_final_validation(
    finished_run: tuple[Path, dict[str, Any]], data_root: Path, tmp_path: Path
) -> None:
    run_dir, result = finished_run
    spec = job_spec(data_root, trainer={"epochs": 2, "evaluate_only": True})
    evaluated = train(run_dir, spec)
    assert evaluated["status"] == "completed"
    assert evaluated["val_top1"] == result["val_top1"] and evaluated["val_top5"] == result["val_top5"]
    assert evaluated["weights_sha256"] == result["weights_sha256"] and evaluated["global_step"] == 6

    with pytest.raises(TrainingConfigError, match="evaluate_only"):
        train(tmp_path / "empty", spec)  # nothing to evaluate
    assert json.loads(summary_path(tmp_path / "empty").read_text())["status"] == "failed"


def test_desired_accuracy_stops_early(data_root: Path, tmp_path: Path) -> None:
    spec = job_spec(data_root, trainer={"epochs": 5, "max_steps_per_epoch": 2, "desired_acc": 0.01})
    result = train(tmp_path, spec)
    assert result["status"] == "completed" and result["stop_reason"] == "desired_acc"
    assert result["epochs_completed"] == 1 and result["global_step"] == 2
    assert (checkpoints_dir(tmp_path) / "step-00000002" / "meta.json").is_file()


def test_bf16_on_cpu_trains(data_root: Path, tmp_path: Path) -> None:
    spec = job_spec(data_root, trainer={"precision": "bf16", "max_steps_per_epoch": 2, "channels_last": True})
    result = train(tmp_path, spec)
    assert result["status"] == "completed" and result["precision"] == "bf16" and result["global_step"] == 2
    assert result["train_loss"] > 0


def test_failure_writes_failed_summary(data_root: Path, tmp_path: Path) -> None:
    spec = job_spec(tmp_path / "no-such-dataset")
    with pytest.raises(TrainingConfigError, match="data.root"):
        train(tmp_path / "run", spec)
    summary = json.loads(summary_path(tmp_path / "run").read_text())
    assert summary["status"] == "failed" and "data.root" in summary["error"]
    assert summary["failed_rank"] == 0 and summary["failed_node"] == "localhost"


def test_wrong_strategy_for_the_task_layout_is_refused(data_root: Path, tmp_path: Path) -> None:
    from trainer_harness import context

    from hpctrain.trainer.trainer import Trainer

    spec = job_spec(data_root)
    with pytest.raises(TrainingConfigError, match="trainer.strategy"):
        Trainer(context(tmp_path, spec, world_size=2)).fit()


def test_plain_progress_lines_and_accumulated_wall_time(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from hpctrain.trainer.reporting import Reporter

    summary_path(tmp_path).write_text(json.dumps({"wall_s": 100.0, "restarts": 1, "started_at": "earlier"}))
    reporter = Reporter(tmp_path, enabled=True, static={"arch": "resnet50"})
    reporter.start(epochs=90, steps_per_epoch=5005, global_step=10_130, resumed=True)
    values = {
        "loss": 2.34123,
        "lr": 0.1,
        "top1": 45.123,
        "top5": 70.0,
        "images_per_s": 1234.54,
        "data_s": 0.01,
        "step_s": 0.2,
        "data_wait_fraction": 0.123,
    }
    reporter.train_step(epoch=2, step=120, global_step=10_130, values=values, steps=10)
    summary = reporter.summary("running", {"global_step": 10_130})
    reporter.close()
    line = capsys.readouterr().out.strip().splitlines()[-1]
    expected = r"epoch 3/90 step 120/5005 loss 2\.3412 top1 45\.12 img/s 1234\.5 data-wait 12% eta \d+:\d\d:\d\d"
    assert re.fullmatch(expected, line)
    assert summary["wall_s"] >= 100.0 and summary["started_at"] == "earlier" and summary["arch"] == "resnet50"
    assert json.loads(summary_path(tmp_path).read_text()) == summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "summary.json", "tb"]


def test_bad_images_are_skipped_and_counted_in_the_summary(data_root: Path, tmp_path: Path) -> None:
    import shutil

    data = tmp_path / "data"
    shutil.copytree(data_root, data)
    for split in ("train", "val"):
        victims = sorted((data / split).rglob("*.jpg"))[:2]
        victims[0].write_bytes(victims[0].read_bytes()[:100])  # truncated
        victims[1].write_text("not a jpeg")
    spec = job_spec(data, trainer={"epochs": 1})
    result = train(tmp_path / "run", spec)
    assert result["status"] == "completed" and result["skipped_samples"] >= 2  # at least the 2 val files
    assert json.loads(summary_path(tmp_path / "run").read_text())["skipped_samples"] == result["skipped_samples"]


def _png_bomb() -> bytes:
    """A valid PNG header (IHDR, correct CRC) claiming 65000 x 65000: 12.7 GB decoded, 80 bytes on disk."""
    import io
    import struct
    import zlib

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, "PNG")
    data = out.getvalue()
    chunk = b"IHDR" + struct.pack(">II", 65000, 65000) + data[24:29]
    return data[:8] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + data[33:]


def test_image_bombs_are_skipped_in_training_and_left_out_of_validation(data_root: Path, tmp_path: Path) -> None:
    import resource
    import shutil

    data = tmp_path / "data"
    shutil.copytree(data_root, data)
    for split in ("train", "val"):
        for folder in sorted(p for p in (data / split).iterdir() if p.is_dir()):
            (folder / "bomb.png").write_bytes(_png_bomb())
    spec = job_spec(data, trainer={"epochs": 1})
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(Path("/proc/self/status").read_text().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 3 * 2**30, hard))  # a regression fails here, not the machine
    try:
        result = train(tmp_path / "run", spec)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    classes = len(list((data / "val").iterdir()))
    assert result["status"] == "completed" and result["skipped_samples"] >= classes
    [val] = [r for r in read_jsonl(metrics_path(tmp_path / "run")) if r.get("kind") == "val"]
    assert val["skipped"] == classes  # each val bomb left out once, none replaced by an image scored twice


def test_a_stop_before_the_first_step_saves_nothing_and_the_next_start_counts_a_restart(
    data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A stop that came during set-up (issue 30): no checkpoint of an untrained model, one restart after."""
    from trainer_harness import context

    from hpctrain.trainer.trainer import Trainer

    spec = job_spec(data_root)
    ctx = context(tmp_path, spec)
    ctx.stop.request("preempted")
    stopped = Trainer(ctx).fit()
    assert (stopped["status"], stopped["stop_reason"], stopped["global_step"]) == ("stopped", "preempted", 0)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())
    assert "stopping (preempted) at epoch 1 step 0; before training: nothing new to save" in capsys.readouterr().out
    resumed = train(tmp_path, spec)
    assert (resumed["status"], resumed["global_step"], resumed["restarts"]) == ("completed", 3, 1)

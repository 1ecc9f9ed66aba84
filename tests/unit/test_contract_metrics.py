"""The run directory's records as the contract defines them: metrics.jsonl, the cancel marker, log and folder names."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpctrain.contract import cancel_marker, metrics, rundir
from hpctrain.contract.metrics import MetricsTail, append_metrics, parse_metric_line, parse_metric_lines
from hpctrain.contract.rundir import code_dir, metrics_path
from hpctrain.observe.report.load import parse_metrics


def test_one_writer_appends_whole_lines_that_the_one_reader_reads(tmp_path: Path) -> None:
    append_metrics(tmp_path, {"kind": "train_step", "epoch": 0, "step": 1, "global_step": 1, "loss": 2.5}, now=10.0)
    append_metrics(tmp_path, {"kind": "gpu", "rank": 0, "global_step": 1, "util": 97.0}, now=11.0)
    lines = rundir.metrics_path(tmp_path).read_bytes().splitlines(keepends=True)
    assert len(lines) == 2 and all(line.endswith(b"\n") for line in lines)
    records, notes = parse_metric_lines(lines)
    assert [r["kind"] for r in records] == ["train_step", "gpu"] and records[0]["time"] == 10.0 and notes == []


def test_the_report_leaves_out_gpu_samples_without_calling_them_unreadable(tmp_path: Path) -> None:
    append_metrics(tmp_path, {"kind": "gpu", "rank": 0, "global_step": 1, "util": 97.0}, now=11.0)
    append_metrics(tmp_path, {"kind": "train_step", "epoch": 0, "step": 1, "global_step": 1}, now=12.0)
    records, notes = parse_metrics(rundir.metrics_path(tmp_path).read_text())
    assert [r["kind"] for r in records] == ["train_step"] and notes == []


def test_one_set_of_rules_for_a_line() -> None:
    assert parse_metric_line(b"not json\n") == (None, 0)
    assert parse_metric_line(b'{"kind": "foreign", "global_step": 1}\n') == (None, 0)
    assert parse_metric_line(b'{"kind": "train_step", "loss": 1.0}\n') == (None, 0)  # which step?
    record, dropped = parse_metric_line(b'{"kind": "train_step", "global_step": 3, "loss": NaN, "lr": 1e300}\n')
    assert record is not None and record["loss"] is None and record["lr"] is None and dropped == 2
    _, notes = parse_metric_lines([b'{"kind": "val", "epoch": 1}\n'])  # the report needs a time
    assert notes == ["metrics.jsonl: skipped 1 unreadable line"]


def test_the_tail_reads_regular_files_only(tmp_path: Path) -> None:
    fifo = metrics_path(tmp_path)
    os.mkfifo(fifo)
    tail = MetricsTail(fifo)
    tail.read()  # returns at once: a FIFO is never opened for reading
    assert list(tail.steps) == [] and tail.offset == 0


def test_the_tail_skips_garbage_and_reads_a_bounded_end(tmp_path: Path) -> None:
    path = rundir.metrics_path(tmp_path)
    with path.open("w") as handle:
        handle.write("garbage\n" * 1000)
        for step in range(1, 4):
            handle.write(json.dumps({"kind": "train_step", "global_step": step, "time": step}) + "\n")
    tail = MetricsTail(path, first_read_bytes=4096)
    tail.read()
    assert [r["global_step"] for r in tail.steps] == [1, 2, 3] and tail.offset == path.stat().st_size
    assert metrics.FIRST_READ_BYTES == 1 << 20


def test_the_cancel_marker_belongs_to_the_contract(tmp_path: Path) -> None:
    path = cancel_marker.write_cancel_marker(tmp_path, ["12", "7"])
    assert path == rundir.cancel_marker_path(tmp_path)
    assert json.loads(path.read_text())["job_ids"] == ["12", "7"]
    assert cancel_marker.marker_applies(path, ["7"]) and not cancel_marker.marker_applies(path, ["8"])


def test_names_of_the_run_directory(tmp_path: Path) -> None:
    assert rundir.task_log_name("%j", "%t", err=False) == "%j_%t_log.out"
    assert rundir.task_log_path(tmp_path, {"job_id": "5"}, 0, err=True).name == "5_0_log.err"
    trial = rundir.trial_dir(tmp_path, 3)
    assert rundir.is_trial_dir(trial) and rundir.run_home(trial) == tmp_path and rundir.run_home(tmp_path) == tmp_path
    assert not rundir.is_trial_dir(tmp_path / "trial-x")
    assert rundir.code_dir(tmp_path) == code_dir(tmp_path)


def test_one_cpu_share_rule_for_tasks_torchrun_workers_and_bench_data() -> None:
    from hpctrain.contract.cpu_share import cpu_share, omp_num_threads, slurm_cpus_per_task

    slurm = {"SLURM_CPUS_PER_TASK": "16"}
    assert slurm_cpus_per_task(slurm) == 16 and slurm_cpus_per_task({"SLURM_CPUS_PER_TASK": "0"}) is None
    assert omp_num_threads(slurm) == "16" and omp_num_threads(slurm, sharers=4) == "4"
    assert omp_num_threads({**slurm, "OMP_NUM_THREADS": "2"}, sharers=4) is None  # the user's own setting wins
    assert cpu_share(3, 8) == 1 and cpu_share(8, 0) == 8
    local = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2"}
    assert omp_num_threads(local, cpu_count=8) == "4" and omp_num_threads(local) is None

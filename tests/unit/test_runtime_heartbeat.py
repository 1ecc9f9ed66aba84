"""The heartbeat recorder and writer thread's rounds, driven by a fake clock (no sleeps)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from hpctrain.contract.heartbeat_files import Heartbeat, read_heartbeats
from hpctrain.contract.rundir import heartbeat_path, metrics_path
from hpctrain.runtime import gpu_monitor, heartbeat
from hpctrain.runtime.heartbeat import Monitor, Recorder


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


IDENTITY = {"rank": 3, "node": "n2", "pid": 42, "job_id": "77"}


def monitor(run_dir: Path, rec: Recorder, clock: Clock, **kwargs: object) -> Monitor:
    return Monitor(run_dir, dict(IDENTITY), interval_s=10.0, recorder=rec, clock=clock, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- recorder


def test_phase_and_step_changes_are_recorded_with_their_times() -> None:
    clock = Clock()
    rec = Recorder(clock)
    assert (rec.phase_name, rec.step_no, rec.armed) == ("setup", 0, False)

    clock.now = 1001.0
    rec.set_phase("data")
    rec.set_phase("data")  # no change: not progress
    assert (rec.phase_name, rec.phase_since, rec.changes) == ("data", 1001.0, 1)

    clock.now = 1002.0
    rec.step(1, epoch=0)
    clock.now = 1002.5
    rec.step(2, epoch=0)
    clock.now = 1004.0
    rec.step(3, epoch=0)
    assert rec.armed and rec.step_no == 3 and rec.last_progress == 1004.0
    snap = rec.snapshot()
    assert snap["recent_step_times_s"] == [0.5, 1.5]  # the first step has no start to measure from
    assert snap["step_time_median_s"] == 1.0
    assert (snap["epoch"], snap["phase"], snap["step"]) == (0, "data", 3)


def test_a_beat_is_progress_with_its_time() -> None:
    """A validation batch moves ``last_progress``: the hang report tells a rank whose validation went on
    from one that never got a batch."""
    clock = Clock()
    rec = Recorder(clock)
    rec.step(2)
    clock.now = 1010.0
    rec.set_phase("validation")
    changes = rec.changes
    clock.now = 1012.0
    rec.beat()
    assert (rec.last_progress, rec.changes, rec.step_no) == (1012.0, changes + 1, 2)
    assert rec.snapshot()["last_progress"] == 1012.0


def test_a_resume_position_is_not_progress_and_does_not_arm() -> None:
    rec = Recorder(Clock())
    rec.position(500, epoch=4)
    assert (rec.step_no, rec.epoch, rec.armed, rec.changes) == (500, 4, False, 0)
    rec.step(500)  # the same step again: nothing happened
    assert not rec.armed


def test_beat_is_progress_without_a_step() -> None:
    rec = Recorder(Clock())
    rec.beat()
    rec.beat()
    assert rec.changes == 2 and rec.step_no == 0


def test_the_phase_context_restores_the_previous_phase() -> None:
    rec = heartbeat.recorder()
    heartbeat.set_phase("forward_backward")
    with heartbeat.phase("allreduce"):
        assert rec.phase_name == "allreduce"
    assert rec.phase_name == "forward_backward"
    heartbeat.set_phase("setup")


def test_the_recent_step_times_are_bounded() -> None:
    clock = Clock()
    rec = Recorder(clock)
    for n in range(1, 100):
        clock.now += 0.1
        rec.step(n)
    assert len(rec.snapshot()["recent_step_times_s"]) == heartbeat.RECENT_STEPS


# ---------------------------------------------------------------- the writer's rounds


def test_heartbeats_are_written_at_the_interval_as_readable_files(tmp_path: Path) -> None:
    clock, rec = Clock(), Recorder(Clock())
    mon = monitor(tmp_path, rec, clock)
    mon.tick(clock.now)
    assert mon.writes == 1
    for _ in range(9):  # polled every second: nothing new to write for 10 s
        clock.now += 1.0
        mon.tick(clock.now)
    assert mon.writes == 1
    rec.set_phase("allreduce")
    rec.step(7, epoch=1)
    clock.now += 1.0
    mon.tick(clock.now)
    assert mon.writes == 2

    [beat] = read_heartbeats(tmp_path)
    assert isinstance(beat, Heartbeat)
    assert (beat.rank, beat.node, beat.pid, beat.job_id) == (3, "n2", 42, "77")
    assert (beat.step, beat.epoch, beat.phase, beat.time) == (7, 1, "allreduce", clock.now)
    assert heartbeat_path(tmp_path, 3).name == "rank-00003.json"


def test_stop_writes_a_last_heartbeat_in_phase_done(tmp_path: Path) -> None:
    clock = Clock()
    mon = monitor(tmp_path, Recorder(clock), clock)
    mon.stop()
    assert read_heartbeats(tmp_path)[0].phase == "done"


def test_a_missing_run_dir_is_warned_about_once_and_never_created(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    missing = tmp_path / "not-shared"
    mon = monitor(missing, Recorder(clock), clock)
    with caplog.at_level(logging.WARNING, logger="hpctrain.runtime.heartbeat"):
        for _ in range(3):
            mon.write(clock.now)
    assert not missing.exists() and mon.writes == 0
    assert len([r for r in caplog.records if "shared filesystem" in r.getMessage()]) == 1


def test_a_failing_watchdog_or_gpu_sampler_never_stops_the_heartbeat(tmp_path: Path) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    clock = Clock()
    mon = monitor(tmp_path, Recorder(clock), clock, watchdog=broken, gpu=broken)
    mon.tick(clock.now)
    assert mon.writes == 1 and read_heartbeats(tmp_path)[0].rank == 3


def test_gpu_samples_go_into_the_heartbeat_and_rank_zeros_metrics(tmp_path: Path) -> None:
    clock = Clock()
    sample = {"gpu_util_pct": 87.0, "gpu_mem_used_mb": 1234.5}
    mon = monitor(tmp_path, Recorder(clock), clock, gpu=lambda: dict(sample), gpu_metrics=True)
    metrics_path(tmp_path).write_text('{"kind": "train_step", "global_step": 1}\n')
    mon.tick(clock.now)
    beat = read_heartbeats(tmp_path)[0]
    assert (beat.gpu_util_pct, beat.gpu_mem_used_mb) == (87.0, 1234.5)
    records = [json.loads(line) for line in metrics_path(tmp_path).read_text().splitlines()]
    assert records[0]["kind"] == "train_step"
    assert records[1] == {"kind": "gpu", "rank": 3, "global_step": 0, **sample, "time": clock.now}


def test_the_thread_starts_writes_and_stops(tmp_path: Path) -> None:
    mon = Monitor(tmp_path, dict(IDENTITY), interval_s=0.05, recorder=Recorder()).start()
    mon.stop()
    assert mon.writes >= 1 and read_heartbeats(tmp_path)[0].phase == "done"


# ---------------------------------------------------------------- NVML device numbering


@pytest.mark.parametrize(
    ("visible", "index", "expected"),
    [("", 0, 0), ("", 2, 2), ("3,1", 1, 1), ("3,1", 0, 3), ("GPU-abc, GPU-def", 1, "GPU-def"), ("4", 1, 1)],
)
def test_the_nvml_device_follows_cuda_visible_devices(visible: str, index: int, expected: int | str) -> None:
    assert gpu_monitor.nvml_device_ref(index, {"CUDA_VISIBLE_DEVICES": visible}) == expected


class FakeNvml:
    """The few pynvml calls the sampler makes, over two fake GPUs named by index and UUID."""

    def __init__(self) -> None:
        self.opened: list[object] = []

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:  # noqa: N802
        self.opened.append(index)
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object:  # noqa: N802
        self.opened.append(uuid)
        return uuid

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> object:  # noqa: N802
        return type("Util", (), {"gpu": 55})()

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> object:  # noqa: N802
        return type("Mem", (), {"used": 3 * 2**30})()


def test_the_sampler_reads_the_visible_device_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sample = gpu_monitor.gpu_sampler(1, {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    assert sample is not None and fake.opened == ["GPU-b"]
    assert sample() == {"gpu_util_pct": 55.0, "gpu_mem_used_mb": 3072.0}


def test_no_sampler_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpu_monitor.gpu_sampler(0, {}) is None


@pytest.mark.gpu
def test_nvml_samples_this_ranks_gpu() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import os

    sample = gpu_monitor.gpu_sampler(0, os.environ)
    assert sample is not None
    values = sample()
    assert values is not None and 0.0 <= values["gpu_util_pct"] <= 100.0 and values["gpu_mem_used_mb"] > 0


def test_milestones_are_written_at_once_and_ordinary_steps_wait_for_the_interval(tmp_path: Path) -> None:
    clock = Clock()
    rec = Recorder(clock)
    mon = monitor(tmp_path, rec, clock)
    mon.tick(clock.now)  # setup, step 0
    rec.set_phase("forward_backward")
    rec.step(1, epoch=0)  # the first step arms the watchdog: a milestone
    clock.now += 1.0
    mon.tick(clock.now)
    assert mon.writes == 2 and read_heartbeats(tmp_path)[0].step == 1
    rec.step(2, epoch=0)  # an ordinary step: no write before the interval
    rec.set_phase("allreduce")
    clock.now += 1.0
    mon.tick(clock.now)
    assert mon.writes == 2
    rec.set_phase("checkpoint")  # entering and leaving a checkpoint are milestones
    clock.now += 1.0
    mon.tick(clock.now)
    rec.set_phase("data")
    rec.step(3, epoch=1)
    clock.now += 1.0
    mon.tick(clock.now)
    assert mon.writes == 4
    [beat] = read_heartbeats(tmp_path)
    assert (beat.step, beat.epoch, beat.phase, beat.interval_s) == (3, 1, "data", 10.0)


def test_rank_zeros_monitor_records_when_this_starts_first_step_was_done(tmp_path: Path) -> None:
    from hpctrain.contract.starts import read_starts, record_start

    clock = Clock()
    rec = Recorder(clock)
    rec.step(5)  # a step of an earlier start in this process
    record_start(tmp_path, began=990.0, job_id="77", step_before=7)
    mon = monitor(tmp_path, rec, clock, first_step=True)
    mon.tick(clock())
    assert read_starts(tmp_path)[0].done is None  # no step of this start yet
    rec.position(6)  # resumed from step 6's checkpoint
    clock.now = 1004.0
    rec.step(7)
    clock.now = 1005.0
    rec.step(8)
    mon.tick(clock())
    mon.tick(clock())
    (start,) = read_starts(tmp_path)
    assert start.done == 1004.0 and start.first_step == 7 and start.cost_s() == pytest.approx(14.0)
    assert start.redone_steps == 1
    other = tmp_path / "other"
    other.mkdir()
    monitor(other, Recorder(clock), clock).tick(clock())  # not rank 0's: writes no start record
    assert not (other / ".hpctrain").exists()

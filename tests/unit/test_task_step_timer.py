"""StepClock: laps on the CPU add up to the window's wall time; the DDP hooks are only for DDP; CUDA events;
each step's own compute in the heartbeat, which tells slow-node eviction a slow backward from a wait; the
buffer broadcast before the forward (DDP's, dp's) is a wait (``sync``), not forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hpctrain.contract.heartbeat_files import Heartbeat
from hpctrain.contract.step_split import MEASURED
from hpctrain.healing.eviction import SlowWatch, node_speeds
from hpctrain.runtime import heartbeat
from hpctrain.task import step_timer
from hpctrain.task.step_timer import NoClock, StepClock


def test_cpu_laps_add_up_to_the_wall_time_and_go_to_their_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTime()  # real sleeps oversleep under CI's load, and the wall goes on after the last lap
    monkeypatch.setattr(step_timer, "time", fake)
    clock = StepClock(torch.device("cpu"))
    for _ in range(3):
        fake.now += 0.010
        clock.lap("data")
        fake.now += 0.020
        clock.lap("forward")
        clock.step_done()
    sums, wall = clock._seconds()
    by_part = dict(zip(MEASURED, sums))
    assert by_part["data"] == pytest.approx(0.03) and by_part["forward"] == pytest.approx(0.06)
    assert sum(sums) == pytest.approx(wall)
    record = clock.window(global_step=3, epoch=0)
    assert record is not None and record["steps"] == 3 and record["ranks"] == 1
    assert record["forward_s"] == pytest.approx(by_part["forward"] / 3, abs=1e-5)


def test_the_backward_splits_at_the_last_bucket_handed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake clock: real sleeps overslept under CI's load (a 10 ms sleep took 21 ms in rehearsal 19)."""
    fake = FakeTime()
    monkeypatch.setattr(step_timer, "time", fake)
    clock = StepClock(torch.device("cpu"))
    fake.now += 0.010
    clock._grads_handed = fake.now  # what the comm hook notes
    fake.now += 0.020
    clock.backward_done()
    by_part = dict(zip(MEASURED, clock.sums))
    assert by_part["backward"] == pytest.approx(0.010) and by_part["comm"] == pytest.approx(0.020)
    clock.backward_done()  # no hand-over (no DDP): all backward
    assert clock.sums[MEASURED.index("comm")] == by_part["comm"]


def test_an_empty_window_gives_no_record_and_the_no_clock_does_nothing() -> None:
    assert StepClock(torch.device("cpu")).window(global_step=0, epoch=0) is None
    NoClock().lap("data")
    NoClock().backward_done()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_are_read_once_at_the_windows_end() -> None:
    clock = StepClock(torch.device("cuda"))
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(2):
        clock.lap("data")
        for _ in range(10):
            x = x @ x / 2048
        clock.lap("forward")
        clock.step_done()
    sums, wall = clock._seconds()
    by_part = dict(zip(MEASURED, sums))
    assert by_part["forward"] > by_part["data"] >= 0
    assert sum(sums) == pytest.approx(wall, rel=0.01)


@pytest.mark.usefixtures("task_local")
def test_your_own_loop_logs_its_split_for_the_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """task.StepTimer in a script's loop: one step_split record per log(), which the report explains."""
    from hpctrain import task
    from hpctrain.contract import script_env
    from hpctrain.contract.metrics import parse_metric_lines
    from hpctrain.contract.rundir import metrics_path
    from hpctrain.observe.report.build import report

    run = tmp_path / "run"
    run.mkdir()
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", script_env.RUN_DIR_VAR: str(run)}.items():
        monkeypatch.setenv(name, value)
    fake = FakeTime()  # a real 5 ms sleep could oversleep the 20 ms one under load
    monkeypatch.setattr(step_timer, "time", fake)
    timer = task.StepTimer(nn.Linear(2, 2))  # not DDP: nothing to watch
    for step in range(1, 9):
        fake.now += 0.020
        timer.lap("data")
        fake.now += 0.005
        timer.lap("forward")
        timer.step_done()
        if step % 2 == 0:
            task.log(step, epoch=0, loss=1.0)
            record = timer.log(step)
            assert record is not None and record["steps"] == 2
    lines = metrics_path(run).read_bytes().splitlines(keepends=True)
    splits, _ = parse_metric_lines(lines, kinds=("step_split",))
    assert [r["global_step"] for r in splits] == [2, 4, 6, 8]
    causes = report([run], out=tmp_path / "report").as_json()["waterfall"]["causes"]
    assert causes[0]["part"] == "data" and "per step at 1 process" in causes[0]["evidence"]


class FakeTime:
    """``perf_counter`` that moves only when told (the clock's module reads ``time.perf_counter``)."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def run_steps(
    monkeypatch: pytest.MonkeyPatch, ms: dict[str, float], *, ddp: bool, steps: int = 3
) -> heartbeat.Recorder:
    """``steps`` steps lapped through a CPU clock, ``ms[part]`` each (``comm``: after the last bucket's
    hand-over, when ``ddp``); the heartbeat recorder they fed."""
    fake, recorder = FakeTime(), heartbeat.Recorder()
    monkeypatch.setattr(step_timer, "time", fake)
    monkeypatch.setattr(heartbeat, "_recorder", recorder)
    clock = StepClock(torch.device("cpu"))
    clock.feeds_heartbeat = ddp  # what watch_ddp sets on a DDP model
    for _ in range(steps):
        for part in ("data", "h2d", "forward"):
            fake.now += ms.get(part, 0) / 1000
            clock.lap(part)
        fake.now += ms.get("backward", 0) / 1000
        if ddp:
            clock._grads_handed = fake.now  # what the comm hook notes at the last bucket
            fake.now += ms.get("comm", 0) / 1000
        clock.backward_done()
        fake.now += ms.get("optimizer", 0) / 1000
        clock.lap("optimizer")
        clock.step_done()
    return recorder


def test_each_steps_own_compute_goes_to_the_heartbeat_without_data_or_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = {"data": 50, "h2d": 1, "forward": 10, "backward": 20, "comm": 300, "optimizer": 4}
    recorder = run_steps(monkeypatch, parts, ddp=True)
    snapshot = recorder.snapshot()
    assert snapshot["compute_kind"] == "step" and snapshot["compute_count"] == 3
    assert snapshot["recent_compute_times_s"] == pytest.approx([0.035] * 3, abs=1e-6)  # 1 + 10 + 20 + 4 ms
    assert run_steps(monkeypatch, parts, ddp=False).snapshot()["compute_count"] == 0  # no hook: the forward timer's


def step_beats(*nodes_ms: dict[str, float], monkeypatch: pytest.MonkeyPatch) -> list[Heartbeat]:
    """One heartbeat per node (rank i on node ``n{i}``) after 12 steps of the given parts."""
    beats = []
    for rank, ms in enumerate(nodes_ms):
        snapshot = run_steps(monkeypatch, ms, ddp=True, steps=12).snapshot()
        beats.append(Heartbeat(rank=rank, node=f"n{rank}", time=100.0, **snapshot))
    return beats


def test_a_rank_slow_in_its_backward_only_is_named_and_the_ranks_waiting_for_it_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 25 % node's pattern: its forward as fast as the others', its backward 4x; the others wait for its
    last bucket in their all-reduce (their comm), it does not wait at all."""
    healthy = {"data": 5, "forward": 10, "backward": 20, "comm": 65, "optimizer": 3}
    slow = {"data": 5, "forward": 10, "backward": 80, "comm": 5, "optimizer": 3}
    beats = step_beats(healthy, healthy, slow, healthy, monkeypatch=monkeypatch)
    speeds = node_speeds(beats, ["n0", "n1", "n2", "n3"], since=0)
    assert {node: round(s.ms) for node, s in speeds.items()} == {"n0": 33, "n1": 33, "n2": 93, "n3": 33}
    found = SlowWatch(margin=1.5, window_s=0, min_steps=10).observe(speeds, 4, now=0)
    assert found is not None and found.node == "n2" and found.kind == "step"
    assert found.reason() == "step compute 93 ms vs 33 ms on the other nodes (2.8x) for 0 s"
    # a rank that only waits longer (its peer slow in the link): never blamed
    waiting = {**healthy, "comm": 400}
    beats = step_beats(healthy, waiting, healthy, monkeypatch=monkeypatch)
    assert SlowWatch(1.5, 0, 10).observe(node_speeds(beats, ["n0", "n1", "n2"], since=0), 3, now=0) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_each_steps_own_compute_is_read_once_its_events_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = heartbeat.Recorder()
    monkeypatch.setattr(heartbeat, "_recorder", recorder)
    clock = StepClock(torch.device("cuda"))
    clock.feeds_heartbeat = True
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(4):
        clock.lap("data")
        for _ in range(10):
            x = x @ x / 2048
        clock.lap("forward")
        clock.backward_done()
        clock.lap("optimizer")
        clock.step_done()
    torch.cuda.synchronize()
    clock.step_done()  # harvests the completed steps; never waits
    assert recorder.compute_count == 4 and recorder.compute_kind == "step"
    assert all(t > 0 for t in recorder.compute_times)


class Waits(nn.Module):
    """What DDP's forward does, without a process group: ``wait_ms`` (its buffer broadcast, where a rank waits
    for the slowest) before it calls ``self.module``, whose own forward takes ``compute_ms``."""

    def __init__(self, fake: FakeTime, wait_ms: float, compute_ms: float) -> None:
        super().__init__()
        self.fake, self.wait_ms = fake, wait_ms
        self.module = Computes(fake, compute_ms)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fake.now += self.wait_ms / 1000
        return self.module(x)


class Computes(nn.Module):
    def __init__(self, fake: FakeTime, compute_ms: float) -> None:
        super().__init__()
        self.fake, self.compute_ms = fake, compute_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fake.now += self.compute_ms / 1000
        return x


def test_the_wait_before_ddps_module_runs_is_sync_not_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank whose batch came early waits in DDP's buffer broadcast: that wait is ``sync`` (the split counts
    it as straggler wait or communication), its forward is only the module's own; the parts still add up."""
    fake, recorder = FakeTime(), heartbeat.Recorder()
    monkeypatch.setattr(step_timer, "time", fake)
    monkeypatch.setattr(heartbeat, "_recorder", recorder)
    clock = StepClock(torch.device("cpu"))
    clock.feeds_heartbeat = True
    model = Waits(fake, wait_ms=200, compute_ms=10)
    model.module.register_forward_pre_hook(lambda module, args: setattr(fake, "now", fake.now + 0.004))
    clock.watch_buffer_sync(model)  # after the module's own pre-hook, which is still its forward
    for _ in range(3):
        fake.now += 0.005
        clock.lap("data")
        fake.now += 0.001  # the caller's own work before the call: forward, as without the hooks
        model(torch.zeros(1))
        fake.now += 0.002  # the loss
        clock.lap("forward")
        clock.step_done()
    sums, wall = clock._seconds()
    by_part = {part: round(s * 1000, 6) for part, s in zip(MEASURED, sums) if s}
    assert by_part == {"data": 15, "forward": 51, "sync": 600}
    assert sum(sums) == pytest.approx(wall)
    assert recorder.snapshot()["recent_compute_times_s"] == pytest.approx([0.017] * 3)  # no wait in own compute


def test_forwards_without_gradients_and_the_module_alone_are_not_lapped(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTime()
    monkeypatch.setattr(step_timer, "time", fake)
    clock = StepClock(torch.device("cpu"))
    model = Waits(fake, wait_ms=200, compute_ms=10)
    clock.watch_buffer_sync(model)
    with torch.no_grad():
        model(torch.zeros(1))  # validation
    model.module(torch.zeros(1))
    clock.lap("other")
    sums, _ = clock._seconds()
    assert {part: round(s * 1000, 6) for part, s in zip(MEASURED, sums) if s} == {"other": 220}


def test_only_a_ddp_model_gets_the_hooks() -> None:
    model = nn.Linear(2, 2)
    assert StepClock(torch.device("cpu")).watch_ddp(model) is False
    assert not model._forward_pre_hooks


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_wait_before_the_module_is_timed_with_events() -> None:
    class Busy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(10):  # the stream busy before the module runs, as behind a broadcast it waits for
                x = x @ x / 2048
            return self.module(x)

    clock = StepClock(torch.device("cuda"))
    model = Busy()
    clock.watch_buffer_sync(model)
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(2):
        clock.lap("data")
        model(x)
        clock.lap("forward")
        clock.step_done()
    sums, wall = clock._seconds()
    by_part = dict(zip(MEASURED, sums))
    assert by_part["sync"] > by_part["forward"] >= 0
    assert sum(sums) == pytest.approx(wall, rel=0.01)


def test_a_strategys_collective_before_the_forward_is_sync_not_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Multi-node dp broadcasts buffers in ``before_forward`` (a collective that waits for the slowest rank)."""
    from hpctrain.trainer.precision import Precision
    from hpctrain.trainer.step import TrainStep
    from hpctrain.trainer.strategies.base import Strategy

    fake = FakeTime()
    monkeypatch.setattr(step_timer, "time", fake)

    class BroadcastsFirst(Strategy):
        def before_forward(self, module: nn.Module) -> None:
            fake.now += 0.05

    cpu = torch.device("cpu")
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    clock = StepClock(cpu)
    step = TrainStep(
        model, model, optimizer, scheduler, Precision("fp32", cpu), nn.CrossEntropyLoss(), BroadcastsFirst(), cpu
    )
    step.clock = clock
    step(torch.randn(3, 4), torch.tensor([0, 1, 0]))
    sums, _ = clock._seconds()
    assert {part: round(s * 1000, 6) for part, s in zip(MEASURED, sums) if s} == {"sync": 50}


@pytest.mark.usefixtures("task_local")
def test_rank_0s_write_of_a_window_is_in_the_next_window_as_a_wait(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every rank's next window starts as the gather ends, so the time rank 0 spends writing the record (which
    the other ranks wait for in their next collective) is in its next window too, as log (its own part, never
    communication). Before, rank 0's window began after the write and came out shorter than the
    others' (CI: the split's step 23 % longer than the trainer's own step time)."""
    from hpctrain import task
    from hpctrain.contract import script_env
    from hpctrain.task import reporting

    run = tmp_path / "run"
    run.mkdir()
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", script_env.RUN_DIR_VAR: str(run)}.items():
        monkeypatch.setenv(name, value)
    fake = FakeTime()
    monkeypatch.setattr(step_timer, "time", fake)
    write = reporting.append_record

    def slow_write(record: dict) -> None:
        write(record)
        fake.now += 0.5  # the write of the record took 0.5 s

    monkeypatch.setattr(reporting, "append_record", slow_write)
    timer = task.StepTimer(nn.Linear(2, 2))
    records = []
    for step in (1, 2):
        fake.now += 0.1
        timer.lap("data")
        fake.now += 0.2
        timer.lap("forward")
        timer.step_done()
        records.append(timer.log(step))
    assert [r["step_s"] for r in records] == [pytest.approx(0.3), pytest.approx(0.8)]
    assert records[1]["log_s"] == pytest.approx(0.5) and records[1]["data_s"] == pytest.approx(0.1)
    assert records[1]["other_s"] == pytest.approx(0.0) and records[0]["log_s"] == 0.0

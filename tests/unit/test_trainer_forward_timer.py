"""Each rank times its own module's forward for slow-node eviction (trainer/forward_timer.py); and the
burn-in's compute and GPU probes where a GPU is (healing/probes.py)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from hpctrain.runtime import heartbeat
from hpctrain.trainer.forward_timer import ForwardTimer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class Slow(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.layer = seconds, nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return self.layer(x)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> heartbeat.Recorder:
    fresh = heartbeat.Recorder()
    monkeypatch.setattr(heartbeat, "_recorder", fresh)
    return fresh


def test_training_forwards_are_timed_and_validation_is_not(recorder: heartbeat.Recorder) -> None:
    module = Slow(0.02)
    timer = ForwardTimer(module, torch.device("cpu"))
    wrapper = nn.Sequential(module)  # the strategy's wrapper: the inner module's forward is what counts
    for _ in range(3):
        wrapper(torch.randn(2, 4))
    module.eval()
    wrapper(torch.randn(2, 4))
    snapshot = recorder.snapshot()
    assert snapshot["compute_count"] == 3 and len(snapshot["recent_compute_times_s"]) == 3
    assert 0.02 <= snapshot["compute_time_median_s"] < 0.5
    timer.remove()
    module.train()
    module(torch.randn(2, 4))
    assert recorder.compute_count == 3


@pytest.mark.gpu
@needs_cuda
def test_gpu_forwards_are_read_from_events_a_forward_later(recorder: heartbeat.Recorder) -> None:
    device = torch.device("cuda")
    module = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device)
    ForwardTimer(module, device)
    for _ in range(5):
        module(torch.randn(64, 512, device=device))
    torch.cuda.synchronize()
    module(torch.randn(64, 512, device=device))  # harvests the earlier ones, never blocks
    assert recorder.compute_count >= 4 and all(t > 0 for t in recorder.compute_times)


@pytest.mark.gpu
@needs_cuda
def test_the_compute_probe_and_gpu_checks_run_on_a_gpu() -> None:
    from hpctrain.healing import probes
    from hpctrain.jobspec.models import JobSpec

    device = torch.device("cuda", torch.cuda.current_device())
    spec = JobSpec.model_validate({"name": "g", "trainer": {"arch": "resnet18", "batch_size": 16}})
    work, max_batch = probes.compute_workload(spec, device)
    rounds = probes.compute_probe(work, device, time.perf_counter() + 5, max_batch)
    assert max_batch == 16 and rounds and all(0 < ms < 5000 for ms in rounds)
    found = probes.gpu_problems(device, expected_gpus=1, first_on_node=True)
    assert isinstance(found, list) and all(item.startswith(f"GPU {device.index}: ") for item in found)

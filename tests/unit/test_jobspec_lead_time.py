"""The warning that signals.signal_delay_s is too short to save a checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hpctrain.contract.rundir import checkpoints_dir
from hpctrain.jobspec.lead_time import (
    ARCH_PARAMS_M,
    STOP_OVERHEAD_S,
    estimated_save_s,
    lead_time_warning,
    measured_save_s,
)
from hpctrain.jobspec.models import JobSpec

REPO = Path(__file__).resolve().parents[2]


def spec(arch: str = "resnet50", delay: int = 120, **extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "t", "trainer": {"arch": arch}, "signals": {"signal_delay_s": delay}, **extra}
    )


def test_estimate_counts_weights_and_momentum_in_float32() -> None:
    seconds, how = estimated_save_s(spec("resnet50"))
    assert abs(seconds - ARCH_PARAMS_M["resnet50"] * 8 / 100) < 1e-9  # 25.6M x 4 B x 2 at 100 MB/s
    assert "resnet50" in how and "205 MB" in how
    no_momentum = JobSpec.model_validate({"name": "t", "trainer": {"arch": "resnet50", "momentum": 0.0}})
    assert estimated_save_s(no_momentum)[0] == seconds / 2


def test_default_lead_time_is_enough_for_common_models_but_not_for_huge_ones() -> None:
    assert lead_time_warning(spec("resnet50", delay=120)) is None
    warning = lead_time_warning(spec("vit_h_14", delay=30))
    assert warning is not None
    assert "signals.signal_delay_s=30" in warning and "vit_h_14" in warning
    assert "--set signals.signal_delay_s=130" in warning  # (51 s + 30 s) x 1.5, rounded up to 10 s


def test_unknown_arch_is_assumed_large_and_says_so() -> None:
    warning = lead_time_warning(spec("my_custom_net", delay=10))
    assert warning is not None and "assumed" in warning


def test_entrypoints_are_judged_only_by_what_they_saved(tmp_path: Path) -> None:
    assert lead_time_warning(spec(delay=10, entrypoint="pkg.mod:main")) is None
    folder = tmp_path / "checkpoints" / "step-00000002"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"layout": "dcp", "write_s": 40.0}))  # hpctrain.task's record
    warning = lead_time_warning(spec(delay=30, entrypoint="pkg.mod:main"), tmp_path)
    assert warning is not None and "40 s (the slowest save measured in this run)" in warning


def test_measured_save_times_win_over_the_estimate(tmp_path: Path) -> None:
    for step, write_s in ((2, 3.0), (4, 95.5)):
        folder = checkpoints_dir(tmp_path) / f"step-{step:08d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text(json.dumps({"write_s": write_s}))
    (checkpoints_dir(tmp_path) / "step-00000006").mkdir()  # an incomplete one has no meta: ignored
    assert measured_save_s(tmp_path) == 95.5
    assert lead_time_warning(spec("resnet18", delay=120)) is None
    warning = lead_time_warning(spec("resnet18", delay=120), run_dir=tmp_path)
    assert warning is not None and "measured" in warning
    assert measured_save_s(tmp_path / "nothing-here") is None
    assert lead_time_warning(spec("resnet18", delay=int(95.5 + STOP_OVERHEAD_S) + 1), run_dir=tmp_path) is None


def test_validate_prints_the_warning_and_still_succeeds() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hpctrain", "validate", "jobs/resnet50_4x4.yaml", "--set", "trainer.arch=vit_h_14",
         "--set", "signals.signal_delay_s=30"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning:" in result.stderr and "signal_delay_s" in result.stderr
    assert "OK" in result.stdout

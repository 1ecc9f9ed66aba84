"""``hpctrain report`` on what the real trainer writes: a stopped and resumed single-device run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from trainer_harness import job_spec, train

from hpctrain.cli.main import main
from hpctrain.contract.rundir import spec_path

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    run = tmp_path_factory.mktemp("report") / "run"
    spec = job_spec(data_root, trainer={"epochs": 2, "max_steps_per_epoch": 4, "log_every_steps": 2})
    train(run, spec, stop_after=6)  # a first attempt stopped mid-epoch 2 (as at a time limit)
    train(run, spec)  # resumed from its stop checkpoint
    spec_path(run).write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    return run


def test_report_reads_the_trainers_records(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir), "--out", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (run,) = data["runs"]
    (row,) = data["table"]
    assert run["notes"] == []
    assert run["restarts"] == 1 and len(run["restart_times"]) == 1
    assert run["epoch_records"] == 2 and run["val_records"] == 2 and run["last_global_step"] == 8
    assert run["steps_per_epoch"] == 4
    assert row["devices"] == 1 and row["device_kind"] == "process" and row["global_batch"] == 8
    assert row["images_per_s"] > 0 and row["efficiency"] == 1.0
    assert row["epoch_s"] > 0 and not row["epoch_estimated"]
    assert row["best_top1"] is not None
    assert (tmp_path / "report.html").is_file() and len(list(tmp_path.glob("run-*.png"))) == 1

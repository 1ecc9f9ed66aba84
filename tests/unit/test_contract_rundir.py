"""hpctrain.contract.rundir: the typed summary (tolerant reader, strict writer) and the run directory's paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.contract.rundir import (
    cancel_marker_path,
    submitit_dir,
    summary_path,
    task_log_path,
)
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.errors import RunDirError


def test_summary_reads_known_fields_typed_and_keeps_the_rest(tmp_path: Path) -> None:
    write_summary(tmp_path, {"status": "running", "global_step": 7, "hogwild_workers": [{"worker": 0}]})
    summary = read_summary(tmp_path)
    assert summary is not None
    assert (summary.status, summary.global_step, summary.val_top1) == ("running", 7, None)
    assert not summary.is_final
    assert summary.fields() == {"status": "running", "global_step": 7, "hogwild_workers": [{"worker": 0}]}


@pytest.mark.parametrize("text", ["", '{"status": "runn', "[1, 2]", "null"])
def test_missing_or_half_written_summary_is_none(tmp_path: Path, text: str) -> None:
    assert read_summary(tmp_path) is None
    summary_path(tmp_path).write_text(text)
    assert read_summary(tmp_path) is None


def test_a_field_of_the_wrong_type_is_dropped_not_raised(tmp_path: Path) -> None:
    summary_path(tmp_path).write_text(json.dumps({"status": "exploded", "global_step": "x", "restarts": 2}))
    summary = read_summary(tmp_path)
    assert summary is not None
    assert (summary.status, summary.global_step, summary.restarts) == (None, None, 2)
    assert summary.fields()["status"] == "exploded"  # written back unchanged


def test_summary_writer_refuses_an_unknown_status(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="exploded"):
        write_summary(tmp_path, {"status": "exploded"})
    write_summary(tmp_path, {"status": "stopped"})
    summary = read_summary(tmp_path)
    assert summary is not None and summary.is_final


def test_paths(tmp_path: Path) -> None:
    info = {"job_id": "12_3", "submitit_dir": str(tmp_path / "elsewhere")}
    assert task_log_path(tmp_path, info, 2, err=True) == tmp_path / "elsewhere" / "12_3_2_log.err"
    assert task_log_path(tmp_path, {"job_id": "5"}, 0, err=False) == submitit_dir(tmp_path) / "5_0_log.out"
    assert cancel_marker_path(tmp_path) == cancel_marker_path(tmp_path)

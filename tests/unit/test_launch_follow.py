"""Waiting for a Slurm job (launch/follow.py): how its end is told, with the run's own word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.launch import follow
from hpctrain.launch.submission import SubmittedRun


@pytest.mark.parametrize(
    ("state", "status", "code", "said"),
    [
        ("COMPLETED", "completed", 0, "job 5 ended: COMPLETED\n"),
        # Slurm 24.05+: preempted in its last seconds, after the run completed; hpctrain kept it from starting again
        (
            "PREEMPTED",
            "completed",
            0,
            "job 5 ended: PREEMPTED\nthe run completed; Slurm ended the job PREEMPTED "
            "(a preemption reached it in its last seconds)\n",
        ),
        ("PREEMPTED", "stopped", 1, "job 5 ended: PREEMPTED\n"),
        ("FAILED", None, 1, "job 5 ended: FAILED\n"),
    ],
)
def test_a_run_that_completed_counts_whatever_slurm_calls_the_end(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    state: str,
    status: str | None,
    code: int,
    said: str,
) -> None:
    if status is not None:
        (tmp_path / "summary.json").write_text(json.dumps({"status": status}))
    monkeypatch.setattr(follow, "wait_for_job", lambda submitted: state)
    submitted = SubmittedRun("5", tmp_path, "slurm", [], [tmp_path])
    assert follow.wait_slurm(submitted, quiet=False) == code
    out = capsys.readouterr()
    assert out.out == said
    assert ("see hpctrain logs" in out.err) == (code == 1)

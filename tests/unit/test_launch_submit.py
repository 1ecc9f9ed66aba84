"""The submit sequence's end (launch/submit.py): a waited-for Slurm job's end, with the run's own word."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hpctrain.cli.submit_printer import Printed, exit_code
from hpctrain.launch.submission import SubmittedRun
from hpctrain.launch.submit import Submission, finish
from tests.fake_slurm import FakeSlurm


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
    tmp_path: Path, capsys: pytest.CaptureFixture, state: str, status: str | None, code: int, said: str
) -> None:
    if status is not None:
        (tmp_path / "summary.json").write_text(json.dumps({"status": status}))
    submitted = SubmittedRun("5", tmp_path, "slurm", [], [tmp_path])
    steps = Printed(argparse.Namespace(json=False))
    ended = finish(
        Submission(tmp_path, "5", "slurm"), submitted, wait=True, steps=steps, slurm=FakeSlurm({"5": state}).client()
    )
    assert (ended.state, ended.ended_well, exit_code(ended)) == (state, code == 0, code)
    out = capsys.readouterr()
    assert out.out == said
    assert ("see hpctrain logs" in out.err) == (code == 1)

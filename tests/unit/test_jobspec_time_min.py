"""``resources.time_min`` / ``submit --time-min``: a shorter limit backfill may start sooner (issue 40)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobscript.parameters import slurm_parameters
from hpctrain.jobspec.load import load_job
from tests.unit.cli_helpers import assert_user_error, in_process

pytestmark = pytest.mark.usefixtures("isolated")


def spec(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"name: tm\ncluster: slurm\noutput_dir: {tmp_path / 'runs'}\n"
        f"resources:\n  nodes: 1\n  tasks_per_node: 2\n  time: '04:00:00'\n{extra}"
        f"trainer:\n  arch: resnet18\ndata:\n  root: {tmp_path / 'data'}\n"
    )
    return path


def test_time_min_becomes_sbatch_time_min_in_minutes(tmp_path: Path) -> None:
    job = load_job(spec(tmp_path, "  time_min: '01:30:00'\n"))
    assert slurm_parameters(job.spec, job.profile, tmp_path)["additional_parameters"]["time-min"] == 90
    plain = load_job(spec(tmp_path))
    assert "time-min" not in slurm_parameters(plain.spec, plain.profile, tmp_path)["additional_parameters"]


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("'05:00:00'", "longer than resources.time 04:00:00"),
        ("'01:00'", "not longer than the 120 s warning"),  # one minute: no time to save
        ("'1:99:00'", "minutes must be < 60"),
        ("[1]", "time_min must be a string"),
    ],
)
def test_a_time_min_that_cannot_work_names_the_key(tmp_path: Path, value: str, needle: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_job(spec(tmp_path, f"  time_min: {value}\n"))
    assert any(p.key == "resources.time_min" and needle in p.message for p in caught.value.problems)


def test_submit_time_min_is_the_spec_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = in_process(capsys, "submit", str(spec(tmp_path)), "--dry-run", "--time-min", "2:00:00")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --time-min=120" in result.stdout
    refused = in_process(capsys, "submit", str(spec(tmp_path)), "--dry-run", "--time-min", "5:00:00")
    assert_user_error(refused, 2, "resources.time_min")

"""The tracking: section (jobspec/tracking.py): what it takes, what it refuses before the queue, what --dry-run says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobspec import tracking_checks as tracking
from hpctrain.jobspec.load import load_job
from hpctrain.launch.dry_run import dry_run

pytestmark = pytest.mark.usefixtures("isolated")

SPEC = """\
name: t
cluster: local
output_dir: {out}
data: {{root: /datasets/x}}
{more}
tracking: {tracking}
"""
BOTH = (
    "{wandb: {project: smoke, tags: [a, b], mode: offline}, "
    "mlflow: {tracking_uri: 'https://mlflow.example.org', experiment: e1, tags: {team: hal}}}"
)


def load(tmp_path: Path, section: str, more: str = ""):  # noqa: ANN201
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.format(out=tmp_path / "runs", tracking=section, more=more))
    return load_job(path)


@pytest.fixture
def everything_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking, "installed", lambda tracker: True)


def problems_of(tmp_path: Path, section: str, more: str = "") -> list[str]:
    with pytest.raises(SpecError) as caught:
        load(tmp_path, section, more)
    return [f"{problem.key}: {problem.message}" for problem in caught.value.problems]


@pytest.mark.usefixtures("everything_installed")
def test_both_trackers_at_once_and_none_by_default(tmp_path: Path) -> None:
    spec = load(tmp_path, BOTH).spec
    assert spec.tracking.trackers == ("wandb", "mlflow")
    assert spec.tracking.wandb.tags == ["a", "b"] and spec.tracking.mlflow.tags == {"team": "hal"}
    assert load(tmp_path, "{}").spec.tracking.trackers == ()


def test_a_tracker_that_is_not_installed_is_refused_with_the_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracking, "installed", lambda tracker: tracker != "mlflow")
    assert problems_of(tmp_path, BOTH) == [
        "tracking.mlflow: mlflow is not installed: pip install 'hpctrain[mlflow]' (or remove tracking.mlflow)"
    ]


def test_installed_asks_importlib_without_importing() -> None:
    code = (
        "import sys; from hpctrain.jobspec.tracking_checks import installed; "
        "print(installed('mlflow'), installed('wandb'), 'mlflow' in sys.modules, 'wandb' in sys.modules)"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert found[2:] == ["False", "False"]


@pytest.mark.usefixtures("everything_installed")
@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("{mlflow: {tracking_uri: 'http://bob:secret@mlflow:5000'}}", "tracking.mlflow.tracking_uri"),
        ("{mlflow: {tracking_uri: 'ftp://mlflow'}}", "tracking.mlflow.tracking_uri"),
        ("{mlflow: {tracking_uri: 'http://x', colour: red}}", "tracking.mlflow.colour"),
        ("{wandb: {project: 'a b'}}", "tracking.wandb.project"),
        ("{wandb: {project: p, mode: cloud}}", "tracking.wandb.mode"),
        ("{wandb: {}}", "tracking.wandb.project"),
        ("{neptune: {}}", "tracking.neptune"),
    ],
)
def test_bad_sections_name_the_key(tmp_path: Path, section: str, key: str) -> None:
    found = problems_of(tmp_path, section)
    assert len(found) == 1 and found[0].startswith(key), found


@pytest.mark.usefixtures("everything_installed")
@pytest.mark.parametrize(
    ("uri", "fix"),
    [
        ("http://", "http://mlflow.example.org:5000"),
        ("http://:5000", "has no host name"),
        ("http://mlflow:50x0", "not a number"),
        ("http://mlflow:99999", "not a number"),
        ("http://mlflow:0", "port 0"),
        ("http://mlflow:5000/#/experiments/1", "base address"),
        ("http://ml flow:5000", "space"),
        ("file:mlruns", "file:///home/me/mlruns"),
        ("file://server/mlruns", "three slashes"),
        ("sqlite://mlflow.db", "sqlite:///relative.db"),
        ("sqlite:///", "sqlite:////absolute/path.db"),
    ],
)
def test_a_tracking_uri_that_cannot_work_is_refused_with_the_form_to_write(tmp_path: Path, uri: str, fix: str) -> None:
    [problem] = problems_of(tmp_path, f"{{mlflow: {{tracking_uri: '{uri}'}}}}")
    assert problem.startswith("tracking.mlflow.tracking_uri") and fix in problem, problem


@pytest.mark.usefixtures("everything_installed")
@pytest.mark.parametrize(
    "uri", ["http://mlflow:5000", "https://mlflow.example.org/base/", "file:///srv/mlruns", "sqlite:///m.db",
            "sqlite:////srv/m.db", "databricks", "http://[::1]:5000"],
)  # fmt: skip
def test_usable_tracking_uris_pass(tmp_path: Path, uri: str) -> None:
    assert load(tmp_path, f"{{mlflow: {{tracking_uri: '{uri}'}}}}").spec.tracking.mlflow.tracking_uri == uri


@pytest.mark.usefixtures("everything_installed")
def test_a_password_in_the_uri_is_refused_without_echoing_it_as_advice(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path, "{mlflow: {tracking_uri: 'http://bob:secret@mlflow:5000'}}")
    assert "MLFLOW_TRACKING_PASSWORD" in problem


@pytest.mark.usefixtures("everything_installed")
def test_a_tracker_secret_in_env_is_refused(tmp_path: Path) -> None:
    found = problems_of(tmp_path, "{wandb: {project: p}}", more="env: {WANDB_API_KEY: abc123}")
    assert len(found) == 1 and found[0].startswith("env.WANDB_API_KEY: a secret in the spec")


@pytest.mark.usefixtures("everything_installed")
def test_dry_run_says_where_each_run_will_appear(tmp_path: Path) -> None:
    text = dry_run(load(tmp_path, BOTH)).text
    assert "# W&B: project smoke, run 't/" in text and "wandb sync" in text
    assert "# MLflow: https://mlflow.example.org, experiment 'e1', run 't/" in text
    assert "W&B" not in dry_run(load(tmp_path, "{}")).text

"""A study of the smoke job over 1 and 2 nodes on the test cluster, then ``hpctrain report`` on it:
the PNGs decode, the HTML page carries its images inside, opens in a real browser with every image
loaded, and the table's efficiency column is computed from the runs' own metrics."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from PIL import Image

from hpctrain.contract.rundir import metrics_path, report_dir
from tests.browser import image_widths, require_chromium, screenshot_colours

from .hpctrain_cli import hpctrain
from .study_helpers import SmokeStudy, shared_smoke_study

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

# Where a developer wants the pictures for docs/img (HPCTRAIN_REPORT_SHOTS=docs/img): a real study's report.
SHOTS_DIR = os.environ.get("HPCTRAIN_REPORT_SHOTS")


@pytest.fixture(scope="module")
def study(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> SmokeStudy:
    finished = shared_smoke_study(tmp_path_factory, slurm_cluster)  # test_study_e2e.py's study
    finished.check_submitted()
    return finished


@pytest.fixture(scope="module")
def report(study: SmokeStudy) -> tuple[Path, dict]:
    done = hpctrain(study.env, "report", str(study.study_dir), "--baseline", "hal", "--json", timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    return report_dir(study.study_dir), json.loads(done.stdout)


def steady_rates(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in metrics_path(run_dir).read_text().splitlines() if line.strip()]
    return [r["images_per_s"] for r in records if r.get("kind") == "train_step" and r.get("images_per_s")]


def test_table_is_computed_from_the_runs_own_numbers(study: SmokeStudy, report: tuple[Path, dict]) -> None:
    _, numbers = report
    rows = {row["label"]: row for row in numbers["table"]}
    assert set(rows) == {"nodes-1", "nodes-2"}, rows
    for run in study.runs:
        row = rows[run["label"]]
        rates = steady_rates(Path(run["run_dir"]))
        assert min(rates) <= row["images_per_s"] <= max(rates), (row, rates)
        assert row["devices"] == run["world_size"] and row["device_kind"] == "process"
        assert row["status"] == "completed"
    base = rows["nodes-1"]
    expected = (rows["nodes-2"]["images_per_s"] / 4) / (base["images_per_s"] / 2)
    assert rows["nodes-2"]["efficiency"] == pytest.approx(expected) and base["efficiency"] == pytest.approx(1.0)


def test_pictures_decode_and_the_page_is_self_contained(report: tuple[Path, dict]) -> None:
    out, _ = report
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) >= 3, pngs  # one per run and the scaling figure
    for png in pngs:
        with Image.open(png) as image:
            image.load()
            assert image.size[0] > 200 and image.size[1] > 200
    html = (out / "report.html").read_text()
    assert html.count("<img ") == html.count('src="data:image/png;base64,') >= 3
    assert "http://" not in html.replace("http://www.w3.org", "") and 'src="/' not in html
    assert "nodes-2" in (out / "report.md").read_text()


def test_the_page_opens_in_a_browser_with_every_image(report: tuple[Path, dict], tmp_path: Path) -> None:
    require_chromium()
    out, _ = report
    page = out / "report.html"
    widths = image_widths(page, tmp_path / "profile")
    assert widths and all(width > 0 for width in widths), widths
    shot = tmp_path / "report-page.png"
    assert screenshot_colours(page, tmp_path / "profile", shot) > 200
    if SHOTS_DIR:
        target = Path(SHOTS_DIR)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target / "report-page.png")
        for png in out.glob("*.png"):
            shutil.copy(png, target / f"cluster-{png.name}")

"""report.html in a real browser (headless Chromium): every embedded image decodes, the page is not blank.

Skipped where /usr/bin/chromium is missing, except under CI (env CI set), where
that is a failure: scripts/install-testbed.sh installs Debian's chromium when run as root.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from report_helpers import make_study

from hpctrain.cli.main import main
from hpctrain.contract.rundir import report_dir
from tests.browser import image_widths, require_chromium, screenshot_colours


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_chromium()
    root = tmp_path_factory.mktemp("browser")
    make_study(root / "study", {1: 1.0, 2: 0.9}, desired_acc=60.0)
    assert main(["report", str(root / "study"), "--baseline", "hal"]) == 0
    return report_dir(root / "study") / "report.html"


def test_every_image_loads_in_the_browser(page: Path, tmp_path: Path) -> None:
    widths = image_widths(page, tmp_path / "profile")
    assert len(widths) == page.read_text().count("<img ") == 3  # 2 runs + the scaling figure
    assert all(width > 0 for width in widths), widths


def test_the_page_renders_something(page: Path, tmp_path: Path) -> None:
    assert screenshot_colours(page, tmp_path / "profile", tmp_path / "shot.png") > 200

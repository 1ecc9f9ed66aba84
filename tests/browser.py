"""Open a page in Debian's headless Chromium, as the report tests do (unit tier and Slurm tier).

Missing Chromium skips the test, except under CI (env CI set), where it is a
failure: scripts/install-testbed.sh installs Debian's chromium when run as root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> None:
    if not Path(CHROMIUM).is_file():
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser test, but chromium is not installed (scripts/install-testbed.sh)")
        pytest.skip("chromium is not installed (apt-get install chromium)")


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def image_widths(page: Path, profile: Path) -> list[int]:
    """Each <img>'s decoded width, as the report page's own script records it on <body>."""
    result = chromium(page, profile, "--virtual-time-budget=5000", "--dump-dom")
    match = re.search(r'data-image-widths="([^"]*)"', result.stdout)
    assert match, f"the page's script did not run:\n{result.stderr[-2000:]}"
    return [int(w) for w in match.group(1).split(",") if w]


def screenshot_colours(page: Path, profile: Path, shot: Path) -> int:
    """Distinct colours in a 1280 x 2000 screenshot of the page (a blank page has one)."""
    chromium(page, profile, "--window-size=1280,2000", f"--screenshot={shot}")
    with Image.open(shot) as image:
        assert image.size == (1280, 2000)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    return len(colours or [])

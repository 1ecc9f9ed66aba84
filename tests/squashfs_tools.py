"""The SquashFS tools the packed-dataset tests need (unit and local tiers).

Missing tools skip the test with the reason, except under CI (env CI set),
where it is a failure: scripts/install-testbed.sh installs squashfs-tools, squashfuse
and fuse3 when run as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

INSTALL = "apt-get install squashfs-tools squashfuse fuse3 (scripts/install-testbed.sh does, as root)"


def _missing(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the packed-dataset tests, but {message}; {INSTALL}")
    pytest.skip(f"{message}; {INSTALL}")


def require_pack_tools() -> None:
    missing = [tool for tool in ("mksquashfs", "unsquashfs") if shutil.which(tool) is None]
    if missing:
        _missing(f"{', '.join(missing)} not installed")


def require_mount() -> None:
    """squashfuse, fusermount and a working /dev/fuse (a trial mount of an empty image)."""
    require_pack_tools()
    missing = [tool for tool in ("squashfuse",) if shutil.which(tool) is None]
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        missing.append("fusermount3")
    if missing:
        _missing(f"{', '.join(missing)} not installed")
    if not os.path.exists("/dev/fuse"):
        _missing("/dev/fuse does not exist here")
    with tempfile.TemporaryDirectory() as work:
        empty, image, point = Path(work, "empty"), Path(work, "t.sqsh"), Path(work, "mnt")
        empty.mkdir()
        point.mkdir()
        subprocess.run(["mksquashfs", str(empty), str(image), "-no-progress"], capture_output=True, check=True)
        mounted = subprocess.run(["squashfuse", str(image), str(point)], capture_output=True, text=True)
        if mounted.returncode != 0:
            _missing(f"squashfuse cannot mount here ({mounted.stderr.strip()[:200]})")
        tool = shutil.which("fusermount3") or shutil.which("fusermount")
        subprocess.run([tool, "-u", str(point)], capture_output=True, check=False)

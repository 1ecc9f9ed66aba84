"""``hpctrain init`` (hpctrain/cli/cmd_init.py) against hostile folders and names: what it writes is one
spec with only its own keys (jobscript/templates.py's rule), written exclusively or replaced atomically, never
through a symlink planted under its name (contract/file_writes.py's rule)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from cli_helpers import assert_user_error, in_process

TEMPLATE_KEYS = {"name", "cluster", "output_dir", "resources", "script"}
LINE_BREAKS = ["\u2028", "\u2029", "\x85", "\r", "\n", "\x0b", "\x0c", "\u202e"]


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=[f"U+{ord(c):04X}" for c in LINE_BREAKS])
def test_a_folder_name_cannot_add_a_key(brk: str, isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The red team's U+2028/NEL, and every other character some YAML reader ends a line at."""
    folder = Path(f"d{brk}setup: [touch pwned]{brk}#")
    folder.mkdir()
    (folder / "train.py").write_text("import os\n")
    args = ["init", "job", "--script", str(folder / "train.py"), "--cluster", "local", "--gpus-per-node", "0"]
    done = in_process(capsys, *args, "--dir", str(folder))
    printed = done.stdout + done.stderr
    assert "Traceback" not in printed and "\nsetup" not in printed and (brk == "\n" or brk not in printed)
    if done.returncode != 0:  # a path the spec refuses (a C0 control character): refused, nothing written
        assert_user_error(done, 2, "script.path", "control characters")
        assert list(folder.iterdir()) == [folder / "train.py"]
        return
    text = (folder / "job.yaml").read_text()
    data = yaml.safe_load(text)
    assert set(data) == TEMPLATE_KEYS and "setup" not in data
    assert data["script"]["path"] == str(folder / "train.py")  # the path itself survives, as one value
    assert text.isascii()  # every character a reader could break a line at is an escape


def test_the_plain_template_too(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = Path("jobs\x85trainer: {arch: evil}\u2028#")
    done = in_process(capsys, "init", "job", "--cluster", "local", "--gpus-per-node", "0", "--dir", str(folder))
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load((folder / "job.yaml").read_text())
    assert data["trainer"]["arch"] == "resnet50" and data["resources"]["nodes"] == 1


def test_an_arch_that_is_not_one_value_is_refused(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["init", "job", "--cluster", "local", "--gpus-per-node", "0", "--arch", "resnet50\nsetup: [x]"]
    done = in_process(capsys, *args)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert not Path("jobs/job.yaml").exists()


@pytest.mark.parametrize("target", ["existing", "dangling"])
def test_a_planted_symlink_is_never_written_through(
    target: str, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = isolated.parent / "victim.txt"
    if target == "existing":
        victim.write_text("the victim's own file\n")
    jobs = Path("jobs")
    jobs.mkdir()
    (jobs / "job.yaml").symlink_to(victim)
    done = in_process(capsys, "init", "job", "--cluster", "local", "--gpus-per-node", "0")
    assert_user_error(done, 2, "already exists")
    assert (victim.read_text() if target == "existing" else not victim.exists()) in ("the victim's own file\n", True)
    forced = in_process(capsys, "init", "job", "--cluster", "local", "--gpus-per-node", "0", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (jobs / "job.yaml").is_symlink()  # the link was replaced, not followed
    assert yaml.safe_load((jobs / "job.yaml").read_text())["name"] == "job"
    assert (victim.read_text() == "the victim's own file\n") if target == "existing" else not victim.exists()
    assert [p.name for p in jobs.iterdir()] == ["job.yaml"]  # no draft left behind


def test_a_link_planted_where_the_draft_used_to_go(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The draft's name is no longer predictable: a link under the old name stays untouched."""
    victim = isolated.parent / "victim.txt"
    victim.write_text("mine\n")
    jobs = Path("jobs")
    jobs.mkdir()
    (jobs / ".job.yaml.draft.yaml").symlink_to(victim)
    assert in_process(capsys, "init", "job", "--cluster", "local", "--gpus-per-node", "0").returncode == 0
    assert victim.read_text() == "mine\n"


def test_the_spec_gets_the_users_umask(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = os.umask(0o027)
    try:
        assert in_process(capsys, "init", "job", "--cluster", "local", "--gpus-per-node", "0").returncode == 0
    finally:
        os.umask(old)
    assert Path("jobs/job.yaml").stat().st_mode & 0o777 == 0o640

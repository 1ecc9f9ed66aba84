"""Every file hpctrain writes is created exclusively or replaced atomically, never through a link
(hpctrain/contract/file_writes.py), and a failed write names its file."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from hpctrain.contract import file_writes
from hpctrain.contract.file_writes import open_append, write_atomic

HPCTRAIN = Path(__file__).resolve().parents[2] / "hpctrain"
# A write that may follow a link: open(..., "w"/"a"/"x"), write_text/write_bytes, os.open with O_CREAT.
PLAIN_WRITE = re.compile(r"""open\([^)]*["'][wax]b?\+?["']|\.write_(text|bytes)\(|O_CREAT""")
# Writers that are safe as they are, each with the reason (a fresh folder nobody else can name yet, O_EXCL).
SAFE = {
    "contract/file_writes.py": "the one writer",
    "contract/bad_nodes.py": "O_NOFOLLOW on its append",
    "dataset/node_users.py": "O_NOFOLLOW on its lock file",
    "dataset/pack.py": "inside the mkdtemp work folder it made itself",
    "dataset/generate.py": "inside the mkdtemp folder it made itself",
}
# Moving to another module as this is written (another branch): each still to route through file_writes.
PENDING = ("runtime/",)


def test_replace_replaces_a_link_and_leaves_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("theirs")
    link = tmp_path / "file"
    link.symlink_to(target)
    write_atomic(link, "mine")
    assert not link.is_symlink() and link.read_text() == "mine" and target.read_text() == "theirs"


@pytest.mark.parametrize("planted", ["file", "link", "dangling link", "folder"])
def test_exclusive_refuses_any_name_in_the_way(planted: str, tmp_path: Path) -> None:
    path, target = tmp_path / "spec.yaml", tmp_path / "target"
    if planted == "file":
        path.write_text("old")
    elif planted == "link":
        target.write_text("theirs")
        path.symlink_to(target)
    elif planted == "dangling link":
        path.symlink_to(target)
    else:
        path.mkdir()
    with pytest.raises(FileExistsError):
        write_atomic(path, "new", exclusive=True)
    assert not target.exists() or target.read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"spec.yaml", *(["target"] if target.exists() else [])})


def test_exclusive_without_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(file_writes.os, "link", no_links)
    write_atomic(tmp_path / "new", "text", exclusive=True, mode=0o640)
    assert (tmp_path / "new").read_text() == "text" and (tmp_path / "new").stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["new"]


def test_append_refuses_a_link(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("theirs\n")
    (tmp_path / "log").symlink_to(target)
    with pytest.raises(OSError, match="symlink") as caught:
        open_append(tmp_path / "log")
    assert caught.value.filename == str(tmp_path / "log") and target.read_text() == "theirs\n"
    fd = open_append(tmp_path / "fresh.log")
    os.write(fd, b"line\n")
    os.close(fd)
    assert (tmp_path / "fresh.log").read_text() == "line\n"


def test_a_full_disk_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_writes.os, "fsync", full)
    with pytest.raises(OSError) as caught:
        write_atomic(tmp_path / "summary.json", "{}")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "summary.json")
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too


def test_every_writer_in_hpctrain_goes_through_the_rule() -> None:
    """The category: a new plain write anywhere in hpctrain/ fails here until it uses file_writes."""
    offenders = []
    for path in sorted(HPCTRAIN.rglob("*.py")):
        name = path.relative_to(HPCTRAIN).as_posix()
        if name in SAFE or name.startswith(PENDING):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PLAIN_WRITE.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "write through contract/file_writes.py instead:\n" + "\n".join(offenders)


def test_copies_get_the_umasks_mode_as_a_plain_copy_does(tmp_path: Path) -> None:
    from hpctrain.contract.file_writes import copy_atomic

    (tmp_path / "src").write_text("data")
    old = os.umask(0o022)
    try:
        copy_atomic(tmp_path / "src", tmp_path / "dst")
    finally:
        os.umask(old)
    assert (tmp_path / "dst").read_text() == "data" and (tmp_path / "dst").stat().st_mode & 0o777 == 0o644

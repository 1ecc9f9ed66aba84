"""The one walk of a dataset tree (``hpctrain.dataset.walk``): links followed, loops and pseudo files cut, bounded.

Every case is a real tree on disk: real symlinks (loops, links to ``/``, ``/proc``
and ``/sys``), real FIFOs and sockets, a real device (``/dev/null``).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from hpctrain.dataset import walk
from hpctrain.dataset.index import IndexError_, scan_split


def _file(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _why(tree: walk.Tree, path: str) -> str:
    found = dict(tree.cut)
    assert path in found, (path, tree.cut)
    return found[path]


def test_links_to_files_and_folders_are_followed_and_counted(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    _file(pool / "cats" / "a.jpg")
    _file(pool / "cats" / "deep" / "b.jpg")
    _file(pool / "one.jpg")
    split = tmp_path / "split"
    _file(split / "dogs" / "own.jpg")
    (split / "cats").symlink_to(pool / "cats")
    (split / "dogs" / "linked.jpg").symlink_to(pool / "one.jpg")
    tree = walk.walk(split)
    assert tree.folders == ["cats", "cats/deep", "dogs"]
    assert tree.files == ["cats/a.jpg", "cats/deep/b.jpg", "dogs/linked.jpg", "dogs/own.jpg"]
    assert tree.links == 2 and tree.cut == [] and tree.unreadable == []


def test_loops_are_cut_and_named_also_above_the_top(tmp_path: Path) -> None:
    split = tmp_path / "data" / "train"
    _file(split / "a" / "x.jpg")
    (split / "a" / "self").symlink_to(".")
    (split / "a" / "up").symlink_to("..")
    (split / "a" / "root").symlink_to("/")  # the whole machine, through /proc: cut at once
    (split / "a" / "home").symlink_to(tmp_path)  # a folder above the top
    tree = walk.walk(split)
    assert tree.files == ["a/x.jpg"] and tree.folders == ["a"]
    for name in ("self", "up", "root", "home"):
        assert "loop" in _why(tree, f"a/{name}")


def test_a_real_folder_is_entered_once_per_class_and_again_in_another(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    _file(pool / "p.jpg")
    split = tmp_path / "split"
    for name in ("a", "b"):
        (split / name).mkdir(parents=True)
        (split / name / "pool").symlink_to(pool)
    (split / "a" / "pool2").symlink_to(pool)
    tree = walk.walk(split)
    assert tree.files == ["a/pool/p.jpg", "b/pool/p.jpg"]  # the job reads it in both classes
    assert "already walked" in _why(tree, "a/pool2")
    root = walk.walk(tmp_path, scope_depth=2)  # pack's walk of a root: the same per class
    assert [f for f in root.files if f.startswith("split/")] == ["split/a/pool/p.jpg", "split/b/pool/p.jpg"]


def test_pseudo_file_systems_are_never_entered_or_read(tmp_path: Path) -> None:
    split = tmp_path / "split"
    (split / "a").mkdir(parents=True)
    (split / "a" / "proc").symlink_to("/proc/self")
    (split / "a" / "sys").symlink_to("/sys/kernel")
    (split / "a" / "environ.jpg").symlink_to("/proc/self/environ")  # a regular file, of /proc
    (split / "b").symlink_to("/proc")
    tree = walk.walk(split)
    for path in ("a/proc", "a/sys", "a/environ.jpg", "b"):
        assert "pseudo file system" in _why(tree, path)
    assert tree.files == [] and tree.folders == ["a"]
    assert os.stat("/proc").st_dev in walk.pseudo_devices() and os.stat("/sys").st_dev in walk.pseudo_devices()
    assert os.stat(tmp_path).st_dev not in walk.pseudo_devices()


def test_fifos_sockets_devices_and_broken_links_are_not_files(tmp_path: Path) -> None:
    split = tmp_path / "split"
    _file(split / "a" / "ok.jpg")
    os.mkfifo(split / "a" / "fifo.jpg")
    (split / "a" / "fifo_link.jpg").symlink_to(split / "a" / "fifo.jpg")
    (split / "a" / "null.jpg").symlink_to("/dev/null")
    (split / "a" / "gone.jpg").symlink_to(tmp_path / "nothing")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(split / "a" / "sock.jpg"))
    try:
        tree = walk.walk(split)
    finally:
        server.close()
    assert tree.files == ["a/ok.jpg"]
    assert _why(tree, "a/fifo.jpg") == "a FIFO, not a regular file"
    assert _why(tree, "a/fifo_link.jpg") == "through a link, a FIFO, not a regular file"
    assert _why(tree, "a/sock.jpg") == "a socket, not a regular file"
    assert _why(tree, "a/null.jpg") == "through a link, a device, not a regular file"
    assert "leads nowhere" in _why(tree, "a/gone.jpg")


def test_depth_is_bounded_and_the_cut_is_named(tmp_path: Path) -> None:
    split = tmp_path / "split"
    deep = split.joinpath(*[f"d{n}" for n in range(walk.MAX_DEPTH + 3)])
    _file(deep / "x.jpg")
    tree = walk.walk(split)
    assert len(tree.folders) == walk.MAX_DEPTH and tree.files == []
    cut = "/".join(f"d{n}" for n in range(walk.MAX_DEPTH + 1))
    assert f"deeper than {walk.MAX_DEPTH} folders" in _why(tree, cut)


def test_an_unlistable_folder_is_reported_and_the_scan_stops_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    split = tmp_path / "split"
    _file(split / "a" / "x.jpg")
    _file(split / "b" / "sub" / "y.jpg")
    locked = str(split / "b" / "sub")
    real = os.scandir

    def scandir(path: str = ".") -> object:  # chmod 000 does not stop root, who runs some test machines
        if os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    tree = walk.walk(split)
    assert [(rel, exc.strerror) for rel, exc in tree.unreadable] == [("b/sub", "Permission denied")]
    with pytest.raises(IndexError_, match="cannot list .*sub"):
        scan_split(split)


def test_the_scan_is_the_walk_in_imagefolder_order(tmp_path: Path) -> None:
    split = tmp_path / "split"
    for rel in ("b/2.jpg", "b/1.JPG", "b/z/0.png", "b/a/9.jpg", "a/x.jpg", "a/notes.txt", ".git/x.jpg", "top.jpg"):
        _file(split / rel)
    (split / "c").mkdir()
    index = scan_split(split)
    assert index.classes == ["a", "b", "c"] and index.empty_classes == ["c"]
    assert index.samples == [("a/x.jpg", 0), ("b/1.JPG", 1), ("b/2.jpg", 1), ("b/a/9.jpg", 1), ("b/z/0.png", 1)]


def test_the_diagnose_samplers_classify_entries_by_the_same_rules(tmp_path: Path) -> None:
    """doctor, bench-data and doctor --probe list a little of the tree: a class linked into /proc is no folder."""
    from hpctrain.diagnose.filesystems import entry_kind

    _file(tmp_path / "a" / "x.jpg")
    (tmp_path / "proc").symlink_to("/proc/self")
    (tmp_path / "sys.jpg").symlink_to("/sys/kernel/uevent_seqnum")
    (tmp_path / "pool").symlink_to(tmp_path / "a")
    os.mkfifo(tmp_path / "fifo.jpg")
    kinds = {entry.name: entry_kind(entry) for entry in os.scandir(tmp_path)}
    assert kinds == {"a": "dir", "pool": "dir", "proc": "other", "sys.jpg": "other", "fifo.jpg": "other"}

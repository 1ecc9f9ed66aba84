"""remote/shipping.py: what a submit ships, its token, and the login node's submit-once script (issue 39).

The two shell scripts the login node runs are run here by a real ``sh`` with
``HOME`` in tmp_path (the login node's account): the first attempt submits,
a retry answers from it, a retry while it still runs waits for it, and a
claim whose process died is said, never run again.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from hpctrain.errors import RemoteError, UsageError
from hpctrain.remote import shipping

# The "hpctrain submit" of these tests: counts its runs, prints, sleeps if asked, exits as asked.
FAKE_SUBMIT = """import os, sys, time
open(os.environ["COUNT"], "a").write("submitted\\n")
print("job 4242 submitted:", sys.argv[1:]); print("a warning", file=sys.stderr); sys.stdout.flush()
time.sleep(float(os.environ.get("SLEEP_S", "0")))
sys.exit(int(os.environ.get("RC", "0")))
"""


def login_node(tmp_path: Path, token: str, **env: str) -> tuple[dict[str, str], list[str]]:
    home = tmp_path / "home"
    (home / "hpctrain-submits" / token / "tree").mkdir(parents=True)
    fake = tmp_path / "fake_submit.py"
    fake.write_text(FAKE_SUBMIT)
    environ = {**os.environ, "HOME": str(home), "COUNT": str(tmp_path / "count"), **env}
    return environ, ["sh", "-s", token, "tree", "python3", str(fake), "submit", "job 'one'.yaml"]


def once(environ: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=shipping.RUN_ONCE, env=environ, capture_output=True, text=True, timeout=60)


def test_a_retried_submit_answers_from_the_first_and_submits_once(tmp_path: Path) -> None:
    environ, argv = login_node(tmp_path, "a" * 24, RC="3")
    first, again = once(environ, argv), once(environ, argv)
    assert (first.returncode, again.returncode) == (3, 3)
    assert first.stdout == again.stdout == "job 4242 submitted: ['submit', \"job 'one'.yaml\"]\n"
    assert first.stderr == again.stderr == "a warning\n"
    assert (tmp_path / "count").read_text() == "submitted\n"


def test_a_retry_while_the_first_attempt_still_runs_waits_for_it(tmp_path: Path) -> None:
    environ, argv = login_node(tmp_path, "b" * 24, SLEEP_S="3")
    first = subprocess.Popen(argv, stdin=subprocess.PIPE, env=environ, stdout=subprocess.PIPE, text=True)
    first.stdin.write(shipping.RUN_ONCE)
    first.stdin.close()
    deadline = time.monotonic() + 30
    while not (tmp_path / "count").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    first.kill()  # the connection drops: the waiting shell dies, the detached submit goes on
    first.wait()
    retry = once(environ, argv)
    assert retry.returncode == 0 and "job 4242 submitted" in retry.stdout
    assert (tmp_path / "count").read_text() == "submitted\n"


def test_a_claim_whose_process_died_is_said_not_run_again(tmp_path: Path) -> None:
    environ, argv = login_node(tmp_path, "c" * 24)
    stage = tmp_path / "home" / "hpctrain-submits" / ("c" * 24)
    (stage / "claim").mkdir()
    (stage / "claim" / "pid").write_text("999999999\n")
    done = once(environ, argv)
    assert done.returncode == 98 and "stopped before it ended" in done.stderr
    assert not (tmp_path / "count").exists()


def test_nothing_shipped_is_said(tmp_path: Path) -> None:
    environ, argv = login_node(tmp_path, "d" * 24)
    argv[2] = "e" * 24
    assert once(environ, argv).returncode == 97


def test_a_verb_that_ships_nothing_runs_once_from_the_home_folder(tmp_path: Path) -> None:
    token = "9" * 24
    environ, argv = login_node(tmp_path, "8" * 24)
    argv[2:4] = [token, "home"]  # resume RUN: no shipped tree; a relative RUN means what it means at home
    first, again = once(environ, argv), once(environ, argv)
    assert first.returncode == again.returncode == 0, first.stderr
    assert first.stdout == again.stdout and "job 4242 submitted" in first.stdout
    assert (tmp_path / "count").read_text() == "submitted\n"
    stage = tmp_path / "home" / "hpctrain-submits" / token
    assert (stage / "rc").read_text() == "0\n" and not (stage / "tree").exists()
    assert (stage.stat().st_mode & 0o077) == 0


def receive(tmp_path: Path, token: str, data: bytes) -> subprocess.CompletedProcess[bytes]:
    environ = {**os.environ, "HOME": str(tmp_path / "home")}
    return subprocess.run(["sh", "-c", shipping.RECEIVE, "sh", token], input=data, env=environ, capture_output=True)


def test_the_project_arrives_whole_and_a_claimed_stage_is_left_alone(tmp_path: Path) -> None:
    project = tmp_path / "my project's"
    (project / "code").mkdir(parents=True)
    (project / "code" / "train it.py").write_text("print(1)\n")
    (project / "job 'one'.yaml").write_text("name: x\n")
    files = shipping.project_files(project)
    done = receive(tmp_path, "f" * 24, shipping.tar_stream(project, files))
    assert done.returncode == 0 and done.stdout == b"shipped\n", done.stderr
    tree = tmp_path / "home" / "hpctrain-submits" / ("f" * 24) / "tree"
    assert (tree / "code" / "train it.py").read_text() == "print(1)\n"
    assert (tree.parent.stat().st_mode & 0o077) == 0, "the stage is the user's alone"
    (tree.parent / "claim").mkdir()
    (project / "code" / "train it.py").write_text("print(2)\n")
    again = receive(tmp_path, "f" * 24, shipping.tar_stream(project, files))
    assert again.stdout == b"claimed\n" and (tree / "code" / "train it.py").read_text() == "print(1)\n"


def test_what_a_submit_ships_outside_git(tmp_path: Path) -> None:
    (tmp_path / "code" / "__pycache__").mkdir(parents=True)
    (tmp_path / "code" / "a.py").write_text("")
    (tmp_path / "code" / "__pycache__" / "a.cpython-311.pyc").write_text("")
    (tmp_path / ".env").write_text("SECRET=1")
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("key")
    (tmp_path / "link.py").symlink_to("/etc/passwd")
    assert shipping.project_files(tmp_path) == [Path("code/a.py")]


def test_in_git_only_what_git_lists(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("runs/\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "big.bin").write_text("x")
    (tmp_path / "train.py").write_text("")
    assert shipping.project_files(tmp_path) == [Path("train.py")]


def test_a_project_too_big_to_ship_is_refused_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipping, "MAX_SNAPSHOT_FILES", 2)
    for name in "abc":
        (tmp_path / f"{name}.py").write_text("")
    with pytest.raises(UsageError) as caught:
        shipping.project_files(tmp_path)
    assert "project's folder" in (caught.value.hint or "")


def test_the_token_is_kept_until_the_answer_arrives(isolated: Path) -> None:
    key = shipping.pending_key("hal", ["submit", "a.yaml"], b"name: a\n")
    assert key != shipping.pending_key("hal", ["submit", "a.yaml"], b"name: b\n")
    assert key != shipping.pending_key("hal", ["submit", "a.yaml", "--set", "x=1"], b"name: a\n")
    token, retried = shipping.token_for(key)
    assert not retried and len(token) == 24
    assert shipping.token_for(key) == (token, True)
    shipping.settled(key)
    assert shipping.token_for(key)[0] != token


def test_a_report_tar_that_climbs_out_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(RemoteError):
        shipping.unpack(buffer.getvalue(), tmp_path / "report")
    assert not (tmp_path / "escaped.txt").exists()

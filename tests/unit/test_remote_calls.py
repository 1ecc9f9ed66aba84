"""remote/calls.py and the API's ``cluster=``: the Python face through a login node (issue 39).

What the login node answers is faked at the connection (``Connection.run``);
the whole path through a real sshd with an OTP prompt is
tests/local/test_remote_login.py. Proven here: the API refuses what a remote
call cannot do, with the fix; no master is the CLI's error naming
``hpctrain login``, without a prompt; the login node's ``--json`` answers
come back as the local API's types; its refusals as the same error types.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import hpctrain
from hpctrain import __version__
from hpctrain.errors import ClusterError, HpctrainError, RemoteError, UsageError
from hpctrain.launch.cancel import Cancelled
from hpctrain.launch.submit import Submission
from hpctrain.observe.run_status import RunStatus
from hpctrain.remote import calls
from hpctrain.remote.ssh import Connection

pytestmark = pytest.mark.usefixtures("isolated")


def hal(config: Path) -> None:
    (config / "clusters").mkdir(parents=True, exist_ok=True)
    (config / "clusters" / "hal.yaml").write_text("login: {host: hal.ncsa.illinois.edu}\n")


class LoginNode:
    """Answers each command as the login node's hpctrain would; keeps what it was asked."""

    def __init__(self, answers: dict[str, tuple[int, object, str]]) -> None:
        self.answers, self.asked = answers, []

    def __call__(self, connection: Connection, words: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        self.asked.append(list(words))
        if "--version" in words:
            return subprocess.CompletedProcess(words, 0, f"hpctrain {__version__}".encode(), b"")
        verb = next((w for w in words if w in self.answers), None)
        rc, out, err = self.answers[verb] if verb else (0, "", "")  # (the prune after a submit)
        text = out if isinstance(out, str) else json.dumps(out)
        return subprocess.CompletedProcess(words, rc, text.encode(), err.encode())


@pytest.fixture
def login_node(isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    hal(isolated)
    monkeypatch.setenv("HPCTRAIN_SSH_DIR", str(tmp_path / "sockets"))
    monkeypatch.setattr(Connection, "alive", lambda self: True)

    def answering(answers: dict[str, tuple[int, object, str]]) -> LoginNode:
        node = LoginNode(answers)
        monkeypatch.setattr(Connection, "run", lambda self, words, **kw: node(self, words, **kw))
        return node

    return answering


def status_json(**facts: object) -> dict:
    names = [f for f in RunStatus.__dataclass_fields__ if f != "ranks"]
    return {**dict.fromkeys(names), "job_ids": [], "stragglers": [], "chain": [], **facts, "a_newer_key": 1}


def test_status_and_cancel_come_back_as_the_local_types(login_node) -> None:
    node = login_node(
        {
            "status": (0, status_json(run_dir="/r/a b", status="completed", slurm_state="COMPLETED"), ""),
            "cancel": (
                0,
                {
                    "run_dir": "/r/a b",
                    "job_id": "7",
                    "state": "COMPLETED",
                    "status": "completed",
                    "settled": True,
                    "limit_s": 60.0,
                    "checkpoint_step": 3,
                    "already_ended": True,
                    "script": None,
                    "dependents": [],
                },
                "",
            ),
        }  # fmt: skip
    )
    found = hpctrain.status("/r/a b", cluster="hal")
    assert isinstance(found, RunStatus) and found.status == "completed" and found.run_dir == "/r/a b"
    done = hpctrain.cancel("/r/a b", cluster="hal", timeout_s=5)
    assert isinstance(done, Cancelled) and done.already_ended and done.run_dir == Path("/r/a b")
    [status_call] = [w for w in node.asked if "status" in w]
    assert status_call[-3:] == ["status", "/r/a b", "--json"] and "HPCTRAIN_REMOTE_SIDE=1" in status_call


@pytest.mark.parametrize(("rc", "kind"), [(2, UsageError), (3, ClusterError), (6, RemoteError), (5, HpctrainError)])
def test_a_refusal_there_is_the_same_error_type_here(login_node, rc: int, kind: type) -> None:
    login_node({"status": (rc, "", "error: /r/x: no such run directory\nhint: hpctrain status --all lists them\n")})
    with pytest.raises(kind) as caught:
        hpctrain.status("/r/x", cluster="hal")
    assert caught.value.message == "hal: /r/x: no such run directory"
    assert caught.value.hint == "hpctrain status --all lists them" and caught.value.exit_code == rc


def test_a_remote_submit_returns_a_submission(login_node, isolated: Path, tmp_path: Path, monkeypatch) -> None:
    node = login_node({"sh": (0, {"job_id": "81", "run_dir": "/r/n/1", "cluster": "hal", "backend": "slurm"}, "")})
    monkeypatch.setattr(calls.verbs, "ship", lambda connection, spec, token: "job.yaml")
    (tmp_path / "job.yaml").write_text("name: x\n")
    done = hpctrain.submit("job.yaml", cluster="hal", snapshot=False)
    assert isinstance(done, Submission) and done.job_id == "81" and done.run_dir == Path("/r/n/1")
    sent = next(w for w in node.asked if w[:2] == ["sh", "-s"])
    assert sent[-5:] == ["job.yaml", "--json", "--cluster", "hal", "--no-snapshot"], sent
    assert node.asked[-1][-2:] == ["remote", "prune"], "a submit prunes the login node after"


def test_what_a_remote_call_cannot_do_is_refused_with_the_fix(isolated: Path, tmp_path: Path) -> None:
    hal(isolated)
    (tmp_path / "job.yaml").write_text("name: x\n")
    for call in (
        lambda: hpctrain.submit("job.yaml", cluster="hal", dry_run=True),
        lambda: hpctrain.submit("job.yaml", cluster="hal", local=True),
        lambda: hpctrain.resume("/r/a", cluster="hal", local=True),
        lambda: hpctrain.status("/r/a", cluster="slurm"),  # a profile without login:
        lambda: hpctrain.status("/r/a", cluster=3),
    ):
        with pytest.raises(UsageError) as caught:
            call()
        assert caught.value.hint or "expected" in caught.value.message


def test_no_master_is_the_clis_error_and_never_a_prompt(isolated: Path, tmp_path: Path, monkeypatch) -> None:
    hal(isolated)
    monkeypatch.setenv("HPCTRAIN_SSH_DIR", str(tmp_path / "sockets"))
    started = []
    monkeypatch.setattr(Connection, "open", lambda self: started.append(self))
    with pytest.raises(RemoteError) as caught:
        hpctrain.status("/r/a", cluster="hal")
    assert caught.value.kind == "no_master" and "hpctrain login hal" in (caught.value.hint or "")
    assert not started, "a library call never opens a connection (no prompt from a function)"

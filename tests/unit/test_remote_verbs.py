"""remote/verbs.py: which commands go to a login node, what they are asked, the version check (issue 39).

The subprocess boundary is faked only for the version check (what the login
node's ``hpctrain --version`` answered); the whole path through a real sshd
is tests/local/test_remote_login.py.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
from cli_helpers import hpctrain

from hpctrain import __version__
from hpctrain.errors import RemoteError, UsageError
from hpctrain.jobspec.login import LoginHost
from hpctrain.remote import verbs
from hpctrain.remote.ssh import Connection


@pytest.mark.parametrize(
    ("argv", "left"),
    [
        (["status", "--cluster", "hal", "RUN"], ["status", "RUN"]),
        (["status", "--cluster=hal", "RUN"], ["status", "RUN"]),
        (["logs", "RUN", "--clus", "hal", "-f"], ["logs", "RUN", "-f"]),
        (["logs", "--", "--cluster"], ["logs", "--", "--cluster"]),
    ],
)
def test_the_cluster_flag_is_not_sent_where_the_login_side_has_none(argv: list[str], left: list[str]) -> None:
    assert verbs.without_cluster(argv) == left


def test_the_spec_is_replaced_by_its_shipped_path_and_only_it() -> None:
    words = ["submit", "--set", "a.yaml", "a.yaml", "--cluster", "hal"]
    assert verbs.replace_spec(words, "a.yaml", "jobs/a.yaml") == [
        "submit", "--set", "a.yaml", "jobs/a.yaml", "--cluster", "hal"
    ]  # fmt: skip


def profile(config: Path, name: str, text: str) -> None:
    (config / "clusters").mkdir(parents=True, exist_ok=True)
    (config / "clusters" / f"{name}.yaml").write_text(text)


def args(command: str, cluster: str | None) -> argparse.Namespace:
    return argparse.Namespace(command=command, cluster=cluster)


def test_which_commands_go_to_the_login_node(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile(isolated, "hal", "login: {host: hal.ncsa.illinois.edu}\n")
    assert verbs.remote_cluster(args("status", "hal")) == "hal"
    assert verbs.remote_cluster(args("submit", "hal")) == "hal"
    assert verbs.remote_cluster(args("validate", "hal")) is None, "a spec is checked here"
    assert verbs.remote_cluster(args("submit", "slurm")) is None, "no login: the usual submit"
    assert verbs.remote_cluster(args("nodes", "other")) is None, "the ledger's cluster names are not all profiles"
    monkeypatch.setenv(verbs.REMOTE_SIDE, "1")
    assert verbs.remote_cluster(args("submit", "hal")) is None, "on the login node it never goes remote again"


def test_a_selector_without_a_login_host_or_profile_is_a_usage_error(isolated: Path) -> None:
    with pytest.raises(UsageError) as caught:
        verbs.remote_cluster(args("status", "slurm"))
    assert "login:" in (caught.value.hint or "")
    with pytest.raises(UsageError) as caught:
        verbs.remote_cluster(args("logs", "nope"))
    assert "hal" in (caught.value.hint or "")


class Answers:
    """The login node's answer to ``hpctrain --version``."""

    def __init__(self, rc: int, out: str) -> None:
        self.rc, self.out, self.calls = rc, out, 0

    def __call__(self, words: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        self.calls += 1
        return subprocess.CompletedProcess(words, self.rc, self.out.encode(), b"")


def connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answers: Answers) -> Connection:
    login = LoginHost(host="hal.ncsa.illinois.edu", hpctrain="~/venv/bin/hpctrain")
    made = Connection.for_cluster("hal", login, {"HPCTRAIN_SSH_DIR": str(tmp_path / "s")})
    made.socket.write_text("")  # stands for the master's socket
    monkeypatch.setattr(Connection, "run", lambda self, words, **kw: answers(words, **kw))
    return made


def test_a_login_node_without_hpctrain_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = connection(tmp_path, monkeypatch, Answers(127, "sh: 1: /home/a/venv/bin/hpctrain: not found"))
    with pytest.raises(RemoteError) as caught:
        verbs.check_hpctrain(made)
    assert caught.value.kind == "no_hpctrain" and "not found" in caught.value.message
    assert f"hpctrain=={__version__}" in (caught.value.hint or "") and "login.hpctrain" in (caught.value.hint or "")


def test_another_release_there_is_said_and_the_same_one_checked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = Answers(0, "hpctrain 0.0.9")
    with pytest.raises(RemoteError) as caught:
        verbs.check_hpctrain(connection(tmp_path, monkeypatch, old))
    assert caught.value.kind == "version" and "0.0.9" in caught.value.message
    same = Answers(0, f"hpctrain {__version__}")
    made = connection(tmp_path, monkeypatch, same)
    verbs.check_hpctrain(made)
    verbs.check_hpctrain(made)
    assert same.calls == 1, "once per master connection"


def test_a_remote_command_without_a_connection_is_one_clear_line_and_stays_light(tmp_path: Path, env: dict) -> None:
    profile(Path(env["HPCTRAIN_CONFIG_DIR"]), "hal", "login: {host: hal.ncsa.illinois.edu, user: alice}\n")
    env = {**env, "HPCTRAIN_SSH_DIR": str(tmp_path / "sockets")}
    done = hpctrain("status", "--all", "--cluster", "hal", env=env, importtime=True)
    messages = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 6 and "hpctrain login hal" in "\n".join(messages), messages
    assert not any("torch" in line for line in done.stderr.splitlines() if line.startswith("import time:"))
    check = hpctrain("login", "hal", "--check", env=env)
    assert check.returncode == 1 and "not connected" in check.stdout
    builtin = hpctrain("login", "slurm", env=env)
    assert builtin.returncode == 2 and "names no login host" in builtin.stderr and "Traceback" not in builtin.stderr

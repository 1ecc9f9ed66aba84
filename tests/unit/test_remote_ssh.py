"""remote/ssh.py: the private socket folder, the quoted remote line, ssh's failures read (issue 39).

The real connection (a real sshd asking for a one-time code) is proven in
tests/local/test_remote_login.py; here the pure parts, and the login shell's
reading of our line played by a real ``sh``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpctrain.errors import RemoteError
from hpctrain.jobspec.login import LoginHost
from hpctrain.remote import ssh

HAL = LoginHost(host="hal.ncsa.illinois.edu", user="alice")

NASTY = ["a b", "it's", 'say "hi"', "$(touch pwned)", "`touch pwned`", "a;b|c&d", "*", "tab\there", "-n", ""]


def test_every_word_reaches_the_login_shell_whole(tmp_path: Path) -> None:
    line = ssh.remote_line(["printf", "%s\\n", *NASTY])
    done = subprocess.run(["sh", "-c", line], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:-1] == NASTY
    assert not (tmp_path / "pwned").exists()


def test_a_leading_tilde_is_the_remote_home_and_nothing_else_expands(tmp_path: Path) -> None:
    line = ssh.remote_line(["printf", "%s\\n", "~/my runs/x", "a~/b", "~user"])
    env = {**os.environ, "HOME": "/home/alice"}
    done = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["/home/alice/my runs/x", "a~/b", "~user"]


def test_the_socket_folder_is_made_private_and_tightened(tmp_path: Path) -> None:
    folder = tmp_path / "sockets"
    assert ssh.socket_dir({"HPCTRAIN_SSH_DIR": str(folder)}) == folder
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o755)
    ssh.socket_dir({"HPCTRAIN_SSH_DIR": str(folder)})
    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_socket_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RemoteError) as caught:
        ssh.socket_dir({"HPCTRAIN_SSH_DIR": str(tmp_path / "link")})
    assert caught.value.kind == "socket_dir"


def test_one_socket_per_destination_and_short_enough_for_unix_sockets(tmp_path: Path) -> None:
    environ = {"HPCTRAIN_SSH_DIR": str(tmp_path)}
    paths = {
        ssh.socket_path("hal", HAL, environ),
        ssh.socket_path("hal", HAL.model_copy(update={"user": "bob"}), environ),
        ssh.socket_path("hal", HAL.model_copy(update={"port": 2222}), environ),
    }
    assert len(paths) == 3
    assert all(len(p.name) <= 35 for p in paths)


def test_destination_options_come_from_the_profile_only() -> None:
    login = HAL.model_copy(update={"port": 2222, "jump": "bastion", "ssh_config": "/etc/hal_ssh"})
    assert ssh.destination_args(login) == ["-F", "/etc/hal_ssh", "-l", "alice", "-p", "2222", "-J", "bastion"]
    assert "StrictHostKeyChecking" not in " ".join(ssh.destination_args(login))


def test_no_master_and_no_terminal_is_an_error_saying_how_to_open_one(tmp_path: Path) -> None:
    connection = ssh.Connection.for_cluster("hal", HAL, {"HPCTRAIN_SSH_DIR": str(tmp_path)})
    assert not connection.alive()
    with pytest.raises(RemoteError) as caught:
        connection.require()  # pytest's stdin is no terminal
    assert caught.value.kind == "no_master" and "hpctrain login hal" in (caught.value.hint or "")


CHANGED = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
Host key verification failed.
"""


@pytest.mark.parametrize(
    ("err", "opening", "kind", "needle"),
    [
        (CHANGED, True, "host_key", "CHANGED"),
        ("No ED25519 host key is known for [hal]:22 and you have requested strict checking.\n"
         "Host key verification failed.\n", True, "host_key", "not known"),
        ("alice@hal: Permission denied (keyboard-interactive).\n", True, "auth", "refused"),
        ("alice@hal: Permission denied (keyboard-interactive).\n", False, "no_master", "no open connection"),
        ("ssh: Could not resolve hostname hal: Name or service not known\n", True, "unreachable", "cannot reach"),
    ],
)  # fmt: skip
def test_ssh_failures_become_one_kind_with_the_fix(err: str, opening: bool, kind: str, needle: str) -> None:
    error = ssh.failure("hal", 255, err, opening=opening)
    assert error.kind == kind and needle in error.message
    if kind == "host_key":
        assert "known_hosts" in (error.hint or "") and "never skips" in (error.hint or "")

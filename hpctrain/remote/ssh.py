"""The one place hpctrain starts ``ssh``: one ControlMaster connection per cluster. Torch-free.

MFA logins (Duo, OTP) break every tool that opens a connection per command.
Here a cluster has one master connection whose socket lies in a folder only
the user can enter (0700, owned by the user); it is opened once, with a
terminal, by the user's own ssh (their config, agent and known_hosts: host
keys are checked exactly as ``ssh`` checks them; nothing here weakens that),
and every later command goes through it with ``BatchMode=yes``: it can never
prompt, so it can never hang on a prompt. ``-O check`` comes first; with no
live master the caller says ``hpctrain login NAME`` (or opens it when a
terminal is attached).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import signal
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import RemoteError
from hpctrain.jobspec.login import LoginHost

CONNECT_TIMEOUT_S = 20
SSH = "ssh"


def socket_dir(environ: dict[str, str] | None = None) -> Path:
    """The private folder of the master sockets: made 0700 if missing, refused if anyone else can enter it."""
    environ = dict(os.environ) if environ is None else environ
    base = environ.get("HPCTRAIN_SSH_DIR") or str(Path("~/.ssh/hpctrain").expanduser())
    folder = Path(base)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RemoteError(
            f"{folder} is not a folder of yours", "socket_dir", hint="remove it, or set HPCTRAIN_SSH_DIR to another"
        )
    if info.st_mode & 0o077:
        folder.chmod(0o700)  # ours: close it before a socket lies in it
    return folder


def socket_path(name: str, login: LoginHost, environ: dict[str, str] | None = None) -> Path:
    """One socket per cluster and destination: a changed host, user or port never reuses an old master."""
    key = f"{login.host}\0{login.user}\0{login.port}\0{login.jump}\0{login.ssh_config}"
    return socket_dir(environ) / f"{name[:24]}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def destination_args(login: LoginHost) -> list[str]:
    """The options that pick the host; the host itself comes last, after ``--`` never (ssh reads it as the host)."""
    args: list[str] = []
    if login.ssh_config:
        args += ["-F", str(Path(login.ssh_config).expanduser())]
    if login.user:
        args += ["-l", login.user]
    if login.port:
        args += ["-p", str(login.port)]
    if login.jump:
        args += ["-J", login.jump]
    return args


@dataclass(frozen=True)
class Connection:
    """A cluster's one master connection and the commands sent through it."""

    name: str
    login: LoginHost
    socket: Path

    @classmethod
    def for_cluster(cls, name: str, login: LoginHost, environ: dict[str, str] | None = None) -> Connection:
        return cls(name, login, socket_path(name, login, environ))

    def _argv(self, *options: str) -> list[str]:
        return [SSH, "-S", str(self.socket), *destination_args(self.login), *options]

    def alive(self) -> bool:
        """``ssh -O check``: is a master listening on the socket (never connects, never prompts)."""
        if not self.socket.exists():
            return False
        done = subprocess.run(
            [*self._argv("-O", "check", "-o", "BatchMode=yes"), self.login.host],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CONNECT_TIMEOUT_S,
            check=False,
        )
        return done.returncode == 0

    def open(self) -> None:
        """Open the master: the user's ssh asks on the terminal (password, one-time code) once."""
        if self.alive():
            return
        if self.socket.exists() or self.socket.is_symlink():
            self.socket.unlink()  # a dead master's socket: ssh would refuse to bind over it
        options = ["-M", "-N", "-f", "-o", f"ControlPersist={self.login.persist}"]
        options += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "ServerAliveInterval=30"]
        # The master outlives this command and the terminal it was typed in (SIGHUP ignored across exec).
        done = subprocess.run(
            [*self._argv(*options), self.login.host], stderr=subprocess.PIPE, check=False, preexec_fn=_no_hangup
        )
        err = done.stderr.decode(errors="replace")
        sys.stderr.write(err)
        if done.returncode != 0 or not self.alive():
            raise failure(self.name, done.returncode, err, opening=True)

    def require(self) -> None:
        """A live master, or open one when a person is at a terminal, or say how to open one."""
        if self.alive():
            return
        if sys.stdin.isatty() and sys.stderr.isatty():
            print(f"hpctrain: opening the one connection to {self.name} ({self.login.host})", file=sys.stderr)
            self.open()
            return
        raise no_master(self.name)

    def close(self) -> bool:
        if not self.alive():
            return False
        subprocess.run(
            [*self._argv("-O", "exit"), self.login.host], stdin=subprocess.DEVNULL, capture_output=True, check=False
        )
        return True

    def run(
        self,
        words: Sequence[str],
        *,
        input: bytes | None = None,
        capture: bool = False,
        terminal: bool = False,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``words`` on the login node through the master; ssh's own failures become RemoteError.

        The login shell gets one line whose every word is quoted (shlex.quote), so a path with spaces or
        quotes arrives as one argument. ``capture``: keep stdout and stderr (else they stream to ours).
        ``terminal``: a terminal there too (``-tt``: ``status --watch``'s live view; Ctrl-C reaches it).
        """
        tty = "-tt" if terminal else "-T"
        argv = [*self._argv("-o", "ControlMaster=no", "-o", "BatchMode=yes", tty), self.login.host]
        pipe = subprocess.PIPE if capture else None
        done = subprocess.run(
            [*argv, remote_line(words)],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe,
            check=False,
        )
        if done.returncode == 255:  # ssh's own failure (hpctrain never exits 255)
            err = done.stderr.decode(errors="replace") if capture else ""
            if not self.alive():
                raise (
                    failure(self.name, 255, err)
                    if ssh_failed(err) and "Permission" not in err
                    else no_master(self.name)
                )
            raise failure(self.name, 255, err or "the connection dropped")
        return done


def _no_hangup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def remote_line(words: Sequence[str]) -> str:
    """The one line ssh hands the login shell: every word quoted; a leading ``~/`` stays the remote home."""
    return " ".join("~/" + shlex.quote(word[2:]) if word.startswith("~/") else shlex.quote(word) for word in words)


SSH_FAILURES = {
    "REMOTE HOST IDENTIFICATION HAS CHANGED": "host_key",
    "Host key verification failed": "host_key",
    "No ED25519 host key is known": "host_key",
    "Permission denied": "auth",
    "Could not resolve hostname": "unreachable",
    "Connection refused": "unreachable",
    "Connection timed out": "unreachable",
    "No route to host": "unreachable",
    "Connection closed by": "unreachable",
    "Connection reset": "unreachable",
    "Control socket connect": "no_master",
    "mux_client_request_session": "no_master",
}


def ssh_failed(err: str) -> bool:
    return any(marker in err for marker in SSH_FAILURES) or "ssh:" in err or "kex_exchange" in err


def no_master(name: str) -> RemoteError:
    return RemoteError(
        f"no open connection to {name}'s login node (and no terminal here to open one)",
        "no_master",
        hint=f"run 'hpctrain login {name}' in a terminal once (you type your password and code once), then again",
    )


def failure(name: str, code: int, err: str, *, opening: bool = False) -> RemoteError:
    """ssh's stderr read into one kind and the fix for it."""
    kind = next((kind for marker, kind in SSH_FAILURES.items() if marker in err), "unreachable")
    last = next((line for line in reversed(err.strip().splitlines()) if line.strip()), f"ssh exited {code}")
    if kind == "host_key":
        changed = "CHANGED" in err
        return RemoteError(
            f"{name}: the login node's host key is {'CHANGED' if changed else 'not known'}: {last}",
            kind,
            hint="check the key with your site's published fingerprints, then fix ~/.ssh/known_hosts "
            "(ssh-keygen -R HOST; then 'hpctrain login' and compare the fingerprint it shows); "
            "hpctrain never skips the check",
        )
    if kind == "no_master" or (not opening and kind == "auth"):
        return no_master(name)
    if kind == "auth":
        return RemoteError(f"{name}: the login was refused: {last}", kind, hint=f"run 'hpctrain login {name}' again")
    return RemoteError(f"{name}: cannot reach the login node: {last}", kind, hint="check the host, VPN and network")

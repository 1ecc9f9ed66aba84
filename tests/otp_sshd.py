"""A real OpenSSH login node that asks for a one-time code (issue 39): key AND code, like Duo/OTP logins.

``sshd`` runs on 127.0.0.1 in a mount namespace of its own, where a private
``/etc/pam.d/sshd`` sends keyboard-interactive through ``pam_exec.so
expose_authtok`` to a small script: it logs every prompt answered (so tests
COUNT them) and accepts the current code once, then moves to the next. The
host's PAM files are never touched. Needs root, ``sshd``, ``unshare`` and
pam_exec; :func:`missing` says which is absent.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
PAM_EXEC = ("/lib/x86_64-linux-gnu/security/pam_exec.so", "/usr/lib/x86_64-linux-gnu/security/pam_exec.so")

# pam_exec hands the typed code on stdin (NUL-terminated); the log gets one line per prompt answered.
CHECK = """#!/bin/sh
read -r code
code=$(printf %s "$code" | tr -d '\\000')
dir={dir}
expected=$(cat "$dir/otp")
echo "prompt $PAM_USER $(date +%s)" >>"$dir/prompts.log"
if [ -n "$code" ] && [ "$code" = "$expected" ]; then
  echo "$((expected + 1))" >"$dir/otp"; exit 0
fi
exit 1
"""


def missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (sshd's PAM login and a mount namespace)"
    for tool in (SSHD, shutil.which("unshare"), shutil.which("ssh"), shutil.which("ssh-keygen")):
        if not tool or not Path(tool).exists():
            return f"needs {tool or 'unshare/ssh/ssh-keygen'}"
    if not any(Path(p).exists() for p in PAM_EXEC):
        return "needs pam_exec.so (libpam-modules)"
    return None


@dataclass
class OtpLogin:
    """The running login node and what a laptop needs to reach it."""

    dir: Path
    port: int
    home: Path  # the remote account's $HOME (the stage folders land here)
    ssh_config: Path

    def code(self) -> str:
        return (self.dir / "otp").read_text().strip()

    def prompts(self) -> int:
        log = self.dir / "prompts.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def host_key(self) -> str:
        return (self.dir / "host_key.pub").read_text().split()[1]

    def trust(self, key: str | None) -> None:
        """The laptop's known_hosts: this host's key, another key (a changed host), or none (unknown)."""
        line = f"[127.0.0.1]:{self.port} ssh-ed25519 {key}\n" if key else ""
        (self.dir / "known_hosts").write_text(line)


def login_with_code(
    env: dict[str, str], login: OtpLogin, code: str | None = None, cluster: str = "otp"
) -> tuple[int, str]:
    """``hpctrain login CLUSTER`` on a terminal (a pty), typing the code when asked; (exit status, what it showed)."""
    return on_terminal(env, login, "login", cluster, code=code)


def on_terminal(env: dict[str, str], login: OtpLogin, *args: str, code: str | None = None) -> tuple[int, str]:
    """``hpctrain ARGS`` on a terminal (a pty), typing the code if asked; (exit status, what it showed)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "hpctrain", *args], env)
    seen, typed = b"", False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
            if not typed and b"assword:" in seen:
                os.write(fd, ((code or login.code()) + "\n").encode())
                typed = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), seen.decode(errors="replace")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@contextmanager
def otp_login() -> Iterator[OtpLogin]:
    # Short: a ControlMaster socket path must stay under ~100 bytes; /tmp, not pytest's deep tmp_path.
    folder = Path(tempfile.mkdtemp(prefix="otp-", dir="/tmp"))
    folder.chmod(0o755)
    port = _free_port()
    home = folder / "home"
    home.mkdir()
    _keygen(folder / "host_key")
    _keygen(folder / "user_key")
    (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
    (folder / "otp").write_text("314159\n")
    check = folder / "otp-check"
    check.write_text(CHECK.format(dir=folder))
    check.chmod(0o755)
    pam = folder / "pam.d"
    pam.mkdir()
    (pam / "sshd").write_text(
        f"auth required pam_exec.so expose_authtok quiet {check}\n"
        "auth optional pam_permit.so\n"  # pam_exec has no credentials to set: setcred needs one module's yes
        "account required pam_permit.so\nsession required pam_permit.so\npassword required pam_deny.so\n"
    )
    (folder / "sshd_config").write_text(
        f"""ListenAddress 127.0.0.1:{port}
HostKey {folder / "host_key"}
PidFile {folder / "sshd.pid"}
AuthorizedKeysFile {folder / "authorized_keys"}
AllowUsers root
PermitRootLogin yes
UsePAM yes
KbdInteractiveAuthentication yes
PasswordAuthentication no
PubkeyAuthentication yes
AuthenticationMethods publickey,keyboard-interactive
StrictModes no
MaxSessions 50
SetEnv HOME={home} HPCTRAIN_CONFIG_DIR={home / "config"} XDG_STATE_HOME={home / "state"}
"""
    )
    (folder / "ssh_config").write_text(
        f"""Host *
  IdentityFile {folder / "user_key"}
  IdentitiesOnly yes
  UserKnownHostsFile {folder / "known_hosts"}
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  PreferredAuthentications publickey,keyboard-interactive
"""
    )
    login = OtpLogin(folder, port, home, folder / "ssh_config")
    login.trust(login.host_key())
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    inner = f"mount --bind {pam} /etc/pam.d && exec {SSHD} -D -e -f {folder / 'sshd_config'}"
    with open(folder / "sshd.log", "wb") as log:
        server = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner], stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {(folder / 'sshd.log').read_text()}")
            time.sleep(0.1)
        yield login
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0

"""Run the real ``hpctrain`` command line against the test cluster, the way a user would.

Every call is a fresh ``python -m hpctrain`` process with the cluster's
environment, started in the repository root (the example specs use paths
relative to it), and bounded by a timeout: no test waits forever.
"""

from __future__ import annotations

import json
import pwd
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.contract.rundir import stacks_dir, submitit_dir

if TYPE_CHECKING:
    from .conftest import SlurmCluster

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CliResult:
    """One finished ``hpctrain`` command: exit code, output, and how long it took."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    def json(self) -> Any:
        """The first stdout line that is a JSON document (``--json`` prints it before waiting)."""
        for line in self.stdout.splitlines():
            if line.startswith(("{", "[")):
                return json.loads(line)
        raise AssertionError(f"no JSON line in the output of {self}")

    def __str__(self) -> str:
        return (
            f"hpctrain {' '.join(self.args)} exited {self.returncode} after {self.wall_s:.1f} s\n"
            f"--- stdout\n{self.stdout.rstrip()}\n--- stderr\n{self.stderr.rstrip()}"
        )


# In a cli_env: run hpctrain as this "UID:GID" (the cluster's unprivileged test user), not as root.
AS_USER = "HPCTRAIN_TEST_AS_USER"


def cli_env(cluster: SlurmCluster, state_home: Path, as_user: bool = False) -> dict[str, str]:
    """The cluster's environment, with hpctrain's job-id registry kept under ``state_home``.

    A private registry keeps the tests off the real user's ``~/.local/state``
    and makes job-id lookups see only this session's submissions. With
    ``as_user``, :func:`hpctrain` runs as the cluster's unprivileged test user
    (its jobs then run as that user too), with that user's home.
    """
    env = {**cluster.env, "XDG_STATE_HOME": str(state_home)}
    if as_user:
        account = pwd.getpwnam(cluster.user)
        env.update({AS_USER: f"{account.pw_uid}:{account.pw_gid}", "HOME": account.pw_dir, "USER": cluster.user})
        env["LOGNAME"] = cluster.user
    return env


def user_prefix(ids: str, slurm_conf: Path) -> list[str]:
    """The words that run a command as "UID:GID" (nothing for ""), with Slurm clients that user may run.

    On 24.11 and 26.05 the plain ``sbatch`` on the machine is a wrapper that
    enters the root filesystem's mount namespace, which only root may do: the
    user's command runs inside that root filesystem instead, where the clients
    are that version's own binaries.
    """
    if not ids:
        return []
    uid, _, gid = ids.partition(":")
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    record = json.loads((slurm_conf.parents[1] / "cluster.json").read_text())
    if not record.get("rootfs_holder"):
        return drop  # the host's own Slurm (22.05)
    enter = ["nsenter", f"--mount=/proc/{record['rootfs_holder']}/ns/mnt", "unshare"]
    return [*enter, f"--root={record['rootfs']}", f"--wd={REPO_ROOT}", *drop]


def hpctrain(env: dict[str, str], *args: str, timeout: float = 120, cwd: Path = REPO_ROOT) -> CliResult:
    """``hpctrain ARGS`` in ``cwd`` (the repository root); its output is captured, never a TTY."""
    start = time.monotonic()
    env = dict(env)
    as_user = user_prefix(env.pop(AS_USER, ""), Path(env.get("SLURM_CONF", "/")))
    proc = subprocess.run(
        [*as_user, sys.executable, "-m", "hpctrain", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return CliResult(tuple(args), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


HANG_LOG_LINES = 400  # after a hang: the task logs hold the data-loader workers' stacks, keep them whole


def task_logs(run_dir: Path, lines: int = 40) -> str:
    """The tail of every task's stderr in a run, for assertion messages; after a hang, every rank's stack
    dump whole (the frame a hung rank is stuck in) and longer tails (its workers' stacks)."""
    dumps = sorted(stacks_dir(run_dir).glob("rank-*.txt"))
    keep = max(lines, HANG_LOG_LINES) if dumps else lines
    parts = []
    for path in sorted(submitit_dir(run_dir).glob("*_log.err")):
        text = path.read_text(errors="replace").splitlines()[-keep:]
        parts.append(f"===== {path.name}\n" + "\n".join(text))
    for path in dumps:
        text = path.read_text(errors="replace").splitlines()[:HANG_LOG_LINES]
        parts.append(f"===== {path.relative_to(run_dir)} (the hang watchdog's dump)\n" + "\n".join(text))
    return "\n".join(parts) or f"(no task logs under {run_dir / 'submitit'})"


def task_output(run_dir: Path) -> str:
    """Every task's whole stdout and stderr in a run (every attempt), for counting what the tasks said."""
    return "\n".join(
        p.read_text(errors="replace") for p in sorted(run_dir.rglob("*.out")) + sorted(run_dir.rglob("*.err"))
    )


# -- the preamble of most end-to-end tests: a tiny dataset, then a submit that uses it ---------------------------


def make_dataset(
    env: dict[str, str], data: Path, *, classes: int = 4, per_class: int = 16, image_size: int = 32
) -> Path:
    """``hpctrain make-dataset DATA`` (by default 4 classes of 16 train images of 32 px: the smoke job's
    2 steps per epoch on 4 ranks); the test fails here if it does not work. Returns ``data``."""
    made = hpctrain(
        env,
        "make-dataset",
        str(data),
        *("--classes", str(classes), "--per-class", str(per_class), "--image-size", str(image_size)),
        timeout=120,
    )
    assert made.returncode == 0, made
    return data


def data_sets(data: Path, runs: Path, *extra: str) -> list[str]:
    """``--set data.root=DATA --set output_dir=RUNS``, then ``--set ITEM`` for each of ``extra``."""
    return [arg for item in (f"data.root={data}", f"output_dir={runs}", *extra) for arg in ("--set", item)]


def submit_json(env: dict[str, str], spec: str, *args: str, timeout: float = 120) -> tuple[CliResult, Any]:
    """``hpctrain submit SPEC ARGS... --json``: the finished command and its JSON report (the job id and run
    directory, or a study's runs); a command that printed no JSON fails the test with its output."""
    submitted = hpctrain(env, "submit", spec, *args, "--json", timeout=timeout)
    return submitted, submitted.json()

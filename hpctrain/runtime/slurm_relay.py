"""Slurm commands for tasks inside a container image, run by the batch step outside it.

An image need not carry Slurm's clients, and ``scontrol`` inside it would not
talk to this cluster's controller anyway. With a ``container:`` the batch
script starts a small shell loop (``templates/slurm_relay.sh``) before ``srun``
and exports its folder as ``HPCTRAIN_SLURM_RELAY``. :func:`relay_runner` is a
drop-in for ``subprocess.run`` in ``hpctrain.contract.slurm``'s runner: it writes the
request (``show JOBID``, ``requeue JOBID`` or ``norequeue JOBID``, the only
three the requeue logic needs) into that folder and waits for the loop's
answer. ``scontrol --version``
is answered from ``HPCTRAIN_SLURM_VERSION``, which the batch script records
outside the image (from Slurm 24.05 on, rank 0 must not requeue a preempted
job itself). So rank 0 decides and requeues exactly as without a container
(``requeue.py``). Torch-free.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from hpctrain.contract.file_writes import write_atomic
from hpctrain.contract.slurm import (
    VERSION_COMMAND,
    Runner,
    disable_requeue_command,
    requeue_command,
    show_job_command,
)

RELAY_VAR = "HPCTRAIN_SLURM_RELAY"
VERSION_VAR = "HPCTRAIN_SLURM_VERSION"
POLL_S = 0.05


def request_for(command: list[str]) -> str | None:
    """The relay's request line for one of the requeue logic's commands; None for any other."""
    if len(command) == 5 and command[:4] == show_job_command("0")[:4]:
        return f"show {command[4]}"
    if len(command) == 3 and command[:2] == requeue_command("0")[:2]:
        return f"requeue {command[2]}"
    norequeue = disable_requeue_command("0")  # scontrol update JobId=0 Requeue=0
    if len(command) == 4 and command[::3] == norequeue[::3] and command[1] == norequeue[1]:
        field = command[2]
        return f"norequeue {field.removeprefix('JobId=')}" if field.startswith("JobId=") else None
    return None


def relay_runner(directory: str | Path, version: str | None = None) -> Runner:
    """A ``subprocess.run`` for Slurm commands through the relay in ``directory``; ``version``: what
    ``scontrol --version`` said outside the image (None or empty: unknown, as if scontrol were missing)."""
    folder = Path(directory)

    def run(command: list[str], *, timeout: float | None = None, **_: object) -> subprocess.CompletedProcess[str]:
        if list(command) == list(VERSION_COMMAND) and version:
            return subprocess.CompletedProcess(command, 0, version, "")
        request = request_for(list(command))
        if request is None:
            raise FileNotFoundError(f"{command[0]}: not relayed out of the container")
        name = uuid.uuid4().hex
        req, res = folder / f"{name}.req", folder / f"{name}.res"
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(req, request + "\n", mode=0o644)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not res.exists():
            if deadline is not None and time.monotonic() > deadline:
                req.unlink(missing_ok=True)
                raise subprocess.TimeoutExpired(command, timeout or 0.0)
            time.sleep(POLL_S)
        code, _, output = res.read_text(errors="replace").partition("\n")
        res.unlink(missing_ok=True)
        returncode = int(code) if code.strip().lstrip("-").isdigit() else 1
        ok = returncode == 0
        return subprocess.CompletedProcess(command, returncode, output if ok else "", "" if ok else output)

    return run


def slurm_runner(environ: Mapping[str, str] | None = None) -> Runner:
    """How this task runs Slurm commands: through the relay inside a container, else directly."""
    environ = os.environ if environ is None else environ
    directory = environ.get(RELAY_VAR)
    return relay_runner(directory, environ.get(VERSION_VAR)) if directory else subprocess.run

"""From "the laptop" through an OTP login node to the Slurm test cluster (issue 39): one prompt a sitting.

The login node is this machine through a real sshd that asks for a key and a
one-time code (``tests/otp_sshd.py``); its hpctrain submits to the test
cluster. One job serves every assertion (CI time): submitted through the
login node, seen running by ``status``, cancelled (twice: the second is
harmless), resumed as a new job, followed with ``logs -f`` to its end,
``status`` completed; the code was asked once for all of it. Not
``slurm_contract``: every Slurm call is the login node's own verbs, whose
contract tests cover each version.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from tests.otp_sshd import login_with_code, missing, otp_login

from .hpctrain_cli import CliResult, hpctrain

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

# First start: marks itself and waits to be cancelled; the resumed start ends at once.
SCRIPT = """import os, pathlib, sys, time
if pathlib.Path("started").exists():
    print("second start", flush=True)
    sys.exit(0)
pathlib.Path("started").write_text("1")
print("first start", flush=True)
time.sleep(600)
"""


def test_a_sitting_on_the_cluster_through_the_otp_login_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    why = missing()
    if why:
        pytest.fail(f"the OTP login node {why}") if os.environ.get("CI") else pytest.skip(why)
    with otp_login() as login:
        remote_env = {key: slurm_cluster.env[key] for key in ("PATH", "SLURM_CONF", "PYTHONPATH")}
        words = [f"{key}={value}" for key, value in remote_env.items()]
        config = tmp_path / "laptop-config"
        (config / "clusters").mkdir(parents=True)
        profile = {
            "scheduler": "slurm",
            "login": {
                "host": "127.0.0.1",
                "user": "root",
                "port": login.port,
                "ssh_config": str(login.ssh_config),
                "hpctrain": " ".join(["env", *words, sys.executable, "-m", "hpctrain"]),
            },
        }
        (config / "clusters" / "otp.yaml").write_text(yaml.safe_dump(profile))
        (login.home / "config" / "clusters").mkdir(parents=True)
        (login.home / "config" / "clusters" / "otp.yaml").write_text("scheduler: slurm\npartition: debug\n")
        laptop = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
            "HPCTRAIN_CONFIG_DIR": str(config),
            "HPCTRAIN_SSH_DIR": str(login.dir / "sockets"),
            "XDG_STATE_HOME": str(tmp_path / "state"),
        }
        folder = tmp_path / "my project"
        (folder / "code").mkdir(parents=True)
        (folder / "code" / "wait it.py").write_text(SCRIPT)
        spec = {
            "name": "remote_e2e",
            "cluster": "otp",
            "output_dir": str(tmp_path / "runs"),
            "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:05:00", "partition": "debug"},
            "script": {"path": "code/wait it.py"},
        }
        (folder / "job.yaml").write_text(yaml.safe_dump(spec))

        code, shown = login_with_code(laptop, login)
        assert code == 0, shown

        def remote(*args: str, timeout: float = 180) -> CliResult:
            return hpctrain(laptop, *args, "--cluster", "otp", timeout=timeout, cwd=folder)

        submitted = remote("submit", "job.yaml", "--json")
        assert submitted.returncode == 0, submitted
        record = submitted.json()
        run_dir = Path(record["run_dir"])
        deadline = time.monotonic() + 180
        while not (run_dir / "started").exists():
            assert time.monotonic() < deadline, remote("status", str(run_dir))
            time.sleep(1)
        running = remote("status", str(run_dir), "--json")
        assert running.returncode == 0 and "RUNNING" in running.stdout.upper(), running
        first, again = remote("cancel", str(run_dir)), remote("cancel", str(run_dir))
        assert first.returncode == 0 and again.returncode == 0, (first, again)
        resumed = remote("resume", str(run_dir), "--json")
        assert resumed.returncode == 0, resumed
        assert resumed.json()["job_id"] != record["job_id"]
        followed = remote("logs", str(run_dir), "-f", timeout=300)
        assert followed.returncode == 0 and "second start" in followed.stdout, followed
        done = remote("status", str(run_dir), "--json")
        assert "completed" in json.dumps(done.json()).lower(), done
        assert login.prompts() == 1, "one code for the whole sitting"

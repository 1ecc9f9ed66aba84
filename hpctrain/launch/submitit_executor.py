"""submitit's executors as hpctrain uses them: Slurm writing hpctrain's sbatch script
(``jobscript/sbatch_script.py``), local with a controller that can be told apart from any other process.

Importing this imports submitit (and asyncio with it): ``hpctrain.launch.submission``
loads it only to submit, never for ``--dry-run``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import submitit

from hpctrain.contract.child_process import start_child
from hpctrain.jobscript.sbatch_script import render_sbatch
from hpctrain.launch import local_run


class SlurmExecutor(submitit.SlurmExecutor):
    """Constructible without ``srun``, so a login node or a laptop can prepare a
    submission (``submit`` checks for ``sbatch`` itself); the script is ours."""

    supervisor: str | None = None  # a healing job's batch-step supervisor (jobscript.parameters.supervisor_command)

    @classmethod
    def affinity(cls) -> int:
        return 1

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return render_sbatch(self.parameters, self.folder, command, self.supervisor)


class LocalExecutor(submitit.LocalExecutor):
    """submitit's local executor, whose controller carries a run token and records what proves it.

    Its tasks see the GPUs of ``visible_devices``, chosen from the user's own ``CUDA_VISIBLE_DEVICES``
    (``runtime.rank_plan.local_visible_devices``), never submitit's ``0..N-1``.

    The controller is started as submitit's ``start_controller`` does (same
    environment variables), plus the run's token (``launch/local_run.py``) and,
    on Linux, a parent-death signal: a ``submit --local`` that dies takes the
    controller, and through it the tasks, along. It leads its own process group, out
    of a terminal's Ctrl-C (``launch/follow.py`` stops the run). ``job.local_process`` is the
    record for run.json. ``run_dir``: the run directory the next job serves (set before each submit).
    """

    run_dir: Path | None = None
    visible_devices = ""  # the tasks' CUDA_VISIBLE_DEVICES (launch.submission.build_executor)

    def _submit_command(self, command: str) -> submitit.local.local.LocalJob:
        from submitit.local.local import LocalJob

        ntasks = self.parameters.get("tasks_per_node", 1)
        if self.run_dir is None:
            raise RuntimeError("LocalExecutor.run_dir names the run directory the controller serves; set it first")
        token = local_run.new_run_token()
        env = local_run.controller_environ(os.environ, token, self.run_dir)
        env.update(
            SUBMITIT_LOCAL_NTASKS=str(ntasks),
            SUBMITIT_LOCAL_COMMAND=command,
            SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * self.parameters.get("timeout_min", 2.0))),
            SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(int(self.parameters.get("signal_delay_s", 30))),
            SUBMITIT_LOCAL_NODEID="0",
            SUBMITIT_LOCAL_JOB_NUM_NODES="1",
            SUBMITIT_STDERR_TO_STDOUT="",
            SUBMITIT_EXECUTOR="local",
            CUDA_VISIBLE_DEVICES=self.visible_devices,
            SUBMITIT_LOCAL_WITH_SHELL="",
        )
        # its own process group: a terminal's Ctrl-C reaches submit alone, which stops the run as cancel does
        # (the tasks save first); sent to the controller too, it printed a traceback and the tasks died unsaved
        controller = [sys.executable, "-m", "submitit.local._local", str(self.folder)]
        process = start_child(controller, own_group=True, env=env)
        job: LocalJob = LocalJob(self.folder, str(process.pid), tasks=list(range(ntasks)), process=process)
        job.local_process = local_run.record_started(process.pid, token)  # type: ignore[attr-defined]
        return job

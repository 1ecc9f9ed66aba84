"""submitit's Slurm executor, writing hpctrain's sbatch script (``sbatch_script.py``).

Importing this imports submitit (and asyncio with it): ``hpctrain.submission``
loads it only to submit, never for ``--dry-run``.
"""

from __future__ import annotations

import submitit

from hpctrain.sbatch_script import render_sbatch


class SlurmExecutor(submitit.SlurmExecutor):
    """Constructible without ``srun``, so a login node or a laptop can prepare a
    submission (``submit`` checks for ``sbatch`` itself); the script is ours."""

    @classmethod
    def affinity(cls) -> int:
        return 1

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return render_sbatch(self.parameters, self.folder, command)

"""What a healing job blames a node by: srun's reports, heartbeats, the hang report, and Slurm's own word.

The supervisor (``healing/supervisor.py``) gathers these into a
:class:`~hpctrain.healing.decide.StepOutcome` for the pure decision in
``healing/decide.py``; the guardian (``healing/guardian.py``) asks the same
probe whether the batch node still answers. The functions read the run
directory; :class:`NodeProbe` is the one part that asks Slurm and the nodes.
Torch-free.
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Sequence
from pathlib import Path

from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.contract.rundir import hang_claim_path
from hpctrain.contract.slurm import Slurm, SlurmCommandError
from hpctrain.contract.srun_report import task_failures
from hpctrain.contract.summary import read_summary
from hpctrain.healing.decide import HungRank

PROBE_TIMEOUT_S = 3.0
SILENT_BEATS = 3  # heartbeat intervals without a beat before a node is a suspect


def reported_nodes(srun_text: str) -> set[str]:
    """The nodes srun reported a failed task on."""
    return {failure.node for failure in task_failures(srun_text)}


def silent_nodes(run_dir: Path, nodes: Collection[str], *, since: float, limit_s: float, now: float) -> list[str]:
    """Nodes among ``nodes`` whose every rank wrote a heartbeat after ``since`` and then none for ``limit_s``."""
    ages: dict[str, list[float]] = {}
    for beat in read_heartbeats(run_dir):
        if beat.time >= since and beat.node in nodes:
            ages.setdefault(beat.node, []).append(beat.age_s(now))
    return [node for node, node_ages in ages.items() if min(node_ages) > limit_s]


def last_step(run_dir: Path, nodes: Collection[str]) -> int | None:
    """The newest step a rank on ``nodes`` recorded in its heartbeat: where the loss happened."""
    return max((beat.step for beat in read_heartbeats(run_dir) if beat.node in nodes), default=None)


def hung_rank(run_dir: Path, job_id: str) -> HungRank | None:
    """The hang watchdog's culprit when it ended job ``job_id``'s current step.

    The supervisor removes the report's claim marker before each step, so a
    claim means a rank of this step reported; the summary's hang fields alone
    may be an earlier step's (``runtime/hang.py``).
    """
    if not hang_claim_path(run_dir, job_id).exists():
        return None
    summary = read_summary(run_dir)
    if summary is None or summary.hung_rank is None or summary.hung_node is None:
        return None
    if summary.hang_job_id != job_id:
        return None
    step = summary.hung_step
    return HungRank(
        summary.hung_rank,
        summary.hung_node,
        phase=summary.hung_phase,
        step=step if isinstance(step, int) else None,
        frozen_s=summary.hung_frozen_s,
    )


class NodeProbe:
    """Asks Slurm and the nodes' slurmd whether nodes and the job are still there."""

    def __init__(self, slurm: Slurm | None = None) -> None:
        self.slurm = slurm or Slurm()
        self._slurmd_port: int | None = None

    def lost_reason(self, node: str) -> str | None:
        """Why ``node`` is gone, or None while its slurmd answers (or its name does not resolve: cannot tell)."""
        try:
            address = socket.gethostbyname(node)
        except OSError:
            return None
        try:
            with socket.create_connection((address, self.slurmd_port()), timeout=PROBE_TIMEOUT_S):
                return None
        except OSError:
            return "its slurmd does not answer"

    def slurmd_port(self) -> int:
        if self._slurmd_port is None:
            self._slurmd_port = self.slurm.slurmd_port()
        return self._slurmd_port

    def node_states(self, nodes: Sequence[str]) -> dict[str, str]:
        """``sinfo``'s state of each of ``nodes`` (none when Slurm does not answer)."""
        try:
            return self.slurm.node_states(nodes)
        except SlurmCommandError:
            return {}

    def job_running(self, job_id: str) -> bool:
        """Whether Slurm still runs the job (True when it cannot tell: carry on as if it does)."""
        try:
            return self.slurm.show_job(job_id).get("JobState") == "RUNNING"
        except SlurmCommandError:
            return True

"""What a healing job blames a node by: srun's reports, heartbeats, the hang report, and Slurm's own word.

The supervisor (``healing/supervisor.py``) gathers these into a
:class:`~hpctrain.healing.decide.StepOutcome` for the pure decision in
``healing/decide.py``; the guardian (``healing/guardian.py``) asks the same
probe whether the batch node still answers. The functions read the run
directory; :class:`NodeProbe` is the one part that asks Slurm and the nodes.
Torch-free.
"""

from __future__ import annotations

import io
import socket
from collections.abc import Collection, Sequence
from pathlib import Path

from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.contract.rundir import hang_claim_path, torchrun_failures_path
from hpctrain.contract.runfiles import RunFileError, copy_out, open_regular
from hpctrain.contract.slurm import DEFAULT_SLURMD_PORT, Slurm, SlurmCommandError
from hpctrain.contract.slurm_answers import config_number
from hpctrain.contract.srun_report import task_failures
from hpctrain.contract.summary import read_summary
from hpctrain.errors import ClusterError, printable
from hpctrain.healing import decide
from hpctrain.healing.decide import HungRank

PROBE_TIMEOUT_S = 3.0
CONFIG_TIMEOUT_S = 10.0  # scontrol show config, once, for slurmd's port; the watch loop waits on it
SILENT_BEATS = 3  # heartbeat intervals without a beat before a node is a suspect
# Of torchrun-failures.log, a step's part is read up to this much: one line per failed rank, ~60 bytes each.
MAX_LAUNCHER_REPORT_BYTES = 256 * 1024


def reported_nodes(srun_text: str) -> set[str]:
    """The nodes srun reported a failed task on."""
    return {failure.node for failure in task_failures(srun_text)}


def launcher_report_size(run_dir: Path) -> int:
    """How long the torchrun launcher's report of failed ranks is now (0 when there is none): a step's own
    lines are those after it (:func:`launcher_report`)."""
    try:
        with open_regular(torchrun_failures_path(run_dir), within=run_dir) as handle:
            return handle.seek(0, 2)
    except (OSError, RunFileError):
        return 0


def launcher_report(run_dir: Path, since: int) -> str:
    """The torchrun launcher's report of the ranks that failed in a step (``torchrun: error: n2: task 3:
    Killed``, srun's words: programs/torchrun_node.py), the lines written after offset ``since``.

    Under ``launcher: torchrun`` srun's own report names the node tasks, which end with a status of their own
    when one of their ranks died; the ranks' failures are in this file. A regular file only, at most
    :data:`MAX_LAUNCHER_REPORT_BYTES` of it, inside the run directory (a symlink out of it is not followed),
    control characters escaped (``errors.printable``), and nothing when it is not one (another user's run
    directory is untrusted)."""
    out = io.StringIO()
    try:
        copy_out(torchrun_failures_path(run_dir), since, out, MAX_LAUNCHER_REPORT_BYTES, within=run_dir)
    except (OSError, RunFileError):
        return ""
    text = printable(out.getvalue(), keep="\n")  # a reason goes into the job log and status
    return text[: text.rfind("\n") + 1]  # whole lines: one still being written is read next time


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
        """Why ``node`` is gone, or None while its slurmd answers, or when that cannot be told: its name does not
        resolve, or Slurm does not say which port slurmd listens on (a guessed port is no proof of a loss)."""
        try:
            address = socket.gethostbyname(node)
        except OSError:
            return None
        port = self.slurmd_port()
        if port is None:
            return None
        try:
            with socket.create_connection((address, port), timeout=PROBE_TIMEOUT_S):
                return None
        except OSError:
            return "its slurmd does not answer"

    def lost_by_state(self, node: str, state: str) -> bool:
        """Whether sinfo's ``state`` of ``node`` means the node is lost. DOWN, DRAIN or FAIL do (Slurm or an
        administrator decided); a node that only does not respond to the controller's ping (``*``) or whose
        state Slurm does not know (UNKNOWN, as after a controller restart) is lost only when its slurmd does
        not answer either: a loaded node answers its ping late and still trains."""
        if not decide.bad_node_state(state):
            return False
        base = state.strip().lower().rstrip("*~#$@%!^-")
        if base in decide.BAD_BY_DECISION:
            return True
        return self.lost_reason(node) is not None

    def slurmd_port(self) -> int | None:
        """slurmd's port from the controller's config (learnt once); None while the controller does not answer."""
        if self._slurmd_port is None:
            try:
                config = self.slurm.config(timeout_s=CONFIG_TIMEOUT_S)
            except ClusterError:
                return None
            self._slurmd_port = config_number(config, "SlurmdPort") or DEFAULT_SLURMD_PORT
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

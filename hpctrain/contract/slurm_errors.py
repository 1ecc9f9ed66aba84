"""How a Slurm command fails, as the project's errors, and which ids and names may reach one.

The one client (``contract/slurm.py``) raises :class:`SlurmCommandError` for
every way a command fails (:func:`classify_failure` reads a non-zero exit; the
client itself the rest), with a ``kind`` callers act on and a hint. Job ids and
node names come from files anyone may edit (run.json, study.json, the registry,
the bad-node ledger): :func:`checked_job_id` and :func:`checked_node_name`
refuse whatever could become an option or a wider target before it reaches an
argv. Builds no argv itself; import these from ``hpctrain.contract.slurm``.
"""

from __future__ import annotations

import re
from typing import Literal

from hpctrain.contract import slurm_answers as answers
from hpctrain.errors import ClusterError

FailureKind = Literal["missing", "timeout", "unreachable", "unknown-job", "refused"]

# A job id as hpctrain records one: 123, an array task 123_4, a het-job component 123+1. Anything else
# (``--user=me``, ``-1``, a list) would become an option or a wider target of scancel/scontrol/sacct.
_JOB_ID = re.compile(r"[0-9]{1,20}(_[0-9]{1,10})?(\+[0-9]{1,6})?")
_STEP_ID = re.compile(r"[0-9]{1,20}(_[0-9]{1,10})?(\+[0-9]{1,6})?\.[0-9]{1,10}")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-\[\],]*")  # a name or a host list (n[1-3],m1)
_ONE_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class SlurmCommandError(ClusterError):
    """A Slurm command failed; ``kind`` says how, so callers can decide to retry; ``output``: what the
    command itself said."""

    def __init__(self, message: str, kind: FailureKind, hint: str | None = None, output: str = "") -> None:
        super().__init__(message, hint)
        self.kind, self.output = kind, output


class WaitTimedOut(SlurmCommandError):
    """:meth:`Slurm.wait_for` ran out of time; ``state`` is the job's state then."""

    def __init__(self, job_id: str, state: str, timeout_s: float) -> None:
        super().__init__(f"job {job_id} is still {state} after {timeout_s:.0f} s", "timeout")
        self.state = state


def checked_job_id(job_id: object) -> str:
    """``job_id`` if it names one job (or array task, or het-job component); else a refusal.

    Job ids come from run.json, study.json and the registry, files anyone may
    edit: every command that names a job checks it here first.
    """
    text = str(job_id).strip()
    if not _JOB_ID.fullmatch(text):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise SlurmCommandError(
            f"{shown!r} is not a Slurm job id",
            kind="unknown-job",
            hint="the run's run.json names its job as a number such as 48121 or 48121_3; was it edited?",
        )
    return text


def checked_node_name(node: object) -> str:
    """``node`` if it is one Slurm node name (letters, digits, ``-_.``), else a refusal: node names come
    from run files and the user's ledger and end up in ``--exclude`` and ``ExcNodeList``."""
    text = str(node)
    if not _ONE_NODE.fullmatch(text):
        raise SlurmCommandError(
            f"{text[:40]!r} is not a Slurm node name", kind="refused", hint="node names are letters, digits, - _ ."
        )
    return text


def is_job_id(text: str) -> bool:
    """Whether ``text`` (stripped) names one job, as :func:`checked_job_id` accepts. Pure."""
    return _JOB_ID.fullmatch(text.strip()) is not None


def is_step_id(text: str) -> bool:
    """Whether ``text`` names one job step (``12.0``, ``12_3.1``). Pure."""
    return _STEP_ID.fullmatch(text) is not None


def is_node_list(text: str) -> bool:
    """Whether ``text`` is a node name or a host list (``n[1-3],m1``), nothing an option could hide in. Pure."""
    return _NODE_NAME.fullmatch(text) is not None


def classify_failure(command: list[str], returncode: int, output: str) -> SlurmCommandError:
    """A non-zero exit of a Slurm command as the project's error. Pure."""
    shown, text = " ".join(command), output.strip() or "no output"
    lowered = text.lower()
    if any(needle in lowered for needle in answers.UNREACHABLE):
        return SlurmCommandError(
            f"'{shown}' could not reach the Slurm controller: {text}",
            "unreachable",
            hint="slurmctld may be down or restarting; try again in a minute, or ask the admins",
        )
    if any(needle in lowered for needle in answers.UNKNOWN_JOB):
        return SlurmCommandError(
            f"'{shown}': Slurm does not know this job ({text})",
            "unknown-job",
            hint="Slurm forgets finished jobs after MinJobAge; 'hpctrain status RUN_DIR' still shows the run",
        )
    return SlurmCommandError(f"'{shown}' failed (exit {returncode}): {text}", "refused", output=text)

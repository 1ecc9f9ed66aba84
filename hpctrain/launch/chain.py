"""Chains on the login side (``after:``, ``submit --after RUN``; docs/chains.md): link, re-point, cancel.

Why ``afterany`` and a decision on the nodes, not Slurm's ``afterok``: Slurm
ties a dependency to one job id, and only the job's exit says "ok". A
requeued upstream keeps its id (its dependents keep waiting), but a resumed
one is a new job, a time-limit stop of a run that will be resumed is no
failure, and an ``afterok`` whose job failed leaves the dependent pending
forever (``DependencyNeverSatisfied``), or cancelled at once where the
cluster sets ``kill_invalid_depend``. So Slurm is asked only "has the
upstream's current job ended?" (``afterany:JOB``); what that end means is
read from the upstream's run directory when the dependent starts
(``runtime/chain_start.py``, by ``contract/chain_links.chain_decision``). A failed
upstream thus ends its dependents with the reason in their status without
any process here having to watch it. What this side does:

* :func:`linked` (submit, resume of a dependent): resolve the upstream, refuse
  what cannot be chained (no such run, a study or sweep, a cycle, another
  user's run, a condition that can no longer hold), and set the dependency on
  the upstream's current job, or none when its end already says "start";
* :func:`record` (after the submit): the link in both run directories;
* :func:`repoint` (resume of the upstream): each pending dependent now waits
  for the new job (``scontrol update``), each one the chain ended waiting is
  submitted again;
* :func:`cancel_dependents` (cancel of a run): its whole chain, one command.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from hpctrain.contract import job_registry
from hpctrain.contract.chain_links import (
    AFTER_KEY,
    MAX_CHAIN,
    Link,
    chain_decision,
    dependents_of,
    end_reason,
    outcome,
    read_chain_end,
    record_dependent,
    upstream_link,
    write_chain_end,
)
from hpctrain.contract.rundir import CONTROL_DIR, read_run_info, write_run_info
from hpctrain.contract.slurm import Slurm
from hpctrain.contract.slurm_states import is_final, is_pending
from hpctrain.contract.study_file import study_dir_of
from hpctrain.contract.summary import read_summary
from hpctrain.errors import ClusterError, HpctrainError, RunDirError, UsageError
from hpctrain.jobspec.after import After
from hpctrain.jobspec.load import LoadedJob

DEPENDENCY_KEY = "dependency"


def after_override(run: str | None) -> list[str]:
    """``--after RUN`` as the ``--set`` it means (JSON is YAML: a job id stays text)."""
    return [f"after.run={json.dumps(run)}"] if run else []


def with_upstream(job: LoadedJob, run: str | None) -> LoadedJob:
    """A loaded job with ``after.run`` set to ``run`` (its ``when`` kept); checked again by the caller."""
    if not run:
        return job

    def changed(spec):  # noqa: ANN001, ANN202 - JobSpec
        after = After(run=run, when=spec.after.when if spec.after is not None else "completed")
        return spec.model_copy(update={"after": after})

    return replace(job, spec=changed(job.spec), trials=tuple(changed(trial) for trial in job.trials))


def linked(job: LoadedJob, *, local: bool = False, slurm: Slurm | None = None) -> LoadedJob:
    """``job`` with its upstream resolved to a run directory and its Slurm dependency set; ``UsageError`` for
    anything that cannot be chained. Reads only; nothing is written or submitted."""
    after = job.spec.after
    if after is None:
        return job
    where = f"{job.source}: after.run"
    if study_dir_of(after.run) is not None:
        raise UsageError(f"{where}: {after.run} is a study", hint="chain after one of its points' run directories")
    try:
        upstream = job_registry.resolve_run(after.run)
        info = read_run_info(upstream)
    except RunDirError as exc:
        raise UsageError(f"{where}: {exc.message}", hint=exc.hint) from None
    if info.get("trials"):
        raise UsageError(f"{where}: {upstream} is a sweep", hint="chain after one trial: RUN/trial-NNN")
    if job.is_sweep or job.is_study:
        raise UsageError(
            f"{where}: a sweep or a study cannot be chained yet (each of its runs would need its own link)",
            hint="chain one spec per run, or remove sweep:/study: from this spec",
        )
    check_no_cycle(upstream)
    if not _writable(upstream) or (upstream / CONTROL_DIR).exists() and not _writable(upstream / CONTROL_DIR):
        raise UsageError(
            f"{where}: {upstream} is not writable by you (another user's run?)",
            hint="a chain records its dependents in the upstream's run directory, so that a resume re-points them; "
            "chain after your own runs",
        )
    link = Link(Path("(this run)"), upstream, after.when)
    dependency = _dependency(link, info, where, local=local, slurm=slurm or Slurm())
    return _with(job, upstream, dependency)


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK) and not folder.is_symlink()


def _dependency(link: Link, info: dict, where: str, *, local: bool, slurm: Slurm) -> str | None:
    """``afterany:JOB`` while the upstream's job may still run; None when its end says start now."""
    job_id = str(info.get("job_id", ""))
    ended = info.get("backend") == "local" or not job_id or is_final(_state(slurm, job_id))
    if not ended:
        if local:
            raise UsageError(
                f"{where}: {link.upstream} has not ended, and a local run cannot wait for it",
                hint="submit it to the cluster, or run it here once the upstream has ended",
            )
        return f"afterany:{job_id}"
    found = outcome(link.upstream, job_ended=True)
    decision = chain_decision(link.when, found)
    if decision == "start":
        return None
    hint = f"resume it first: hpctrain resume {link.upstream}" if decision == "wait" else "choose another run"
    raise UsageError(f"{where}: {end_reason(link, found)}", hint=hint)


def _state(slurm: Slurm, job_id: str) -> str:
    try:
        return slurm.job_state(job_id)
    except ClusterError as exc:
        raise UsageError(f"after.run: cannot ask Slurm about job {job_id}: {exc.message}", hint=exc.hint) from None


def _with(job: LoadedJob, upstream: Path, dependency: str | None) -> LoadedJob:
    def changed(spec):  # noqa: ANN001, ANN202 - JobSpec
        extra = {k: v for k, v in spec.resources.slurm_extra.items() if k != DEPENDENCY_KEY}
        extra.update({DEPENDENCY_KEY: dependency} if dependency else {})
        resources = spec.resources.model_copy(update={"slurm_extra": extra})
        after = spec.after.model_copy(update={"run": str(upstream)})
        return spec.model_copy(update={"resources": resources, "after": after})

    return replace(job, spec=changed(job.spec), trials=tuple(changed(trial) for trial in job.trials))


def check_no_cycle(upstream: Path) -> None:
    """Walk the upstream's own chain up to its first run; a run met twice (a hand-edited record) is a cycle."""
    seen = [upstream]
    link = upstream_link(upstream)
    while link is not None:
        if link.upstream in seen or len(seen) > MAX_CHAIN:
            names = " -> ".join(str(path) for path in [*seen, link.upstream])
            raise UsageError(f"after.run: the chain has a cycle: {names}", hint="chain after a run outside it")
        seen.append(link.upstream)
        link = upstream_link(link.upstream)


def record(run_dir: Path, job: LoadedJob, cancel: Callable[[], object]) -> None:
    """The link in the new run's ``run.json`` and in its upstream's dependents. When that cannot be written,
    ``cancel`` ends the job just submitted (nothing is left half-chained) and ``RunDirError`` says why."""
    after = job.spec.after
    if after is None:
        return
    try:
        info = read_run_info(run_dir)
        info[AFTER_KEY] = {"run_dir": after.run, "when": after.when}
        write_run_info(run_dir, info)
        record_dependent(Path(after.run), run_dir, after.when)
    except (OSError, RunDirError) as exc:
        cancel()
        raise RunDirError(f"{run_dir}: the chain could not be recorded ({exc}); the job was cancelled") from None


def repoint(upstream: Path, job_id: str, resubmit: Callable[[Path], object], *, slurm: Slurm) -> list[str]:
    """After ``upstream`` got a new job ``job_id``: each pending dependent waits for it; each the chain ended
    waiting (or cancelled with it) is submitted again by ``resubmit(run_dir)``. What was done, one line each."""
    said = []
    for link in dependents_of(upstream):
        try:
            info = read_run_info(link.run_dir)
            if read_chain_end(link.run_dir) is not None:
                resubmit(link.run_dir)
                said.append(f"{link.run_dir}: submitted again, after job {job_id}")
                continue
            own = str(info.get("job_id", ""))
            if own and is_pending(_state(slurm, own)):
                slurm.set_dependency(own, f"afterany:{job_id}")
                said.append(f"{link.run_dir}: job {own} now waits for job {job_id}")
        except HpctrainError as exc:
            said.append(f"{link.run_dir}: not re-pointed: {exc.message}")
    return said


def cancel_dependents(run_dir: Path, cancel_run: Callable[[Path], object], depth: int = 0) -> list[Path]:
    """Cancel every run chained after ``run_dir``, depth first, each recorded as ended by the chain (so the
    upstream's resume submits it again); the runs cancelled."""
    done: list[Path] = []
    if depth > MAX_CHAIN:
        return done
    for link in dependents_of(run_dir):
        done += cancel_dependents(link.run_dir, cancel_run, depth + 1)
        summary = read_summary(link.run_dir)
        if summary is not None and summary.is_final:
            continue  # it ran to its own end (or the chain ended it): nothing to cancel
        try:
            reason = f"after: cancelled with {link.upstream} ('hpctrain cancel' of its chain)"
            write_chain_end(link.run_dir, reason, link.upstream, "end")
            cancel_run(link.run_dir)
            done.append(link.run_dir)
        except (HpctrainError, OSError):
            continue  # ended already, or not ours to cancel: the rest of the chain still is
    return done

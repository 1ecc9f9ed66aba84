"""A chained run's first act on its nodes (``after:``, docs/chains.md): start, or end with the chain's reason.

Slurm starts a dependent once its upstream's current job has ended in any
way (``afterany``, ``launch/chain.py`` says why). What that end means is read
here, from the upstream's own run directory, by the one decider
(``contract/chain_links.chain_decision``): the condition holds (start, with the
``{after.NAME}`` values), can no longer hold (end: the upstream failed, or
completed where ``when: failed``), or the upstream stopped and may be
resumed (wait: end now, and its ``resume`` submits this run again). Global
rank 0 records an end in ``summary.json`` and ``.hpctrain/chain-ended.json``
so that ``status`` shows the reason; every task then exits without running.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract.chain_links import (
    Link,
    chain_decision,
    end_reason,
    outcome,
    upstream_values,
    write_chain_end,
)
from hpctrain.contract.summary import write_summary
from hpctrain.errors import UsageError
from hpctrain.jobspec.after import AFTER_PREFIX
from hpctrain.jobspec.chain_checks import placeholder_texts
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.script_args import after_names_used, fill_after


def begin(spec: JobSpec, run_dir: str, *, is_main: bool, exit_process: Callable[[int], object]) -> dict[str, str]:
    """The ``{after.NAME}`` values of a chained run that may start (``{}`` without ``after:``); a run whose
    condition does not hold ends here (``exit_process(0)``), its reason recorded by global rank 0."""
    if spec.after is None:
        return {}
    link = Link(Path(run_dir), Path(spec.after.run), spec.after.when)
    # Slurm starts this job once the upstream's current job has ended (or it had when this was submitted):
    # a summary still "running" then means that job lost its rank 0
    found = outcome(link.upstream, job_ended=True)
    decision = chain_decision(link.when, found)
    if decision != "start":
        reason = end_reason(link, found)
        print(f"hpctrain: {reason}", file=sys.stderr, flush=True)
        if is_main:
            write_chain_end(Path(run_dir), reason, link.upstream, decision)
            write_summary(Path(run_dir), {"status": "stopped", "stop_reason": reason})
        exit_process(0)
        return {}
    values = {AFTER_PREFIX + name: value for name, value in upstream_values(link.upstream).items()}
    missing = sorted({name for _, text in placeholder_texts(spec) for name in after_names_used(text)} - set(values))
    if missing:
        listed = ", ".join(f"{{{name}}}" for name in missing)
        raise UsageError(
            f"after: {link.upstream} {found} but has no value for {listed}",
            hint="{after.checkpoint} needs a complete checkpoint folder (hpctrain.task or the trainer); a script's "
            "own files are under {after.checkpoint_dir}",
        )
    return values


def fill_entrypoint_args(spec: JobSpec, values: Mapping[str, str]) -> JobSpec:
    """``spec`` with each ``{after.NAME}`` in a string ``entrypoint_args`` value replaced; other text verbatim."""
    if not values or not spec.entrypoint_args:
        return spec
    filled: dict[str, Any] = {
        key: fill_after(value, values, escaped=False) if isinstance(value, str) else value
        for key, value in spec.entrypoint_args.items()
    }
    return spec.model_copy(update={"entrypoint_args": filled})

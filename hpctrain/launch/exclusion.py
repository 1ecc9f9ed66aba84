"""Which nodes a submit keeps its job away from: the live entries of the user's bad-node ledger.

``submit`` (and ``--dry-run``, which shows the same ``#SBATCH --exclude``)
reads the ledger (``contract/bad_nodes.py``), keeps the entries of the job's
cluster profile that have not expired, and adds their nodes to ``--exclude``
(with any ``resources.slurm_extra: {exclude: ...}`` of the spec's own).
``--no-exclude`` (``exclude_bad_nodes=False``) leaves the ledger out.

A list the partition cannot satisfy is trimmed: when excluding every listed
node would leave fewer usable nodes than the job asks for
(``nodes + spare_nodes``), only the most recently listed nodes that still
leave enough are excluded, and the note says which were let through. A real
submit asks ``sinfo`` for the partition's usable nodes; a dry run asks Slurm
nothing, so it cannot trim and says so. A ledger that cannot be read (corrupt,
huge, a FIFO, another user's) is ignored with a note: never fatal. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpctrain.contract import bad_nodes
from hpctrain.contract.runfiles import printable
from hpctrain.contract.slurm import SlurmCommandError, checked_node_name
from hpctrain.jobspec.load import LoadedJob

Available = Callable[[str | None], list[str]]  # partition -> its usable nodes (raises SlurmCommandError)


@dataclass(frozen=True)
class Exclusion:
    """``nodes``: what ``--exclude`` gets (empty: no line); ``notes``: what the submit says about it."""

    nodes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def plan_exclusion(job: LoadedJob, *, use_ledger: bool = True, available: Available | None = None) -> Exclusion:
    """The nodes to exclude for ``job``; ``available``: how to ask for the partition's usable nodes
    (None: do not ask, as a dry run)."""
    spec = job.spec
    own = [n for n in str(spec.resources.slurm_extra.get("exclude") or "").split(",") if n]
    if not use_ledger or job.profile.scheduler == "local":
        return Exclusion(tuple(own))
    ledger = bad_nodes.read_ledger()
    notes = [f"bad-node ledger: {warning}" for warning in ledger.warnings]
    listed = []
    for entry in ledger.live(cluster=job.profile.name):
        try:
            listed.append((checked_node_name(entry.node), entry))
        except SlurmCommandError:
            notes.append(f"bad-node ledger: {printable(entry.node)[:40]!r} is not a node name; not excluded")
    if not listed:
        return Exclusion(tuple(own), tuple(notes))
    needed = spec.resources.allocated_nodes
    partition = spec.resources.partition
    kept = [node for node, _ in listed]
    if available is None:
        notes.append("bad-node ledger: not checked against the partition's free nodes (a dry run asks Slurm nothing)")
    else:
        try:
            usable = available(partition)
        except SlurmCommandError as exc:
            usable = None
            notes.append(f"bad-node ledger: could not count the partition's nodes ({exc.message}); excluding all")
        if usable is not None:
            kept = [node for node in kept if node in usable]
            room = max(0, len(set(usable) - set(own)) - needed)
            if len(kept) > room:
                dropped, kept = kept[: len(kept) - room], kept[len(kept) - room :] if room else []
                notes.append(
                    f"bad-node ledger lists {len(dropped) + len(kept)} of the {len(usable)} usable nodes of "
                    f"partition {partition or '(default)'}, but the job needs {needed}: not excluding "
                    f"{','.join(dropped)} (the oldest entries)"
                )
    why = {node: entry for node, entry in listed}
    for node in kept:
        entry = why[node]
        notes.append(f"excluding {node} (bad-node ledger: {entry.kind or 'bad'}: {printable(entry.reason)[:160]})")
    if kept:
        notes.append("'hpctrain nodes' lists the ledger; --no-exclude submits without it")
    return Exclusion(tuple(dict.fromkeys([*own, *kept])), tuple(notes))

"""The placeholders of a ``script:`` job's arguments: ``{rank}``, ``{master_port}``, ``{sweep.lr}``, ``{{``.

A script's ``args`` (and ``workdir``) are written once in the spec and filled
per process on the nodes, the way ``str.format`` fills a template: ``{name}``
is a value hpctrain knows there, ``{{`` and ``}}`` are literal braces, and
anything else with a brace is a mistake reported by ``validate``, never a
surprise in the job. ``{sweep.KEY}`` is the value a sweep trial gives KEY; it
is filled when the sweep is expanded, so each trial's ``spec.yaml`` shows its
own arguments. Pure and torch-free: the spec checks, ``--dry-run`` and the
task wrapper (``runtime/script/command.py``) all use these functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from hpctrain.jobspec.after_names import AFTER_PREFIX, after_known_list, is_after_name
from hpctrain.jobspec.script_inputs import CONTROL

# What each placeholder is, in the words --help and the docs use; the order is the one messages list them in.
PLACEHOLDERS: dict[str, str] = {
    "master_addr": "the rendezvous host (the job's first node)",
    "master_port": "the rendezvous port (derived from the job id, or distributed.master_port)",
    "world_size": "the number of ranks (nodes x resources.tasks_per_node)",
    "rank": "this process's global rank (per: rank only)",
    "local_rank": "this process's rank on its node (per: rank only)",
    "node_rank": "this node's index, 0 .. nnodes - 1",
    "nnodes": "the number of nodes",
    "nproc_per_node": "processes per node (resources.tasks_per_node)",
    "run_dir": "the run directory",
    "checkpoint_dir": "RUN_DIR/checkpoints, where a script keeps what it resumes from",
    "restart": "0 on the first start, +1 per requeue, resume or relaunch",
    "script_dir": "the folder of the script (its copy in the run directory, unless --no-snapshot)",
}
PER_RANK = ("rank", "local_rank")  # a process per node has no rank of its own
SWEEP_PREFIX = "sweep."

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class PlaceholderError(ValueError):
    """A brace that is neither a known placeholder nor an escaped literal."""


def known_list() -> str:
    """Every placeholder, as a message lists them."""
    return " ".join(f"{{{name}}}" for name in PLACEHOLDERS) + " {sweep.KEY} " + after_known_list()


def placeholders(text: str) -> list[str]:
    """The placeholder names in ``text``, in order (``{{``/``}}`` are literals). Raises ``PlaceholderError``
    for a lone brace."""
    names = []
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        if match.group(1) is None:
            raise PlaceholderError(
                f"a lone '{token}' at character {match.start() + 1}: write {{{{ or }}}} for a literal brace"
            )
        names.append(match.group(1))
    return names


def unknown_names(text: str) -> list[str]:
    """The names in ``text`` that are no placeholder (a ``sweep.KEY`` and a known ``after.NAME`` count as
    one); raises ``PlaceholderError`` for a lone brace."""
    return [
        name
        for name in placeholders(text)
        if name not in PLACEHOLDERS and not is_sweep_name(name) and not is_after_name(name)
    ]


def after_names_used(text: str) -> list[str]:
    """The ``after.NAME`` placeholders ``text`` uses, known or not (a malformed text names none)."""
    try:
        return [name for name in placeholders(text) if name.startswith(AFTER_PREFIX)]
    except PlaceholderError:
        return []


def is_sweep_name(name: str) -> bool:
    return name.startswith(SWEEP_PREFIX) and len(name) > len(SWEEP_PREFIX)


def sweep_keys_used(text: str) -> list[str]:
    """The sweep keys ``text`` names (``{sweep.lr}`` -> ``lr``); a malformed text names none."""
    try:
        return [name[len(SWEEP_PREFIX) :] for name in placeholders(text) if is_sweep_name(name)]
    except PlaceholderError:
        return []


def check_text(text: str) -> str:
    """One argument (or the workdir) as the spec accepts it: braces well-formed, every name a placeholder."""
    if CONTROL.search(text):
        raise ValueError(
            f"{text!r} contains control characters (a newline, tab, escape or NUL); write each argument on one line"
        )
    unknown = unknown_names(text)
    if unknown:
        listed = ", ".join(f"{{{name}}}" for name in unknown)
        raise ValueError(
            f"unknown placeholder {listed} in {text!r}; known: {known_list()} (write {{{{ for a literal brace)"
        )
    return text


def fill(text: str, values: Mapping[str, str]) -> str:
    """``text`` with every placeholder replaced by its value and ``{{``/``}}`` by a brace.

    A name without a value is a ``PlaceholderError`` naming it (the spec checks make that a bug).
    """

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        name = match.group(1)
        if name is None:
            raise PlaceholderError(f"a lone '{token}' in {text!r}")
        if name not in values:
            raise PlaceholderError(f"{{{name}}} has no value here")
        return values[name]

    return _TOKEN.sub(replace, text)


def fill_sweep(text: str, params: Mapping[str, object]) -> str:
    """``text`` with each ``{sweep.KEY}`` of ``params`` replaced by the trial's value (escaped, so a
    brace in a value stays a brace); every other token is kept for the nodes to fill."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is not None and is_sweep_name(name) and name[len(SWEEP_PREFIX) :] in params:
            return escape(value_text(params[name[len(SWEEP_PREFIX) :]]))
        return match.group(0)

    return _TOKEN.sub(replace, text)


def fill_after(text: str, values: Mapping[str, str], *, escaped: bool = True) -> str:
    """``text`` with each ``{after.NAME}`` of ``values`` (keyed ``after.NAME``) replaced by its value, escaped
    for a later :func:`fill` (``escaped=False``: as the final text); every other token is kept as written."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is not None and name.startswith(AFTER_PREFIX) and name in values:
            return escape(values[name]) if escaped else values[name]
        return match.group(0)

    return _TOKEN.sub(replace, text)


def escape(text: str) -> str:
    """A literal ``text`` in placeholder syntax."""
    return text.replace("{", "{{").replace("}", "}}")


def value_text(value: object) -> str:
    """A swept value as a command-line word: YAML's spelling for scalars, JSON for lists and mappings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)

"""``summary.json``'s record (hpctrain/contract/summary.py): every key the project writes is declared.

The writers are read as source (``ast``; nothing is imported, no torch): each
string key of a dict they build, of ``fields[...] = ...``/``summary[...] = ...``
and of ``fields.update(key=...)``, and every field of the trainer's
``Progress``. A reader then names a field instead of fishing in the extra keys.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hpctrain.contract.summary import OUTCOME_KEYS, Summary, kept_fields, parse_summary

PACKAGE = Path(__file__).resolve().parents[2] / "hpctrain"
# (module, function or class) that build what goes into summary.json
WRITERS = [
    ("runtime/hang.py", "hang_report"),
    ("runtime/failures.py", "record_failure"),
    ("trainer/reporting.py", "run_facts"),
    ("trainer/reporting.py", "summary"),
    ("trainer/reporting.py", "failed"),
    ("trainer/trainer.py", "write_summary"),
    ("trainer/trainer.py", "_progress_fields"),
    ("trainer/strategies/hogwild.py", "_end_epoch"),  # only its summary[...] = ... (its dicts are metrics)
    ("trainer/strategies/ps.py", "serve_step"),
    ("healing/record.py", "add_failure"),
    ("healing/record.py", "fail"),
]
NOT_SUMMARY = {"kind", "node", "step", "checkpoint_step", "reason", "action", "nodes", "time", "worker"}


def written_keys(module: str, name: str) -> set[str]:
    tree = ast.parse((PACKAGE / module).read_text())
    found = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name]
    keys: set[str] = set()
    for scope in found:
        for node in ast.walk(scope):
            if isinstance(node, ast.Dict) and "strategies" not in module:
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and _is_summary(node.value):
                if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                    keys.add(node.slice.value)
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "update":
                keys |= {keyword.arg for keyword in node.keywords if keyword.arg}
    return keys


def _is_summary(target: ast.expr) -> bool:
    """``summary[...]``, ``self.summary[...]``, ``fields[...]``: the dicts that become summary.json."""
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name in ("summary", "fields")


def progress_fields() -> set[str]:
    tree = ast.parse((PACKAGE / "trainer" / "state.py").read_text())
    (progress,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Progress"]
    return {n.target.id for n in progress.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_every_key_the_project_writes_into_summary_json_is_a_declared_field() -> None:
    written = set().union(*(written_keys(module, name) for module, name in WRITERS))
    written |= progress_fields() - {"epoch", "step_in_epoch"}  # the trainer leaves those two out
    assert {
        "hung_step",
        "hang_job_id",
        "stack_dumps",
        "steps_per_epoch",
        "hogwild_workers",
        "ps_rejected_pushes",
    } <= written
    undeclared = sorted(written - NOT_SUMMARY - set(Summary.model_fields))
    assert not undeclared, f"summary.json keys written but not declared on contract/summary.py's Summary: {undeclared}"


@pytest.mark.parametrize(
    ("raw", "field", "value"),
    [
        ({"hung_step": 7, "hang_job_id": "12", "stack_dumps": "/r/stacks"}, "hang_job_id", "12"),
        ({"epochs": 90, "steps_per_epoch": 5004}, "steps_per_epoch", 5004),
        ({"hung_step": "seven"}, "hung_step", None),  # the wrong type: dropped, the rest kept
        ({"hostnames": ["n1", "n2"], "deterministic": True}, "hostnames", ["n1", "n2"]),
    ],
)
def test_declared_fields_are_read_typed_and_tolerantly(raw: dict, field: str, value: object) -> None:
    summary = parse_summary({"status": "running", **raw})
    assert summary is not None and summary.status == "running" and getattr(summary, field) == value
    assert summary.fields() == {"status": "running", **raw}  # written back as it was, even a dropped value


def test_a_rewrite_keeps_what_others_wrote_and_decides_only_its_own_keys() -> None:
    current = parse_summary(
        {"status": "running", "total_steps": 7, "weights_sha256": "f" * 64, "note": "mine", "failed_rank": 2}
    )
    assert kept_fields(current) == {"total_steps": 7, "weights_sha256": "f" * 64, "note": "mine"}
    assert kept_fields(current, ("note", "excluded_nodes")) == {"note": "mine"}
    assert kept_fields(None) == {} and {"status", "stop_reason", "wall_s", "failed_rank"} <= OUTCOME_KEYS

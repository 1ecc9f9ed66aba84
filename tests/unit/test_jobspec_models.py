"""``JobSpec`` assembles the sections (jobspec/models.py): one module per section, named after its key, that
imports only the package's base layer; every name callers import from ``models`` is still there."""

from __future__ import annotations

import ast
import importlib
import typing
from pathlib import Path

from pydantic import BaseModel

from hpctrain.jobspec import models
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.section import Section

REPO = Path(__file__).resolve().parents[2]
# What a section module may import of the package (the charter's layer 1, hpctrain/jobspec/__init__.py).
BASE_LAYER = {
    f"hpctrain.jobspec.{name}" for name in ("section", "fields", "slurm_time", "strategy_traits", "after_names")
}


def section_fields() -> dict[str, type[BaseModel]]:
    """JobSpec's keys whose value is a section (``X``, ``X | None``), and that section's model."""
    found = {}
    for name, field in JobSpec.model_fields.items():
        for candidate in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(candidate, type) and issubclass(candidate, Section):
                found[name] = candidate
    return found


def test_each_section_lives_in_the_module_named_after_its_key() -> None:
    sections = section_fields()
    assert set(sections) >= {"resources", "trainer", "data", "distributed", "checkpoint", "signals", "health"}
    assert {"script", "container"} <= set(sections)  # optional sections count too
    misplaced = {
        key: model.__module__ for key, model in sections.items() if model.__module__ != f"hpctrain.jobspec.{key}"
    }
    assert not misplaced, f"a section's model belongs in hpctrain/jobspec/KEY.py (the package charter): {misplaced}"


def test_a_section_module_imports_only_the_base_layer_of_the_package() -> None:
    for key in section_fields():
        path = REPO / "hpctrain" / "jobspec" / f"{key}.py"
        imported = {
            node.module
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hpctrain.jobspec")
        }
        assert imported <= BASE_LAYER, (
            f"{path.name} imports {sorted(imported - BASE_LAYER)}: a section sits below JobSpec"
        )


def test_every_name_callers_import_from_models_is_still_there() -> None:
    wanted: dict[str, str] = {}
    for folder in ("hpctrain", "tests", "benchmarks", "tools", "examples"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
                if isinstance(node, ast.ImportFrom) and node.module == "hpctrain.jobspec.models":
                    wanted.update({alias.name: str(path.relative_to(REPO)) for alias in node.names})
    assert {"JobSpec", "Trainer", "Data", "Script", "Resources"} <= set(wanted)
    missing = {name: where for name, where in wanted.items() if not hasattr(models, name)}
    assert not missing, missing
    assert set(models.__all__) <= set(dir(models))


def test_the_schema_names_each_section_by_its_model() -> None:
    defs = JobSpec.model_json_schema()["$defs"]
    for key, model in section_fields().items():
        assert model.__name__ in defs, key
        assert importlib.import_module(model.__module__).__doc__, f"{model.__module__} needs its docstring"

"""The docs agree with the code: the spec reference is the generator's output,
every key the examples use is in the schema, and the cluster docs name every
built-in profile."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import BUILTIN_PROFILES

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "jobs").glob("*.yaml"))


def generator() -> ModuleType:
    path = REPO / "tools" / "gen_spec_reference.py"
    spec = importlib.util.spec_from_file_location("gen_spec_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spec_reference_is_up_to_date() -> None:
    committed = REPO / "docs" / "spec-reference.md"
    assert committed.exists(), "docs/spec-reference.md is missing: run python tools/gen_spec_reference.py"
    assert committed.read_text() == generator().render(), (
        "docs/spec-reference.md is out of date: run python tools/gen_spec_reference.py"
    )


def test_spec_reference_lists_every_key() -> None:
    text = (REPO / "docs" / "spec-reference.md").read_text()
    sections = {key.rpartition(".")[0] for key in schema_keys() if "." in key}
    for key in schema_keys():
        heading = f"{'#' * (key.count('.') + 2)} {key}\n"
        assert (heading if key in sections else f"| `{key}` |") in text, key


def schema_keys() -> set[str]:
    """Every dotted key a spec may contain (sections, nested sections and their fields)."""
    schema = JobSpec.model_json_schema()

    def walk(properties: dict[str, Any], prefix: str) -> set[str]:
        keys = set()
        for name, prop in properties.items():
            keys.add(prefix + name)
            # a section, or an optional one (anyOf: [section, null])
            for ref in [prop.get("$ref"), *(choice.get("$ref") for choice in prop.get("anyOf", []))]:
                if ref:
                    section = schema["$defs"][ref.rsplit("/", 1)[1]]
                    keys |= walk(section["properties"], f"{prefix}{name}.")
        return keys

    return walk(schema["properties"], "")


# Keys whose values are free-form mappings: their own keys are the user's, not the schema's.
FREE_FORM = {
    "env",
    "entrypoint_args",
    "sweep",
    "study",
    "resources.slurm_extra",
    "distributed.nccl_env",
    "tracking.mlflow.tags",
}


def used_keys(data: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys.add(dotted)
        if isinstance(value, dict) and dotted not in FREE_FORM:
            keys |= used_keys(value, f"{dotted}.")
    return keys


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_key_in_the_examples_is_in_the_schema(example: Path) -> None:
    data = yaml.safe_load(example.read_text())
    known = schema_keys()
    assert used_keys(data) <= known, sorted(used_keys(data) - known)
    for swept in data.get("sweep", {}):  # sweep keys are dotted spec keys too
        assert swept in known, f"sweep key {swept!r}"
    for studied in data.get("study", {}):  # so are study keys
        assert studied in known, f"study key {studied!r}"


def test_cluster_docs_name_every_builtin_profile() -> None:
    clusters = REPO / "docs" / "clusters.md"
    if not clusters.exists():
        pytest.skip("docs/clusters.md is not written yet")
    text = clusters.read_text()
    missing = [name for name in BUILTIN_PROFILES if f"`{name}`" not in text]
    assert not missing, f"docs/clusters.md does not describe the built-in profiles {missing}"


def test_the_own_loop_page_shows_the_tested_example_as_it_is() -> None:
    """docs/your-own-loop.md's complete loop is hpctrain/examples/own_loop.py's, line for line, in order."""
    page = (REPO / "docs" / "your-own-loop.md").read_text()
    marker = "<!-- example: hpctrain/examples/own_loop.py -->\n```python\n"
    assert marker in page
    shown = page.split(marker, 1)[1].split("```", 1)[0].splitlines()
    source = (REPO / "hpctrain" / "examples" / "own_loop.py").read_text().splitlines()
    position = 0
    for line in filter(str.strip, shown):
        assert line in source[position:], f"docs/your-own-loop.md shows a line the example does not have: {line!r}"
        position = source.index(line, position) + 1
    assert len(list(filter(str.strip, shown))) > 40

"""Turn pydantic validation errors into SpecProblems a researcher can act on:
the dotted key, its line, what is wrong and what is allowed (for an unknown
key, the closest valid one).
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from hpctrain.errors import SpecProblem
from hpctrain.jobspec.fields import PATTERN_RULES, shown_value


def _submodel(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    field = model.model_fields.get(key)
    if field is None:
        return None
    annotation = field.annotation
    candidates = [annotation, *typing.get_args(annotation)]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def model_at(root: type[BaseModel], path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the keys at ``path`` (None if not a model)."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None:
            return None
        model = _submodel(model, str(part))
    return model


def closest_key(root: type[BaseModel], path: tuple[Any, ...]) -> tuple[str | None, list[str]]:
    """For an unknown key at ``path``: the likeliest intended key and all valid ones."""
    owner = model_at(root, path[:-1])
    if owner is None:
        return None, []
    valid = sorted(owner.model_fields)
    # Names carry their unit ('gpus_per_node', 'timeout_s'): a bare 'gpus' or 'timeout' means one of them.
    prefixed = [key for key in valid if key.startswith(f"{path[-1]}_")]
    matches = prefixed or difflib.get_close_matches(str(path[-1]), valid, n=1, cutoff=0.5)
    return (matches[0] if matches else None), valid


def _describe(error: dict[str, Any], root: type[BaseModel]) -> str:
    kind = error["type"]
    loc = tuple(error["loc"])
    if kind == "extra_forbidden":
        suggestion, valid = closest_key(root, loc)
        text = "unknown key"
        if suggestion:
            text += f"; did you mean '{suggestion}'?"
        if valid:
            text += f" (valid keys here: {', '.join(valid)})"
        return text
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    got = shown_value(error.get("input"))  # bounded: the input may be a megabyte of text
    if kind in ("literal_error", "enum") and "ctx" in error:
        return f"{got} is not allowed; choose one of {error['ctx'].get('expected')}"
    if kind.endswith("_type") or kind.endswith("_parsing") or kind == "int_from_float":
        return f"{message.lower()} (got {type(error.get('input')).__name__} {got})"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return f"{message.lower()} (got {got})"
    if kind == "finite_number":
        return f"must be a finite number (got {got})"
    if kind == "missing":
        return "required key is missing"
    if kind == "string_pattern_mismatch":
        pattern = str(error.get("ctx", {}).get("pattern", ""))
        return f"{got} {PATTERN_RULES.get(pattern, f'does not match the pattern {pattern}')}"
    return message


def problems_from_validation(
    exc: ValidationError,
    positions: dict[str, tuple[int, int]],
    root: type[BaseModel],
    overridden: set[str] | None = None,
) -> list[SpecProblem]:
    """One SpecProblem per pydantic error, positioned where the YAML said it."""
    problems = []
    for error in exc.errors(include_url=False):
        # pydantic appends the union member / validator name for unions, e.g. ('x', 'int'); drop them.
        loc = tuple(part for part in error["loc"] if not (isinstance(part, str) and part in _UNION_TAGS))
        loc = loc[:-1] if loc[-1:] == ("[key]",) else loc  # a bad mapping key: reported at the key itself
        key = ".".join(str(part) for part in loc)
        message = _describe({**error, "loc": loc}, root)
        line, column = position_of(key, positions)
        if overridden and any(_from_override(key, o, positions) for o in overridden):
            message += " (from --set)"
            line = column = None
        problems.append(SpecProblem(key, message, line, column))
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0, p.column or 0))


def _from_override(key: str, override: str, positions: dict[str, tuple[int, int]]) -> bool:
    """The error is at the overridden key, inside it, or at a section only the override created."""
    created = override.startswith(key + ".") and key not in positions
    return key == override or key.startswith(override + ".") or created


_UNION_TAGS = {"int", "str", "float", "bool", "none", "list[str]", "dict[str,str]"}


def position_of(key: str, positions: dict[str, tuple[int, int]]) -> tuple[int | None, int | None]:
    """Line and column of ``key``, or of its nearest parent the YAML spelled out."""
    while key:
        if key in positions:
            return positions[key]
        key = key.rpartition(".")[0]
    return None, None

"""The placeholder grammar of a script's arguments (hpctrain/jobspec/script_args.py): pure functions."""

from __future__ import annotations

import pytest

from hpctrain.jobspec.script_args import (
    PLACEHOLDERS,
    PlaceholderError,
    check_text,
    escape,
    fill,
    fill_sweep,
    placeholders,
    sweep_keys_used,
    unknown_names,
    value_text,
)


def test_names_in_order_and_doubled_braces_are_literal() -> None:
    assert placeholders("tcp://{master_addr}:{master_port}") == ["master_addr", "master_port"]
    assert placeholders('{{"a": {rank}}}') == ["rank"]
    assert placeholders("no braces") == []


@pytest.mark.parametrize("text", ["{", "}", "a{b", "{rank", "rank}", "{{rank}", "x}y"])
def test_a_lone_brace_is_an_error_that_says_how_to_write_one(text: str) -> None:
    with pytest.raises(PlaceholderError, match=r"\{\{ or \}\}"):
        placeholders(text)


def test_fill_replaces_every_placeholder_and_unescapes() -> None:
    values = {"rank": "3", "master_addr": "n1", "master_port": "15000"}
    assert fill("--dist-url=tcp://{master_addr}:{master_port}", values) == "--dist-url=tcp://n1:15000"
    assert fill('{{"rank": {rank}}}', values) == '{"rank": 3}'
    with pytest.raises(PlaceholderError, match="has no value"):
        fill("{local_rank}", values)


def test_unknown_names_and_the_check_list_the_known_ones() -> None:
    assert unknown_names("{rnak} {rank} {sweep.lr}") == ["rnak"]
    with pytest.raises(ValueError) as caught:
        check_text("--rank={rnak}")
    message = str(caught.value)
    assert "unknown placeholder {rnak}" in message
    assert all(f"{{{name}}}" in message for name in PLACEHOLDERS) and "{sweep.KEY}" in message
    assert check_text("{{literal}}") == "{{literal}}"
    for bad in ("a\x00b", "two\nlines", "\x1b[31mred"):
        with pytest.raises(ValueError, match="control characters"):
            check_text(bad)


def test_sweep_placeholders_are_filled_per_trial_and_the_rest_kept_for_the_nodes() -> None:
    assert sweep_keys_used("--lr={sweep.lr} --x={sweep.a.b} {rank}") == ["lr", "a.b"]
    assert sweep_keys_used("{") == []
    filled = fill_sweep("--lr={sweep.lr} {{x}} {rank} {sweep.other}", {"lr": 0.1})
    assert filled == "--lr=0.1 {{x}} {rank} {sweep.other}"
    assert fill_sweep("{sweep.cfg}", {"cfg": {"a": 1}}) == '{{"a": 1}}', "a brace in a value stays a brace"
    assert fill(fill_sweep("{sweep.cfg}", {"cfg": {"a": 1}}), {}) == '{"a": 1}'


@pytest.mark.parametrize(
    ("value", "text"), [(True, "true"), (False, "false"), (None, "null"), (3, "3"), (0.5, "0.5"), ([1, 2], "[1, 2]")]
)
def test_swept_values_are_written_as_yaml_spells_them(value: object, text: str) -> None:
    assert value_text(value) == text


def test_escape_round_trips() -> None:
    for text in ("{", "}}", "a{b}c", "{{rank}}"):
        assert fill(escape(text), {}) == text

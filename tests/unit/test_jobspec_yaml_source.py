"""Reading a spec's text (hpctrain/jobspec/yaml_source.py): control characters anywhere are a spec problem
with a line and column, never a YAML traceback and never a line break a reader sees but a person does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobspec.yaml_source import read_spec_file

CONTROLS = ["\x80", "\x85", "\x9b", "\x9f", "\x7f", "\x01", "\x1b", "\x0b", "\x0c", "\u2028", "\u2029"]


@pytest.mark.parametrize("char", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
@pytest.mark.parametrize("where", ["value", "comment", "key", "flow list"])
def test_a_control_character_anywhere_is_named_with_its_place(char: str, where: str, tmp_path: Path) -> None:
    line = {
        "value": f"name: a{char}b",
        "comment": f"name: ab   # see{char}setup: [x]",
        "key": f"na{char}me: ab",
        "flow list": f"name: ab\nscript: {{path: t.py, args: ['x{char}']}}",
    }[where]
    path = tmp_path / "job.yaml"
    path.write_text(f"# a spec\n{line}\n", encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        read_spec_file(path)
    (problem,) = caught.value.problems
    assert problem.line == 2 + (where == "flow list") and problem.column is not None
    assert f"U+{ord(char):04X}" in problem.message
    assert char not in str(caught.value)


def test_tabs_line_ends_a_bom_and_bidi_text_still_read(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes("\ufeffname: a\r\nscript: {path: t.py, args: ['\u05d0\u05d1', 'caf\u00e9']}  # a\tb\r\n".encode())
    data, _ = read_spec_file(path)
    assert data["script"]["args"] == ["\u05d0\u05d1", "caf\u00e9"]


def test_many_are_reported_at_once_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: a\n" + "".join(f"k{i}: v\x85\n" for i in range(50)), encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        read_spec_file(path)
    assert len(caught.value.problems) == 10 and [p.line for p in caught.value.problems[:2]] == [2, 3]


HOSTILE = {
    "duplicate key": "name: a\nname: b\n",
    "a list as key": "name: a\n? [x]\n: 1\n",
    "a tag": "name: !!python/object:os.system x\n",
    "a bad date": "name: a\nwhen: 2026-13-45\n",
    "too many digits": "name: a\nn: " + "9" * 5000 + "\n",
    "a syntax error": "name: [a\n",
    "an alias bomb": "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
    + "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 10) + "]\n" for p, c in zip("abcdef", "bcdefg", strict=True)),
}


def parse_both(text: str) -> list[object]:
    """What each parser (libyaml's, the pure-Python one) makes of ``text``: data and positions, or the problem."""
    import yaml

    from hpctrain.jobspec import yaml_source

    found: list[object] = []
    for base in (getattr(yaml, "CSafeLoader", yaml.SafeLoader), yaml.SafeLoader):
        original = yaml_source._SpecLoader
        yaml_source._SpecLoader = yaml_source.spec_loader(base)
        try:
            found.append(yaml_source.parse_yaml_text(text, "job.yaml"))
        except SpecError as exc:
            found.append([(p.line, p.message.split(":")[0]) for p in exc.problems])
        finally:
            yaml_source._SpecLoader = original
    return found


@pytest.mark.parametrize("example", sorted(Path(__file__).resolve().parents[2].joinpath("jobs").glob("*.yaml")))
def test_both_parsers_read_every_example_alike(example: Path) -> None:
    """libyaml's parser where PyYAML has it, the pure-Python one otherwise: the same data and positions."""
    fast, pure = parse_both(example.read_text())
    assert fast == pure


@pytest.mark.parametrize("name", list(HOSTILE))
def test_both_parsers_refuse_hostile_text_alike(name: str) -> None:
    fast, pure = parse_both(HOSTILE[name])
    assert isinstance(fast, list) and fast == pure


def test_positions_count_characters_not_bytes() -> None:
    text = "name: a\ndata: {root: /dätä/ÿ, stage: node}\ntimes: 24:00:00\n"
    fast, pure = parse_both(text)
    assert fast == pure and fast[0]["times"] == "24:00:00" and fast[1]["data.stage"] == (2, 23)

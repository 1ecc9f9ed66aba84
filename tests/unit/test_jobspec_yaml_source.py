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

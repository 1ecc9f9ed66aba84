"""Text a user or a file wrote reaches the terminal escaped (hpctrain/errors.py: ``printable`` and
``SpecProblem.render``, the one place spec problems are formatted; the CLI's ``print_error``/``warn``).

Each case writes the hostile input itself: control characters in YAML keys, values, a profile's file
name, an override, the spec's own path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpctrain.cli.main import main
from hpctrain.errors import SpecError, SpecProblem, printable

RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")  # every control character but the newline


def validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["validate", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


pytestmark = pytest.mark.usefixtures("isolated")


def test_printable_escapes_controls_and_keeps_only_what_it_is_told() -> None:
    assert printable("a\x1b[31mb\nc\u202ed") == "a\\x1b[31mb\\x0ac\\x202ed"
    assert printable("one\ntwo\x07", keep="\n") == "one\ntwo\\x07"
    line = SpecProblem("resources.\x1b[2Jnodes\nerror: fake", "bad \x1b]0;title\x07", 3, 1).render("a\x1b.yaml")
    assert "\n" not in line and not RAW_CONTROL.search(line)
    assert line == "a\\x1b.yaml:3:1: resources.\\x1b[2Jnodes\\x0aerror: fake: bad \\x1b]0;title\\x07"


def test_control_characters_in_spec_keys_print_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "evil.yaml"
    spec.write_text(
        'name: evil\n"\\e[31mnodes\\e[0m": 1\nresources:\n  "gpus\\nerror: all good": 2\n'
        '  nodes: 1\nenv:\n  "A\\rB": "x"\n'
    )
    code, text = validate(capsys, str(spec))
    assert code == 2
    assert not RAW_CONTROL.search(text), text
    assert "\\x1b[31mnodes\\x1b[0m: unknown key" in text
    assert "resources.gpus\\x0aerror: all good: unknown key" in text
    assert not any(line.startswith("error: all good") for line in text.splitlines())


def test_values_overrides_and_profile_names_print_escaped(
    tmp_path: Path, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clusters = isolated / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "site\x1b[2J.yaml").write_text("scheduler: local\n")
    spec = tmp_path / "job\x1b[1m.yaml"
    spec.write_text('name: "a\\e[2Jb"\ncluster: nowhere\n')
    code, text = validate(capsys, str(spec), "--set", "trainer.\x1b]0;pwned\x07epochs=3")
    assert code == 2
    assert not RAW_CONTROL.search(text), text
    assert "site\\x1b[2J" in text  # the profile list names the file as it is, inert
    assert "job\\x1b[1m.yaml" in text
    assert "trainer.\\x1b]0;pwned\\x07epochs" in text


def test_every_error_and_hint_the_cli_prints_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from hpctrain.cli.main import print_error
    from hpctrain.errors import UsageError

    print_error(UsageError("no run \x1b[2Jhere\nsecond line", hint="try\n\x1b[31mthis"))
    err = capsys.readouterr().err
    assert err == "error: no run \\x1b[2Jhere\nsecond line\nhint: try\\x0a\\x1b[31mthis\n"
    assert str(SpecError("s\x07.yaml", [SpecProblem("k\x07", "m")])).count("\\x07") == 3
    # the file named in the first line too: a newline in a folder's name must not start a line of its own
    assert str(SpecError("d\nsetup: x/job.yaml", [SpecProblem("k", "m")])).splitlines()[0].startswith("d\\x0asetup")

"""Filling a YAML template (hpctrain/jobscript/templates.py): values through the YAML emitter, comments
escaped, so no text can add a key to what it is written into."""

from __future__ import annotations

import pytest
import yaml

from hpctrain.errors import UsageError
from hpctrain.jobscript.templates import fill_yaml

HOSTILE = ["a\u2028b: 1", "a\x85b: 1", "x\r\ny: 2", "- [1]", "yes", "01:00:00", "24:00:00", "~", "'\"", "a #b"]
HOSTILE += ["\u202e", "\u2029", "\ufeffkey: 1"]


@pytest.mark.parametrize("value", HOSTILE)
def test_any_text_stays_one_value_and_one_comment(value: str) -> None:
    text = fill_yaml("# made for {{v}}\nkey: {{v}}   # {{v}}\nother: {{n}}\n", {"v": value, "n": 3})
    assert yaml.safe_load(text) == {"key": value, "other": 3}
    assert all(c.isprintable() or c == "\n" for c in text) and len(text.splitlines()) == 3 + 2 * value.count("\n")


def test_a_newline_in_a_comment_starts_another_comment() -> None:
    text = fill_yaml("# {{v}}\nkey: 1\n", {"v": "first\nsetup: [x]"})
    assert text == "# first\n# setup: [x]\nkey: 1\n"


def test_lists_and_numbers_keep_their_types() -> None:
    text = fill_yaml("args: {{a}}\nn: {{n}}\nf: {{f}}\n", {"a": ["--x={rank}", "a b", "\u2028"], "n": 0, "f": 0.5})
    assert yaml.safe_load(text) == {"args": ["--x={rank}", "a b", "\u2028"], "n": 0, "f": 0.5}


def test_what_cannot_be_one_value_is_refused() -> None:
    with pytest.raises(UsageError, match="cannot be written"):
        fill_yaml("key: {{v}}\n", {"v": object()})


def test_an_installed_wheel_carries_every_template() -> None:
    """setup.cfg's data_files name every file of templates/ (``init --script`` read script_job.yaml from a
    checkout only: an installed hpctrain looks in <prefix>/share/hpctrain/templates)."""
    import configparser
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")
    listed = {Path(p.strip()).name for p in config["options.data_files"]["share/hpctrain/templates"].split(",")}
    assert listed == {p.name for p in (root / "templates").iterdir() if p.is_file()}

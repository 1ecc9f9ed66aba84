"""Find and fill the files in ``templates/``: the spec template ``hpctrain init``
writes and the shell preamble that carries setup lines into the sbatch script.

In a checkout they live at the repository root; an installed wheel carries them
in ``<prefix>/share/hpctrain/templates``.

The rule for text written into YAML (:func:`fill_yaml`): every value is emitted
by the YAML emitter (PyYAML, ASCII only, on one line: U+2028, NEL and ``\\r``
become escapes inside a quoted scalar) and read back to prove it is the same
value; text placed in a comment is escaped (:func:`hpctrain.errors.printable`)
and each newline it holds starts a new comment line. So no name, path or
argument, wherever it came from, can add a key to the spec it is written into.
"""

from __future__ import annotations

import re
import shlex
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from hpctrain.errors import HpctrainError, UsageError, printable

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def template_dirs() -> list[Path]:
    candidates = [Path(__file__).resolve().parents[2] / "templates"]
    for prefix in (sys.prefix, sysconfig.get_paths()["data"]):
        candidates.append(Path(prefix) / "share" / "hpctrain" / "templates")
    return candidates


def read_template(name: str) -> str:
    for directory in template_dirs():
        path = directory / name
        if path.is_file():
            return path.read_text()
    searched = ", ".join(str(d) for d in template_dirs())
    raise HpctrainError(f"template {name!r} not found (looked in {searched})", hint="reinstall hpctrain")


def fill(text: str, values: Mapping[str, str]) -> str:
    """Replace ``{{key}}`` placeholders; a missing value is a bug, not a blank."""

    def replace(match: re.Match[str]) -> str:
        return values[match.group(1)]

    return _PLACEHOLDER.sub(replace, text)


def yaml_scalar(value: object) -> str:
    """``value`` (a string, number, bool or list of them) as the YAML emitter writes it, on one ASCII line."""
    import yaml

    def dump(style: str | None) -> str:
        text = yaml.safe_dump(value, default_flow_style=True, default_style=style, allow_unicode=False, width=2**31)
        return text.removesuffix("\n...\n").rstrip("\n")

    out = ""
    try:
        out = dump(None)
        if "\n" in out and isinstance(value, str):
            out = dump('"')  # double-quoted: every line break is an escape
        same = yaml.safe_load(out) == value
    except yaml.YAMLError:
        same = False
    if not same or "\n" in out or not out.isascii():
        raise UsageError(f"{printable(value)!r} cannot be written into a spec as one value", hint="use plain text")
    return out


def comment_text(value: object) -> str:
    """``value`` for a YAML comment: every character that is not printable (controls, bidi, U+2028, NEL,
    a BOM) escaped as ``printable`` does, and each newline starting a new comment line (so nothing after it
    leaves the comment)."""
    text = "".join(c if c.isprintable() or c == "\n" else f"\\x{ord(c):02x}" for c in str(value))
    return text.replace("\n", "\n# ")


def _in_comment(text: str, start: int) -> bool:
    line = text[text.rfind("\n", 0, start) + 1 : start]
    return line.lstrip().startswith("#") or " #" in line


def fill_yaml(text: str, values: Mapping[str, object]) -> str:
    """A YAML template's ``{{key}}`` placeholders filled: in a comment by :func:`comment_text`, elsewhere by
    :func:`yaml_scalar` (the module docstring's rule)."""

    def replace(match: re.Match[str]) -> str:
        value = values[match.group(1)]
        return comment_text(value) if _in_comment(text, match.start()) else yaml_scalar(value)

    return _PLACEHOLDER.sub(replace, text)


def render_preamble(setup: list[str], env: Mapping[str, str], run_dir: str) -> list[str]:
    """The preamble as lines for submitit's ``setup`` parameter.

    Setup lines were validated to be single commands; env values and the run
    directory are shell-quoted so no spec string can run a command.
    """
    exports = "\n".join(f"export {key}={shlex.quote(str(value))}" for key, value in env.items())
    text = fill(
        read_template("preamble.sh"),
        {"setup": "\n".join(setup), "env": exports, "run_dir": shlex.quote(run_dir)},
    )
    return [line for line in text.splitlines() if line.strip()]


def render_slurm_relay(relay_dir: str) -> list[str]:
    """The batch-step loop that runs scontrol for tasks inside a container (runtime/slurm_relay.py)."""
    text = fill(read_template("slurm_relay.sh"), {"relay_dir": shlex.quote(relay_dir)})
    return [line for line in text.splitlines() if line.strip()]

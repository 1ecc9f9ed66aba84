"""Find and fill the files in ``templates/``: the spec template ``hpctrain init``
writes and the shell preamble that carries setup lines into the sbatch script.

In a checkout they live at the repository root; an installed wheel carries them
in ``<prefix>/share/hpctrain/templates``.
"""

from __future__ import annotations

import re
import shlex
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from hpctrain.errors import HpctrainError

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

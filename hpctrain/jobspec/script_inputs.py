"""What a ``script:`` job's arguments and working directory must be to reach its processes. Torch-free.

The rules, each checked by ``validate``/``submit``/``--dry-run`` instead of
failing at job start:

* every argument, **as each sweep trial fills it** (``{sweep.KEY}`` values
  included), holds no control character (C0, DEL, C1: a newline, an escape, a
  CSI) and is under Linux's limit for one argument, ``MAX_ARG_STRLEN``
  (128 KiB with its NUL: ``execve`` fails with E2BIG); all of them together
  stay under :data:`MAX_ARGS_BYTES`, well inside ``ARG_MAX``. Checked on
  every resolved spec (:func:`argument_problems`, from ``script_problems``),
  so each trial of a sweep is checked with its own values.
* ``workdir`` is not empty (an empty path would be the folder you submit
  from, silently): remove it for the run directory, or write ``.``.
* an absolute ``workdir`` can be created (:func:`workdir_problems`, a check of
  this machine's file system): no part of it is a file, and the nearest folder
  that exists is writable. A folder that does not exist at all here (a
  node-local ``/scratch``) is left to the nodes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.errors import SpecProblem, printable

if TYPE_CHECKING:
    from hpctrain.jobspec.models import Script

MAX_ARG_BYTES = 128 * 1024 - 1  # MAX_ARG_STRLEN (32 pages) less the NUL that ends the string
MAX_ARGS_BYTES = 1 << 20  # all arguments: ARG_MAX is commonly 2 MiB, shared with the environment
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # the argument rule (script_args.check_text uses it too)


def _shown(text: str, limit: int = 60) -> str:
    short = text if len(text) <= limit else text[:limit] + "..."
    return repr(printable(short))


def argument_problems(script: Script) -> list[SpecProblem]:
    """Each argument (and the workdir) as filled for this spec: characters and sizes (the module docstring)."""
    problems = []
    texts = [(f"script.args.{index}", arg) for index, arg in enumerate(script.args)]
    if script.workdir is not None:
        texts.append(("script.workdir", script.workdir))
    total = 0
    for key, text in texts:
        if CONTROL.search(text):
            problems.append(
                SpecProblem(key, f"{_shown(text)} contains control characters; write each argument on one line")
            )
        size = len(text.encode("utf-8", "surrogateescape"))
        total += size + 1
        if size > MAX_ARG_BYTES:
            problems.append(
                SpecProblem(
                    key,
                    f"{_shown(text)} is {size:,} bytes; Linux passes no argument over 128 KiB "
                    "(the job would fail to start): put the value in a file and pass its path",
                )
            )
    if total > MAX_ARGS_BYTES:
        problems.append(
            SpecProblem(
                "script.args",
                f"the arguments total {total:,} bytes, over {MAX_ARGS_BYTES:,}: put the values in a file and "
                "pass its path",
            )
        )
    if script.workdir == "":
        problems.append(
            SpecProblem(
                "script.workdir",
                "is empty, which would be the folder you submit from; remove it (the run directory) or write '.'",
            )
        )
    return problems


def workdir_problems(script: Script) -> list[SpecProblem]:
    """Whether an absolute ``workdir`` can be created on this machine's file system (the module docstring)."""
    workdir = script.workdir
    if not workdir or not workdir.startswith("/") or "{" in workdir:
        return []
    path = Path(workdir)
    for folder in [path, *path.parents]:
        try:
            is_dir = folder.is_dir()
            exists = is_dir or folder.exists()
        except OSError:
            continue
        if exists and not is_dir:
            return [SpecProblem("script.workdir", f"{printable(folder)} is a file, so {printable(path)} cannot exist")]
        if is_dir:
            if folder == path or folder.parent == folder:
                return []  # there already, or only / exists here (a node-local folder)
            if not os.access(folder, os.W_OK | os.X_OK):
                return [
                    SpecProblem(
                        "script.workdir",
                        f"{printable(path)} cannot be created: {printable(folder)} is not writable by you; "
                        "pick a folder you own (or leave workdir out for the run directory)",
                    )
                ]
            return []
    return []

"""What a ``script:`` section must agree with before anything is queued: the rest of the spec, the sweep,
and the file system of the machine that submits.

``check_resolved`` (load.py) calls :func:`script_problems` on every resolved
spec, so ``validate``, ``submit`` and ``--dry-run`` report an impossible
combination or a placeholder that cannot be filled, each with its key and the
fix, all at once; :func:`program_problems` (a missing script or module) is
asked by the same three (``launch/script_code.require_program``), not by every
load of a spec. :func:`module_file` finds a ``module:`` the way ``python -m``
on a node would, without importing it. Torch-free.
"""

from __future__ import annotations

import errno
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.errors import SpecProblem
from hpctrain.jobspec.script_args import PER_RANK, PlaceholderError, placeholders, sweep_keys_used
from hpctrain.jobspec.script_inputs import argument_problems, workdir_problems

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec, Script

# Seconds a time-limit stop keeps for hpctrain's requeue after the script's exit (see runtime/script/child.py).
REQUEUE_MARGIN_S = 15


def script_problems(spec: JobSpec) -> list[SpecProblem]:
    """Every reason the spec's script cannot run as written (none without ``script:``)."""
    script = spec.script
    if script is None:
        return []
    problems: list[SpecProblem] = []
    if spec.entrypoint is not None:
        problems.append(
            SpecProblem(
                "script",
                "script: and entrypoint: are two ways to run your code, and a job runs one; "
                "keep script: for a file you run with python, entrypoint: for a function hpctrain calls",
            )
        )
    if spec.entrypoint_args:
        problems.append(SpecProblem("entrypoint_args", "is for entrypoint:; give a script its options in script.args"))
    if script.per == "node" and spec.launcher == "torchrun":
        problems.append(
            SpecProblem(
                "script.per",
                "per: node runs one process per node that starts its own workers, and launcher: torchrun starts "
                "the workers itself; use per: rank with launcher: torchrun, or per: node with launcher: srun",
            )
        )
    if script.stop_signal == spec.signals.timeout_signal:
        problems.append(
            SpecProblem(
                "script.stop_signal",
                f"{script.stop_signal} is also signals.timeout_signal, the time-limit warning hpctrain receives; "
                f"choose another ({', '.join(s for s in ('TERM', 'INT', 'USR1') if s != script.stop_signal)})",
            )
        )
    if script.stop_timeout_s is not None and script.stop_timeout_s + REQUEUE_MARGIN_S > spec.signals.signal_delay_s:
        most = spec.signals.signal_delay_s - REQUEUE_MARGIN_S
        problems.append(
            SpecProblem(
                "script.stop_timeout_s",
                f"{script.stop_timeout_s} s to stop, plus {REQUEUE_MARGIN_S} s to requeue, does not fit in "
                f"signals.signal_delay_s ({spec.signals.signal_delay_s} s before the time limit); "
                + (f"use at most {most}, or " if most >= 1 else "")
                + "raise signals.signal_delay_s",
            )
        )
    if spec.health.eviction.enabled is True:
        problems.append(
            SpecProblem(
                "health.eviction.enabled",
                "true, but eviction compares the ranks' compute times, which only the built-in trainer and an "
                "entrypoint's task.StepTimer report: a script job is never evicted from; remove it (or set it to auto)",
            )
        )
    problems += _per_node_problems(script)
    problems += _sweep_problems(spec)
    problems += argument_problems(script)  # as this spec (a sweep trial) fills them: script_inputs.py
    return problems


def _texts(script: Script) -> list[tuple[str, str]]:
    """(key, text) of everything with placeholders: each argument, and the workdir."""
    texts = [(f"script.args.{index}", arg) for index, arg in enumerate(script.args)]
    return texts + ([("script.workdir", script.workdir)] if script.workdir is not None else [])


def _per_node_problems(script: Script) -> list[SpecProblem]:
    if script.per != "node":
        return []
    problems = []
    for key, text in _texts(script):
        try:
            names = [name for name in placeholders(text) if name in PER_RANK]
        except PlaceholderError:
            continue  # the section's own check reports it
        if names:
            problems.append(
                SpecProblem(
                    key,
                    f"{{{names[0]}}} in {text!r}: per: node starts one process per node, which has no "
                    f"{names[0].replace('_', ' ')}; pass {{node_rank}} and {{nproc_per_node}} and let the script "
                    "number its workers, or use per: rank",
                )
            )
    return problems


def _sweep_problems(spec: JobSpec) -> list[SpecProblem]:
    """``{sweep.KEY}`` names a swept key; a swept key that is no spec key is a script parameter, used somewhere."""
    script = spec.script
    assert script is not None
    problems, used = [], set()
    for key, text in _texts(script):
        for name in sweep_keys_used(text):
            used.add(name)
            if name not in spec.sweep:
                problems.append(
                    SpecProblem(
                        key,
                        f"{{sweep.{name}}} in {text!r}, but the spec sweeps "
                        + (f"only {', '.join(sorted(spec.sweep))}" if spec.sweep else "nothing")
                        + f"; add sweep: {{{name}: [...]}} or write the value",
                    )
                )
    for key in spec.sweep:
        if not is_spec_key(key) and key not in used:
            problems.append(
                SpecProblem(
                    f"sweep.{key}",
                    f"is no spec key, so it is a parameter of the script, but no script argument uses it; "
                    f"add {{sweep.{key}}} to script.args",
                )
            )
    return problems


def raw_program_problems(section: object) -> list[SpecProblem]:
    """:func:`program_problems` of a ``script:`` section in a spec that did not validate (another key is
    wrong, or this section): its ``path``, when it names one, so that every mistake is reported at once."""
    if not isinstance(section, dict) or not isinstance(section.get("path"), str) or not section["path"].strip():
        return []
    try:
        return _path_problems(Path.cwd() / Path(section["path"]).expanduser())
    except (OSError, ValueError, RuntimeError):  # a NUL byte, ~nobody: the section's own checks say what is wrong
        return []


def _path_problems(path: Path) -> list[SpecProblem]:
    broken = _broken_link(path)
    if broken is not None:
        return [SpecProblem("script.path", f"{path} is {broken}; name the script itself")]
    if not path.exists():
        return [
            SpecProblem(
                "script.path",
                f"{path} does not exist (a relative path is read from where you run hpctrain, {Path.cwd()})",
            )
        ]
    if not path.is_file():
        return [SpecProblem("script.path", f"{path} is not a regular file; name the script itself")]
    if not os.access(path, os.R_OK):
        return [SpecProblem("script.path", f"{path} is not readable by you")]
    return []


def is_spec_key(key: str) -> bool:
    """Whether a dotted sweep key names the spec (a top-level field), rather than a script's own parameter."""
    from hpctrain.jobspec.models import JobSpec

    return key.split(".")[0] in JobSpec.model_fields


def program_problems(spec: JobSpec) -> list[SpecProblem]:
    """The script file or module exists here (after ``absolute_paths``: the path is absolute), and an
    absolute ``workdir`` can be created (``script_inputs.workdir_problems``).

    Not part of :func:`script_problems`: ``validate``, ``submit`` and ``--dry-run`` ask it of the spec a
    user submits, but a run's own ``spec.yaml`` loads (``resume``) after the file moved, since every
    attempt runs the run's copy of it.
    """
    assert spec.script is not None
    return _program_problems(spec) + workdir_problems(spec.script)


def _program_problems(spec: JobSpec) -> list[SpecProblem]:
    script = spec.script
    assert script is not None
    if script.path is not None:
        return _path_problems(Path(script.path))
    if spec.container is not None:
        return []  # the module may exist only inside the image
    assert script.module is not None
    if module_file(script.module) is None:
        return [
            SpecProblem(
                "script.module",
                f"{script.module} is not found from here (the current folder and this Python's sys.path); "
                "install its package in the job's environment, run hpctrain from the folder that holds it, "
                "or name the file with script.path",
            )
        ]
    return []


def _broken_link(path: Path) -> str | None:
    """What is wrong with ``path`` when it is a symlink that leads nowhere: a loop, or a missing target."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop (or leads through one)"
        if path.is_symlink():
            return f"a symlink to {os.readlink(path)}, which does not exist"
    return None


def module_file(module: str, search_path: Sequence[str] | None = None) -> Path | None:
    """The file ``python -m MODULE`` runs (``pkg/mod.py``, or a package's ``__main__.py``), found without
    importing anything; None when it is not there."""
    paths = list(search_path) if search_path is not None else [os.getcwd(), *(p for p in sys.path if p)]
    parts = module.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], paths)
    for part in parts[1:]:
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package runs its __main__
        for location in spec.submodule_search_locations:
            main = Path(location) / "__main__.py"
            if main.is_file():
                return main
        return None
    if spec.origin and spec.origin not in ("built-in", "frozen") and Path(spec.origin).is_file():
        return Path(spec.origin)
    return None

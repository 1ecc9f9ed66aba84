"""Jobs pickled before the programs moved (issue 36) still unpickle: a requeue across an upgrade resumes.

The fixtures in ``golden/old_layout/`` are the files submitit wrote for each program that
``launch/submission.py`` pickles (``DelayedSubmission(launcher).dump(...)``, as submitit's executor
does), made by hpctrain at commit 0e33d8e, before the move, with submitit 1.5.4::

    DelayedSubmission(TaskLauncher({"name": "old-layout"}, "/runs/old", "/runs/old/code")).dump(...)

(likewise ``TorchrunNodeLauncher``, and ``ScriptLauncher`` / ``ScriptTorchrunNode`` with a code record
and a 30 s preemption grace). Delete none of them: they are what a job submitted then holds.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import pytest

import hpctrain

OLD = Path(__file__).parent / "golden" / "old_layout"
PACKAGE = Path(hpctrain.__file__).resolve().parent
SPEC, RUN, CODE = {"name": "old-layout"}, "/runs/old", {"file": "/runs/old/code/train.py", "module": None}
PICKLED = {  # fixture -> (old module, class, the state it was pickled with)
    "task_launcher": ("hpctrain.runtime.launcher", "TaskLauncher", {"code_root": "/runs/old/code"}),
    "torchrun_node": ("hpctrain.runtime.torchrun_node", "TorchrunNodeLauncher", {"code_root": "/runs/old/code"}),
    "script_launcher": ("hpctrain.runtime.script_launcher", "ScriptLauncher", {"code": CODE, "preempt_grace_s": 30.0}),
    "script_torchrun_node": (
        "hpctrain.runtime.script_torchrun",
        "ScriptTorchrunNode",
        {"code": CODE, "preempt_grace_s": 30.0},
    ),
}

LOAD_IN_A_FRESH_PROCESS = """
import json, sys
from submitit.core.utils import DelayedSubmission
out = {}
for name, path in json.loads(sys.argv[1]).items():
    job = DelayedSubmission.load(path)  # what submitit's _submit does on every (re)start of the job
    cls = type(job.function)
    out[name] = [cls.__module__, cls.__qualname__, vars(job.function), callable(job.function)]
print(json.dumps(out))
"""


def globals_named(data: bytes) -> set[str]:
    """The module strings a pickle names (protocol 4+: the string pushed before STACK_GLOBAL's name)."""
    strings = [arg for op, arg, _ in pickletools.genops(data) if isinstance(arg, str)]
    return {s for s in strings if s.startswith("hpctrain.")}


@pytest.mark.parametrize("fixture", sorted(PICKLED))
def test_each_fixture_names_the_old_module(fixture: str) -> None:
    old_module, _, _ = PICKLED[fixture]
    assert globals_named((OLD / f"{fixture}_submitted.pkl").read_bytes()) == {old_module}


def test_a_job_pickled_before_the_move_unpickles_to_the_program_where_it_lives_now() -> None:
    paths = {name: str(OLD / f"{name}_submitted.pkl") for name in PICKLED}
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run(
        [sys.executable, "-c", LOAD_IN_A_FRESH_PROCESS, json.dumps(paths)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    for name, (old_module, cls, state) in PICKLED.items():
        new_module = hpctrain._OLD_PROGRAM_NAMES[old_module]
        module, qualname, fields, is_callable = loaded[name]
        assert (module, qualname, is_callable) == (new_module, cls, True)
        assert fields == {"spec_data": SPEC, "run_dir": RUN, "code_root": None, **state}


def test_the_old_name_gives_the_same_class_not_a_copy() -> None:
    from hpctrain.programs.launcher import TaskLauncher

    data = (OLD / "task_launcher_submitted.pkl").read_bytes()
    assert type(pickle.loads(data).function) is TaskLauncher
    import hpctrain.runtime.launcher as old  # the alias module itself

    assert old.TaskLauncher is TaskLauncher and (old.__doc__ or "").startswith("Moved to hpctrain.programs.launcher")
    assert not (PACKAGE / "runtime" / "launcher.py").exists(), "the old names are aliases, not files"


def test_the_finder_answers_only_the_old_names() -> None:
    assert hpctrain._OldNames.find_spec("hpctrain.runtime.no_such_piece") is None
    with pytest.raises(ModuleNotFoundError):
        __import__("hpctrain.runtime.no_such_piece")
    assert hpctrain._OldNames in sys.meta_path  # import hpctrain put it there


def test_the_old_names_are_exactly_the_programs_submitit_pickles() -> None:
    """A program ``launch/task_programs.py`` builds for submitit is pickled by name: it keeps its old name here."""
    tree = ast.parse((PACKAGE / "launch" / "task_programs.py").read_text())
    pickled = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpctrain.programs.")
    }
    assert pickled == set(hpctrain._OLD_PROGRAM_NAMES.values())

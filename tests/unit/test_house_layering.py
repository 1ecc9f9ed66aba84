"""The house's layering, read from the ``import`` statements of every module in hpctrain/ (issue 17).

Top-level imports and imports inside functions alike (``ast``, nothing is
imported). Each rule fails with the list of offending imports, as
``module:line (function) imports name``.

* A CLI verb (``cli/cmd_*.py``) never imports another verb: shared logic lives
  in the library packages beneath them.
* ``contract/`` imports nothing of the project but ``hpctrain.errors`` and
  itself: both sides import it, so it must stand alone.
* The login side (contract, jobspec, jobscript, launch, observe, diagnose, cli, dataset, tracking, planning,
  remote) never imports torch, torchvision, ``hpctrain.trainer`` or the public
  task API ``hpctrain.task`` (login nodes are slow and shared). A function-level
  import inside a helper that only runs where torch belongs may be let through
  by :data:`TASK_ONLY`.
* ``hpctrain.task`` (what a user's own loop imports) never imports the
  built-in trainer: the trainer is built on the task API, not the reverse.
* The login side imports ``hpctrain.runtime`` and ``hpctrain.programs`` only for
  what is pickled into the job (the programs), or where
  :data:`RUNTIME_ON_THE_LOGIN_SIDE` says why: they are the tasks' packages, not a
  library for the login side.
* The task side flows down (issue 36): ``programs/`` (what a task runs) ->
  ``healing/`` -> ``trainer/`` -> ``task/`` -> ``runtime/`` (the pieces). A piece
  of ``runtime/`` imports neither a program, ``healing/`` nor ``trainer/``; the
  trainer never imports healing; a program is imported only by another program
  and by ``launch/task_programs.py`` (which builds it for submitit to pickle).
* No argv that starts with a Slurm client command (``sbatch``, ``squeue``,
  ``scontrol``...) is written outside the one client, ``contract/slurm.py``:
  neither a list or tuple literal nor a call's first argument.
* ``ssh`` (and scp, sftp, rsync) is started only by ``remote/ssh.py``: one
  connection per cluster, in BatchMode after the one interactive login.
* Only the tracking wing (``hpctrain/tracking/``) imports a tracker library
  (``wandb``, ``mlflow``), and the task side (the trainer, the task API, the
  runtime that runs scripts, the healing wing) never imports the wing:
  trackers read the run directory, training never waits on them.
* The login side flows down too (issue 36), in :data:`LOGIN_FLOORS`' order:
  no package imports one standing above it (``planning/`` is handed launch's
  submit, the tracking wing asks ``launch/run_state.py`` whether a run has
  ended), and nothing beneath the package face imports it.
* At most five modules lie loose in ``hpctrain/``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hpctrain"
LOGIN_SIDE = (
    "contract", "jobspec", "jobscript", "launch", "observe", "diagnose", "cli", "dataset", "tracking", "planning",
    "remote",
)  # fmt: skip
TRACKER_LIBRARIES = ("wandb", "mlflow")
TASK_SIDE = (
    "hpctrain.trainer",
    "hpctrain.task",
    "hpctrain.runtime",
    "hpctrain.healing",
    "hpctrain.programs",
    "hpctrain.examples",
)
HEAVY = ("torch", "torchvision", "hpctrain.trainer", "hpctrain.task")
MAX_LOOSE_MODULES = 5
# The login side's packages from the ground up: each imports only those before it (and the task side's
# packages where the rules below let it). farm-studio's "arrows that run back up" are these imports.
LOGIN_FLOORS = (
    "contract", "jobspec", "jobscript", "dataset", "diagnose", "planning", "launch", "tracking", "observe", "remote"
)  # fmt: skip
TASK_PACKAGES = ("hpctrain.runtime", "hpctrain.programs")
# (importer, or a package of importers; the program it may import) -> why.
PROGRAM_IMPORTERS = {
    ("hpctrain.programs", "hpctrain.programs"): "a program builds on another (a torchrun worker is a TaskLauncher)",
    ("hpctrain.launch.task_programs", "hpctrain.programs"): "it builds the program submitit pickles into the job",
}

# (module, function, imported name prefix) -> why only a task (or a compute node) runs that function.
TASK_ONLY = {
    (
        "hpctrain.dataset.index",
        "torch_broadcast",
        "torch",
    ): "the leader's index broadcast, inside a task's process group",
    ("hpctrain.diagnose.probe", "report", "torch"): "the probe's node side, run as a job on a compute node",
    ("hpctrain.diagnose.data_bench_job", "measure", "torch"): (
        "bench-data measures decode and training rates with torch where it runs (here or --slurm's node), "
        "only after the spec and data root are checked"
    ),
    ("hpctrain.diagnose.data_bench_job", "measure", "hpctrain.trainer"): "the same measurement: the trainer's pipeline",
}
# The commands that talk to Slurm's controller or database. ``srun`` is not among them: it starts the tasks
# inside the batch script (jobscript/sbatch_script.py) and the healing supervisor's steps.
SLURM_COMMANDS = frozenset(
    {"sbatch", "squeue", "sacct", "sacctmgr", "scontrol", "scancel", "sinfo", "sstat", "sprio", "sshare", "salloc"}
)
SLURM_CLIENT = "hpctrain.contract.slurm"
# The remote wing's one connection is the only starter of ssh (its argv begins with ssh.SSH).
SSH_COMMANDS = frozenset({"ssh", "scp", "sftp", "rsync", "sshpass"})
SSH_CLIENT = "hpctrain.remote.ssh"

# (login-side module, runtime module it imports) -> why.
RUNTIME_ON_THE_LOGIN_SIDE = {
    ("hpctrain.launch.task_programs", "hpctrain.programs.launcher"): "the task launcher submitit pickles into the job",
    ("hpctrain.launch.task_programs", "hpctrain.programs.torchrun_node"): "the torchrun node launcher, likewise",
    ("hpctrain.launch.task_programs", "hpctrain.programs.script_launcher"): "a script job's task wrapper, pickled too",
    ("hpctrain.launch.task_programs", "hpctrain.programs.script_torchrun"): "a script job's torchrun node task",
    ("hpctrain.launch.dry_run", "hpctrain.runtime.script.command"): (
        "--dry-run prints every script process's command line from the wrapper's own functions, so it cannot drift"
    ),
    ("hpctrain.launch.dry_run", "hpctrain.runtime.rank_plan"): (
        "--dry-run prints each rank's device and backend from the tasks' own decisions, so the table cannot drift"
    ),
    ("hpctrain.launch.submission", "hpctrain.runtime.rank_plan"): (
        "a local run's tasks see the GPUs the tasks' own rule picks (local_visible_devices), as --dry-run prints"
    ),
    ("hpctrain.dataset.mount_release", "hpctrain.runtime.cleanup"): (
        "runs in a task only: the node's mount watcher starts and detaches as the task's reaper does"
    ),
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    line: int
    function: str  # the enclosing function ("" at module level)
    name: str  # the imported module, dotted

    def __str__(self) -> str:
        where = f" (in {self.function})" if self.function else ""
        return f"{self.module}:{self.line}{where} imports {self.name}"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> Iterator[Import]:
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node: ast.AST, function: str) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = f"{function}.{child.name}" if function else child.name
            if isinstance(child, ast.Import):
                yield from (Import(module, child.lineno, function, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    name = f"{base}.{child.module}" if child.module else base
                else:
                    name = child.module or ""
                yield Import(module, child.lineno, function, name)
                if name.startswith("hpctrain"):  # ``from hpctrain.cli import cmd_submit`` imports a module too
                    yield from (Import(module, child.lineno, function, f"{name}.{a.name}") for a in child.names)
            yield from walk(child, inner)

    yield from walk(ast.parse(path.read_text(), str(path)), "")


ALL_IMPORTS = [found for path in sorted(PACKAGE.rglob("*.py")) for found in imports_of(path)]


def is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def offenders(found: list[Import]) -> str:
    return "\n  " + "\n  ".join(sorted({str(item) for item in found}))


def test_the_scan_sees_top_level_and_function_level_imports() -> None:
    modules = {item.module for item in ALL_IMPORTS}
    assert {"hpctrain.contract.slurm", "hpctrain.cli.main", "hpctrain.trainer.trainer"} <= modules
    assert any(item.function for item in ALL_IMPORTS) and any(not item.function for item in ALL_IMPORTS)


def test_no_verb_imports_another_verb() -> None:
    def is_verb(name: str) -> bool:
        return name.startswith("hpctrain.cli.cmd_")

    found = [item for item in ALL_IMPORTS if is_verb(item.module) and is_verb(item.name)]
    assert not found, "a CLI verb imports another verb; move the shared part into a library package:" + offenders(found)


def test_the_contract_imports_nothing_of_the_project_but_errors() -> None:
    found = [
        item
        for item in ALL_IMPORTS
        if is_under(item.module, "hpctrain.contract")
        and is_under(item.name, "hpctrain")
        and not (is_under(item.name, "hpctrain.errors") or is_under(item.name, "hpctrain.contract"))
    ]
    assert not found, "contract/ must stand alone (both sides import it):" + offenders(found)


def test_the_login_side_never_imports_torch_or_the_trainer() -> None:
    found, allowed = [], set()
    for item in ALL_IMPORTS:
        side = item.module.split(".")[1] if item.module.count(".") else ""
        heavy = next((prefix for prefix in HEAVY if is_under(item.name, prefix)), None)
        if side not in LOGIN_SIDE or heavy is None:
            continue
        key = (item.module, item.function, heavy)
        if item.function and key in TASK_ONLY:
            allowed.add(key)
        else:
            found.append(item)
    assert not found, (
        "login-side code imports torch/torchvision/hpctrain.trainer; move it to the task side, or (inside a "
        "function that only tasks call) add it to TASK_ONLY with the reason:" + offenders(found)
    )
    stale = set(TASK_ONLY) - allowed
    assert not stale, f"TASK_ONLY entries no longer needed, remove them: {sorted(stale)}"


def test_the_task_api_never_imports_the_trainer() -> None:
    found = [
        item
        for item in ALL_IMPORTS
        if is_under(item.module, "hpctrain.task") and is_under(item.name, "hpctrain.trainer")
    ]
    assert not found, "hpctrain.task must not depend on the built-in trainer (move the shared part into task):" + (
        offenders(found)
    )


def test_the_package_root_never_imports_the_task_side() -> None:
    roots = ("hpctrain", "hpctrain.api", "hpctrain.errors", "hpctrain.__main__")
    found = [
        item for item in ALL_IMPORTS if item.module in roots and any(is_under(item.name, heavy) for heavy in HEAVY)
    ]
    assert not found, "`import hpctrain` must stay light (no torch, trainer or task API):" + offenders(found)


def test_the_login_side_imports_the_runtime_only_for_the_job() -> None:
    found, allowed = [], set()
    for item in ALL_IMPORTS:
        side = item.module.split(".")[1] if item.module.count(".") else ""
        task_package = next((p for p in TASK_PACKAGES if is_under(item.name, p)), None)
        if side not in LOGIN_SIDE or task_package is None or item.name == task_package:
            continue
        key = next((k for k in RUNTIME_ON_THE_LOGIN_SIDE if k[0] == item.module and is_under(item.name, k[1])), None)
        if key is not None:
            allowed.add(key)
        else:
            found.append(item)
    assert not found, (
        "login-side code imports hpctrain.runtime or hpctrain.programs (the tasks' packages); move what both "
        "sides need into contract/, what the login side needs to its own package, or (for what is pickled "
        "into the job) add it to RUNTIME_ON_THE_LOGIN_SIDE with the reason:" + offenders(found)
    )
    stale = set(RUNTIME_ON_THE_LOGIN_SIDE) - allowed
    assert not stale, f"RUNTIME_ON_THE_LOGIN_SIDE entries no longer needed, remove them: {sorted(stale)}"


def test_the_runtime_pieces_never_import_a_program_healing_or_the_trainer() -> None:
    above = ("hpctrain.programs", "hpctrain.healing", "hpctrain.trainer")
    found = [
        item
        for item in ALL_IMPORTS
        if is_under(item.module, "hpctrain.runtime") and any(is_under(item.name, name) for name in above)
    ]
    assert not found, (
        "a piece of runtime/ imports what stands above it; hand the piece what it needs from the program "
        "that calls it, or move the shared part down into runtime/:" + offenders(found)
    )


def test_the_trainer_never_imports_healing() -> None:
    found = [
        item
        for item in ALL_IMPORTS
        if is_under(item.module, "hpctrain.trainer") and is_under(item.name, "hpctrain.healing")
    ]
    assert not found, "healing is its own wing above the trainer (the program runs both):" + offenders(found)


def test_a_program_is_imported_only_by_a_program_or_to_be_pickled() -> None:
    def allowed(item: Import) -> bool:
        return any(is_under(item.module, who) and is_under(item.name, what) for who, what in PROGRAM_IMPORTERS)

    found = [item for item in ALL_IMPORTS if is_under(item.name, "hpctrain.programs") and not allowed(item)]
    assert not found, "only a program, or launch/task_programs.py to pickle it, imports a program:" + offenders(found)


def slurm_argv(path: Path, commands: frozenset[str] = SLURM_COMMANDS) -> Iterator[str]:
    """``module:line`` of every list/tuple literal, and every call, whose first item is a Slurm command
    (not a type's ``Literal[...]``, nor ``which("sbatch")``, which asks whether it is installed)."""
    tree = ast.parse(path.read_text(), str(path))
    annotations = {id(node.slice) for node in ast.walk(tree) if isinstance(node, ast.Subscript)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and id(node) not in annotations:
            first = node.elts[0] if node.elts else None
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) != "which":
            first = node.args[0] if node.args else None
        else:
            continue
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value in commands:
            yield f"{module_name(path)}:{node.lineno} starts an argv with {first.value!r}"


def test_no_slurm_command_is_spelled_outside_the_one_client() -> None:
    found = [where for path in sorted(PACKAGE.rglob("*.py")) if module_name(path) != SLURM_CLIENT
             for where in slurm_argv(path)]  # fmt: skip
    assert not found, "ask Slurm through hpctrain.contract.slurm.Slurm (add the question there):\n  " + "\n  ".join(
        found
    )
    assert list(slurm_argv(PACKAGE / "contract" / "slurm.py")), "the scan finds the client's own commands"


def test_ssh_is_started_only_by_the_remote_wings_one_connection() -> None:
    found = [where for path in sorted(PACKAGE.rglob("*.py")) if module_name(path) != SSH_CLIENT
             for where in slurm_argv(path, SSH_COMMANDS)]  # fmt: skip
    assert not found, "reach a login node through hpctrain.remote.ssh.Connection:\n  " + "\n  ".join(found)
    from hpctrain.remote import ssh

    assert ssh.SSH == "ssh"


def test_only_the_tracking_wing_imports_a_tracker_and_training_never_imports_the_wing() -> None:
    libraries = [
        item
        for item in ALL_IMPORTS
        if any(is_under(item.name, lib) for lib in TRACKER_LIBRARIES) and not is_under(item.module, "hpctrain.tracking")
    ]
    assert not libraries, "a tracker library is imported outside hpctrain/tracking/:" + offenders(libraries)
    wing = [
        item
        for item in ALL_IMPORTS
        if is_under(item.name, "hpctrain.tracking") and any(is_under(item.module, side) for side in TASK_SIDE)
    ]
    assert not wing, "the task side imports the tracking wing (it reads the run directory instead):" + offenders(wing)
    assert any(is_under(item.name, "mlflow") for item in ALL_IMPORTS), "the scan sees the wing's own imports"


def test_the_login_side_flows_down() -> None:
    def floor(name: str) -> int | None:
        parts = name.split(".")
        return LOGIN_FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in LOGIN_FLOORS else None

    found = [
        item
        for item in ALL_IMPORTS
        if (low := floor(item.module)) is not None
        and ((high := floor(item.name)) is not None and high > low or item.name == "hpctrain")
    ]
    assert not found, (
        "a login-side package imports one above it (or the package face); move the shared part down, or hand "
        "it down from the caller:" + offenders(found)
    )
    assert {module.split(".")[1] for module in {item.module for item in ALL_IMPORTS} if floor(module) is not None} == (
        set(LOGIN_FLOORS)
    ), "the scan sees every floor"


def test_few_modules_lie_loose_in_the_package() -> None:
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, (
        f"{len(loose)} modules loose in hpctrain/ (at most {MAX_LOOSE_MODULES}): {loose}; "
        "put new code in the package of its side"
    )


def test_every_unit_test_file_is_named_for_the_module_it_tests() -> None:
    """docs/testing.md: ``tests/unit/test_PACKAGE_MODULE[_ASPECT].py``, ``test_house_*``, ``test_testbed_*``."""
    modules = {
        "_".join(path.relative_to(PACKAGE).with_suffix("").parts[:-1] if path.name == "__init__.py" else
                 path.relative_to(PACKAGE).with_suffix("").parts)
        for path in PACKAGE.rglob("*.py")
    }  # fmt: skip
    unit = Path(__file__).resolve().parent
    stray = []
    for path in sorted(unit.glob("test_*.py")):
        name = path.stem.removeprefix("test_")
        if name.startswith(("house_", "testbed_")):
            continue
        if not any(name == module or name.startswith(f"{module}_") for module in modules if module):
            stray.append(path.name)
    assert not stray, f"unit test files not named for a module of hpctrain/ (docs/testing.md): {stray}"

"""The house's layering, read from the ``import`` statements of every module in hpctrain/ (issue 17).

Top-level imports and imports inside functions alike (``ast``, nothing is
imported). Each rule fails with the list of offending imports, as
``module:line (function) imports name``.

* A CLI verb (``cli/cmd_*.py``) never imports another verb: shared logic lives
  in the library packages beneath them.
* ``contract/`` imports nothing of the project but ``hpctrain.errors`` and
  itself: both sides import it, so it must stand alone.
* The login side (contract, jobspec, launch, observe, diagnose, cli, dataset)
  never imports torch, torchvision, ``hpctrain.trainer`` or the public task
  API ``hpctrain.task`` (login nodes are slow and shared). A function-level
  import inside a helper that only runs where torch belongs may be let through
  by :data:`TASK_ONLY`.
* ``hpctrain.task`` (what a user's own loop imports) never imports the
  built-in trainer: the trainer is built on the task API, not the reverse.
* At most five modules lie loose in ``hpctrain/``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hpctrain"
LOGIN_SIDE = ("contract", "jobspec", "launch", "observe", "diagnose", "cli", "dataset")
HEAVY = ("torch", "torchvision", "hpctrain.trainer", "hpctrain.task")
MAX_LOOSE_MODULES = 5

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


def test_few_modules_lie_loose_in_the_package() -> None:
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, (
        f"{len(loose)} modules loose in hpctrain/ (at most {MAX_LOOSE_MODULES}): {loose}; "
        "put new code in the package of its side"
    )

"""An entry point's calling convention, ``function(ctx, **entrypoint_args)``, checked on both sides. Torch-free.

Every task calls ``package.module:function`` with its task context first and the
spec's ``entrypoint_args`` as keywords. A function that cannot be called that
way would otherwise be accepted at submit and die in the job, after the queue
wait, with a bare ``TypeError``:

* on the login node (``validate``, ``submit``'s checks before the queue) the
  signature is read from the module's **source** with :mod:`ast`: the module is
  found as ``python -m`` would find it (:func:`module_source`, parent packages
  included) but nothing is imported or run, so a module that imports torch
  costs no torch import. Only a plain top-level ``def`` is judged; a decorated
  function, a name bound another way (an import, an assignment, a class,
  several definitions) or a module not found from here is left to the task;
* on the task, :func:`call_problem` binds the imported function's real
  signature before the process group forms, and the launcher raises an error
  that names the entry point.

Both sides use :meth:`inspect.Signature.bind`, so they agree on what fits.
"""

from __future__ import annotations

import ast
import importlib.machinery
import inspect
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_SOURCE_BYTES = 4 << 20  # a module larger than this is not parsed on the login node
_CTX = object()  # stands for the task context when binding


@dataclass(frozen=True)
class SourceSignature:
    """What the login node read of an entry point: its signature, or why it has none to judge."""

    where: str  # "path/to/module.py:LINE" (or the module file when the function is missing)
    signature: inspect.Signature | None = None
    problem: str | None = None  # certain to fail on the task: not there, a coroutine function
    unchecked: str | None = None  # left to the task, and why


def call_text(function: str, kwargs: Mapping[str, object]) -> str:
    """How hpctrain calls it, e.g. ``main(ctx, lr=..., steps=...)``."""
    return f"{function}({', '.join(['ctx', *(f'{key}=...' for key in kwargs)])})"


def call_problem(signature: inspect.Signature, kwargs: Mapping[str, object]) -> str | None:
    """Why ``function(ctx, **kwargs)`` does not fit ``signature`` (Python's own reason), or None."""
    try:
        signature.bind(_CTX, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def function_problem(function: object, kwargs: Mapping[str, object]) -> str | None:
    """The task's check of the imported function: None when it fits or has no signature to read."""
    if inspect.iscoroutinefunction(function):
        return "it is a coroutine function (async def); hpctrain calls it and does not await it"
    try:
        signature = inspect.signature(function)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a text signature: let the call decide
        return None
    reason = call_problem(signature, kwargs)
    return f"its signature {signature} does not fit: {reason}" if reason else None


def source_problem(entrypoint: str, kwargs: Mapping[str, object], search_path: Sequence[str]) -> str | None:
    """The login node's check: why ``entrypoint`` cannot be called as hpctrain calls it, judged from its
    source; None when it fits or cannot be judged from here (then the task checks it)."""
    module_name, _, function = entrypoint.partition(":")
    found = source_signature(module_name, function, search_path)
    if found is None or found.unchecked is not None:
        return None
    if found.problem is not None:
        return f"{found.where}: {found.problem}"
    assert found.signature is not None
    reason = call_problem(found.signature, kwargs)
    if reason is None:
        return None
    call = call_text(function, kwargs)
    return f"{found.where}: `def {function}{found.signature}` cannot be called as {call}: {reason}"


def source_signature(module_name: str, function: str, search_path: Sequence[str]) -> SourceSignature | None:
    """``function``'s signature as ``module_name``'s source defines it; None when the module is not found."""
    path = module_source(module_name, search_path)
    if path is None:
        return None
    try:
        size = path.stat().st_size
        if size > MAX_SOURCE_BYTES:
            return SourceSignature(str(path), unchecked=f"larger than {MAX_SOURCE_BYTES} bytes")
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return SourceSignature(str(path), unchecked=f"not parsed here ({type(exc).__name__})")
    bindings = _bindings(tree.body, function, top=True)
    if _may_bind_dynamically(tree, function):
        return SourceSignature(str(path), unchecked="the module may bind it at import time")
    if not bindings:
        return SourceSignature(str(path), problem=f"{module_name} defines no function {function!r}")
    if len(bindings) != 1 or not isinstance(bindings[0][0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return SourceSignature(str(path), unchecked="bound by more than one plain def")
    node, top = bindings[0]
    where = f"{path}:{node.lineno}"
    if not top or node.decorator_list:
        return SourceSignature(where, unchecked="a conditional or decorated definition")
    if isinstance(node, ast.AsyncFunctionDef):
        return SourceSignature(
            where, problem=f"`async def {function}` is a coroutine function; hpctrain calls it and does not await it"
        )
    try:
        return SourceSignature(where, signature=_signature(node.args))
    except ValueError as exc:  # a signature Python would not compile either
        return SourceSignature(where, unchecked=str(exc))


def module_source(module_name: str, search_path: Sequence[str]) -> Path | None:
    """The ``.py`` file of ``module_name`` found along ``search_path`` and its packages' paths, without
    importing anything (``importlib.util.find_spec`` would run the parent packages' ``__init__``)."""
    paths: list[str] | None = list(search_path)
    spec = None
    parts = module_name.split(".")
    for index in range(len(parts)):
        if paths is None:
            return None  # a module's child: not a package
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: index + 1]), paths)
        if spec is None:
            return None
        locations = spec.submodule_search_locations
        paths = list(locations) if locations is not None else None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None  # a namespace package, an extension module, bytecode only
    return Path(spec.origin)


def _bindings(body: Sequence[ast.stmt], name: str, *, top: bool) -> list[tuple[ast.stmt, bool]]:
    """Statements of a module's top level (and its if/try/with blocks) that bind ``name``."""
    found: list[tuple[ast.stmt, bool]] = []
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if statement.name == name:
                found.append((statement, top))
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            bound = [alias.asname or alias.name.partition(".")[0] for alias in statement.names]
            if name in bound:
                found.append((statement, top))
        elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if any(isinstance(node, ast.Name) and node.id == name for t in targets for node in ast.walk(t)):
                found.append((statement, top))
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(statement, field, None)
                if isinstance(inner, list):
                    blocks = [h.body for h in inner if isinstance(h, ast.ExceptHandler)] or [inner]
                    for block in blocks:
                        found += _bindings([s for s in block if isinstance(s, ast.stmt)], name, top=False)
    return found


def _may_bind_dynamically(tree: ast.Module, name: str) -> bool:
    """``from x import *``, ``globals()``, ``global NAME`` in a function, a module ``__getattr__``: the
    name may be bound (or rebound) by something other than its statements."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            return True
        if isinstance(node, ast.Name) and node.id in ("globals", "setattr", "exec", "vars"):
            return True
        if isinstance(node, ast.Global) and name in node.names:
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__getattr__":
            return True
    return False


def _signature(args: ast.arguments) -> inspect.Signature:
    kind = inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    params = [
        kind(
            arg.arg,
            kind.POSITIONAL_ONLY if index < len(args.posonlyargs) else kind.POSITIONAL_OR_KEYWORD,
            default=_Shown() if index >= first_default else kind.empty,
        )
        for index, arg in enumerate(positional)
    ]
    if args.vararg is not None:
        params.append(kind(args.vararg.arg, kind.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append(kind(arg.arg, kind.KEYWORD_ONLY, default=_Shown() if default is not None else kind.empty))
    if args.kwarg is not None:
        params.append(kind(args.kwarg.arg, kind.VAR_KEYWORD))
    return inspect.Signature(params)


class _Shown:
    """A default value read from source: shown as ``...`` in a signature."""

    def __repr__(self) -> str:
        return "..."


def default_search_path() -> list[str]:
    """Where ``python -m`` on a node started from here looks first: this directory, then ``sys.path``: where the
    login side looks for an entry point's source (``launch/code_snapshot.py``, ``diagnose/preflight.py``)."""
    return [os.getcwd(), *(entry for entry in sys.path if entry)]

"""``trainer.compile``: torch.compile of the model the forward runs, with errors a user can act on.

``nn.Module.compile()`` compiles in place: the module keeps its parameters and
``state_dict`` keys, so checkpoints, ``trainer.weights`` and ``weights_sha256``
are the same as without compiling. torch.compile is lazy: the model is traced
and compiled at its first forward (and the backward at the first backward), so
a missing C compiler or an operator the compiler cannot handle shows up there,
as an error from deep inside Dynamo or Inductor. :func:`compile_failure` turns
those into a :class:`~hpctrain.errors.TrainingConfigError` that says what to set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from hpctrain.errors import TrainingConfigError

HINT = "set trainer.compile: false (the run trains the same, uncompiled)"


def compile_model(model: nn.Module, *, backend: str | Callable[..., Any] = "inductor") -> nn.Module:
    """``model``, compiled in place (it compiles at its first call)."""
    import torch._dynamo  # only compiling runs import Dynamo

    if not torch._dynamo.is_dynamo_supported():
        raise TrainingConfigError(
            f"trainer.compile: torch {torch.__version__} cannot compile on this Python or platform", hint=HINT
        )
    model.compile(backend=backend)
    return model


def compile_failure(exc: BaseException) -> TrainingConfigError | None:
    """The config error to raise for ``exc`` when torch.compile failed, else None (``exc`` is not ours)."""
    from torch._dynamo.exc import TorchDynamoException

    if not isinstance(exc, TorchDynamoException):
        return None
    return TrainingConfigError(
        f"trainer.compile: torch.compile could not compile the model ({_root_cause(exc)})", hint=HINT
    )


def _root_cause(exc: BaseException) -> str:
    """The innermost error's type and first line: Dynamo wraps the backend's error (a C++ compile, say)."""
    root, seen = exc, {id(exc)}
    while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None and id(inner) not in seen:
        root = inner
        seen.add(id(root))
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    return f"{type(root).__name__}: {lines[0][:300]}" if lines else type(root).__name__

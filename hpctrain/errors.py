"""The project's exception types.

Library code raises these; the CLI (``hpctrain.cli.main``) is the one place
that turns them into a short message (cause + hint) and an exit code, so a
user mistake never shows a Python traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# C0/C1 controls (terminal escapes, newlines), zero-width and bidi overrides: what makes text lie on a terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def printable(value: object, *, keep: str = "") -> str:
    """``str(value)`` with control and bidi characters (terminal escapes, newlines) shown as ``\\xNN``.

    The one escaper of text that came from a user or a file (spec keys and values, paths, profile
    names, run files): every message that quotes such text is safe to print. ``keep`` names characters
    left as they are (``"\\n"`` for a message of several lines whose parts were escaped already).
    """
    text = str(value)
    return _CONTROL.sub(lambda match: match.group() if match.group() in keep else f"\\x{ord(match.group()):02x}", text)


class HpctrainError(Exception):
    """Base class for every error hpctrain reports to a user.

    ``hint`` says what to do about it; ``exit_code`` is what the CLI exits with.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nHINT: {self.hint}"


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a job spec: where it is and what is wrong."""

    key: str  # dotted key, e.g. "resources.nodes"; "" for the whole document
    message: str
    line: int | None = None
    column: int | None = None

    def render(self, source: str) -> str:
        """One line, whatever the spec held: the file name, the key and the message are escaped here, the
        one place problems are formatted (a key may carry a terminal escape or a newline)."""
        where = printable(source)
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        key = f" {printable(self.key)}:" if self.key else ""
        return f"{where}:{key} {printable(self.message)}"


class SpecError(HpctrainError):
    """A job spec (or an override, or a cluster profile) is invalid.

    Carries every problem found, so the user fixes them all in one go.
    """

    exit_code = 2

    def __init__(self, source: str, problems: list[SpecProblem], hint: str | None = None) -> None:
        self.source = source
        self.problems = problems
        lines = [p.render(source) for p in problems]
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        super().__init__(f"{printable(source)}: {count}:\n  " + "\n  ".join(lines), hint)


class UsageError(HpctrainError):
    """The command line itself is wrong (missing file, bad flag combination)."""

    exit_code = 2


class ClusterError(HpctrainError):
    """Slurm is missing, unreachable, or rejected what we asked for."""

    exit_code = 3


class RunDirError(HpctrainError):
    """A run directory is missing, unreadable or not an hpctrain run."""

    exit_code = 2


class RunStopped(HpctrainError):
    """A local run followed in the foreground was stopped by a signal; exits 128 + that signal."""

    def __init__(self, message: str, exit_code: int, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code


class DistributedSetupError(HpctrainError):
    """The task environment cannot form a correct process group."""

    exit_code = 4


class CheckpointError(HpctrainError):
    """A checkpoint cannot be read or written safely."""

    exit_code = 5


class TrainingConfigError(HpctrainError):
    """The spec asks the trainer for something this machine cannot do
    (fp16 on CPU, Apex not installed, missing dataset...)."""

    exit_code = 2


class RemoteError(HpctrainError):
    """A cluster's login node could not be reached or asked (``hpctrain/remote/``).

    ``kind`` says what callers can act on: ``no_master`` (no live connection:
    ``hpctrain login NAME``), ``host_key`` (unknown or changed host key),
    ``auth``, ``unreachable``, ``no_hpctrain``, ``version``, ``interrupted``
    (a submit stopped on the login node before it ended), ``socket_dir``.
    """

    exit_code = 6

    def __init__(self, message: str, kind: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.kind = kind

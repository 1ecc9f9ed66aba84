"""What a check found: the one result type of preflight, doctor and the probe. Torch-free.

A finding has a level (ok / warning / error), the thing it concerns -- a
spec key such as ``data.root`` when the user fixes it in the spec, else the
check's name such as ``controller`` -- what was seen, and what to do about
it. Preflight reports only warnings and errors; doctor lists every check,
passed ones included, and prints ``--json`` rows in its own words (``name``,
``detail``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Level = Literal["ok", "warning", "error"]


@dataclass(frozen=True)
class Finding:
    level: Level
    key: str
    message: str
    fix: str = ""
    numbers: dict[str, Any] | None = field(default=None, compare=False)  # what a measuring check measured

    @property
    def name(self) -> str:
        """Doctor's word for :attr:`key` (a check's name)."""
        return self.key

    @property
    def detail(self) -> str:
        """Doctor's word for :attr:`message`."""
        return self.message

    def as_json(self) -> dict[str, Any]:
        """A row of ``doctor --json``."""
        out: dict[str, Any] = {"name": self.key, "level": self.level, "detail": self.message, "fix": self.fix}
        if self.numbers is not None:
            out["numbers"] = self.numbers
        return out


def errors(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.level == "error"]

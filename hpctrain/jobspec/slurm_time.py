"""Slurm time-limit strings, parsed exactly as ``sbatch --time`` accepts them.

Accepted: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``.
We reject what Slurm would reject, and a limit of zero (which Slurm reads as
"partition maximum" — surprising in a spec, so we ask for an explicit value).
"""

from __future__ import annotations

import math
import re

_FORMS = (
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d+)$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d+)$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("d", "h", "m", "s")),
)

ALLOWED_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def parse_time_limit(value: str | int) -> int:
    """Return the limit in whole seconds; raise ValueError naming the allowed forms."""
    text = str(value).strip()
    for pattern, units in _FORMS:
        match = pattern.match(text)
        if not match:
            continue
        parts = dict(zip(units, (int(g) for g in match.groups())))
        if parts.get("s", 0) >= 60 and len(units) > 1:
            raise ValueError(f"seconds must be < 60 in {text!r}")
        if "h" in parts and len(units) > 2 and parts.get("m", 0) >= 60:
            raise ValueError(f"minutes must be < 60 in {text!r}")
        if "d" in parts and parts["h"] >= 24:
            raise ValueError(f"hours must be < 24 after a day count in {text!r}")
        seconds = parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)
        if seconds <= 0:
            raise ValueError("a time limit of zero is not allowed; give the real limit, e.g. '24:00:00'")
        return seconds
    raise ValueError(f"{text!r} is not a Slurm time limit; use {ALLOWED_FORMS}")


def seconds_to_minutes(seconds: int) -> int:
    """Slurm (and submitit's ``timeout_min``) counts in whole minutes; round up."""
    return max(1, math.ceil(seconds / 60))

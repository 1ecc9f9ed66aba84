"""The time-to-result estimates a run was given, kept beside it so they can be checked against what happened.

``hpctrain submit`` (and ``hpctrain resume``) records the estimate it printed
(``planning/forecast.py``) in ``RUN/.hpctrain/estimates.json``: a JSON object
``{"estimates": [...]}``, oldest first, each entry the forecast's record
(when it was made, by which verb, the expected start and finish as epoch
seconds and ISO text, the steps, the step time, the chunks, the basis in
words). ``hpctrain report`` and ``status --watch`` compare the first one with
the run's real start and end. Torch-free; only the login side writes it (the
job never does), atomically, and a damaged file reads as no estimates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import CONTROL_DIR, read_json_object, run_home, write_json_atomic

ESTIMATES_NAME = "estimates.json"
MAX_ESTIMATES = 32  # the first (submit's) is always kept; later ones roll


def estimates_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONTROL_DIR / ESTIMATES_NAME


def read_estimates(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's recorded estimates, oldest first; [] when none or unreadable (never raises)."""
    data = read_json_object(estimates_path(run_dir), within=run_home(Path(run_dir)))
    found = data.get("estimates") if data else None
    return [entry for entry in found if isinstance(entry, dict)] if isinstance(found, list) else []


def record_estimate(run_dir: str | Path, entry: dict[str, Any]) -> None:
    """Append ``entry`` (keeping the first and the newest, at most :data:`MAX_ESTIMATES`). Raises OSError."""
    kept = [*read_estimates(run_dir), dict(entry)]
    if len(kept) > MAX_ESTIMATES:
        kept = [kept[0], *kept[len(kept) - MAX_ESTIMATES + 1 :]]
    path = estimates_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"estimates": kept})

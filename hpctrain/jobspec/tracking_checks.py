"""The checks of the ``tracking:`` section that need the rest of the spec, and what ``--dry-run`` says.

``validate`` and ``submit`` call :func:`tracking_problems` through
``cross_checks.check_resolved``: a tracker whose package is not installed is
refused with its install line before anything reaches the queue (asked of
``importlib``; nothing is imported), and so is a tracker's secret in ``env:``
(the spec is copied into the run directory and printed by ``--dry-run``; the
trackers read :data:`CREDENTIAL_VARS` where ``hpctrain sync`` runs). Pure,
torch-free.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from hpctrain.errors import SpecProblem

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec

# tracker -> (the module that must import, the extra that installs it)
PACKAGES = {"wandb": ("wandb", "hpctrain[wandb]"), "mlflow": ("mlflow", "hpctrain[mlflow]")}
# environment variables that hold a tracker's secret: read where 'hpctrain sync' runs, never put in a spec
CREDENTIAL_VARS = ("WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME")


def installed(tracker: str) -> bool:
    """Whether ``tracker``'s package can be imported here (asked of importlib; nothing is imported)."""
    try:
        return importlib.util.find_spec(PACKAGES[tracker][0]) is not None
    except (ImportError, ValueError):
        return False


def tracking_problems(spec: JobSpec) -> list[SpecProblem]:
    """Every reason ``spec``'s tracking section cannot work here: a tracker not installed, a secret in env."""
    problems = []
    for tracker in spec.tracking.trackers:
        if not installed(tracker):
            extra = PACKAGES[tracker][1]
            problems.append(
                SpecProblem(
                    f"tracking.{tracker}",
                    f"{tracker} is not installed: pip install '{extra}' (or remove tracking.{tracker})",
                )
            )
    for key in spec.env:
        if key in CREDENTIAL_VARS:
            problems.append(
                SpecProblem(
                    f"env.{key}",
                    "a secret in the spec is copied into the run directory (spec.yaml) and printed by --dry-run; "
                    "export it where 'hpctrain sync' runs instead (docs/tracking.md)",
                )
            )
    return problems


def where_runs_appear(spec: JobSpec, run_label: str) -> list[str]:
    """One line per tracker saying where the run will appear (``--dry-run``, ``validate``)."""
    lines, tracking = [], spec.tracking
    if tracking.wandb is not None:
        wandb = tracking.wandb
        place = f"{wandb.entity}/{wandb.project}" if wandb.entity else f"project {wandb.project}"
        how = (
            "written offline into RUN/wandb/ by 'hpctrain sync RUN', then 'wandb sync RUN/wandb/offline-run-*'"
            if wandb.mode == "offline"
            else "sent by 'hpctrain sync RUN'"
        )
        lines.append(f"W&B: {place}, run '{wandb.name or run_label}' ({how})")
    if tracking.mlflow is not None:
        mlflow = tracking.mlflow
        lines.append(
            f"MLflow: {mlflow.tracking_uri}, experiment '{mlflow.experiment}', run '{run_label}' "
            "(sent by 'hpctrain sync RUN' from a machine that reaches the server)"
        )
    return lines

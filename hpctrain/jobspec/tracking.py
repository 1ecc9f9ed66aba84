"""The ``tracking:`` section: which experiment trackers a run appears in (W&B, MLflow), and its checks.

Pure and torch-free, and no tracker library is imported here: whether one is
installed is asked of ``importlib`` (:func:`tracking_problems`), so ``validate``
refuses a spec whose tracker is missing with the install line before anything
reaches the queue. The wing that sends runs there is ``hpctrain/tracking/``
(docs/tracking.md). Credentials are never spec keys: the trackers read them
from their own environment variables or files on the machine that syncs
(:data:`CREDENTIAL_VARS`), and a spec that carries one (in ``env:`` or in a
URI's ``user:password@``) is refused, since the spec is copied into the run
directory and printed by ``--dry-run``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from hpctrain.errors import SpecProblem
from hpctrain.jobspec.fields import NAME_PATTERN

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec

# tracker -> (the module that must import, the extra that installs it)
PACKAGES = {"wandb": ("wandb", "hpctrain[wandb]"), "mlflow": ("mlflow", "hpctrain[mlflow]")}
# environment variables that hold a tracker's secret: read where 'hpctrain sync' runs, never put in a spec
CREDENTIAL_VARS = ("WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME")
_URI_SCHEMES = ("http", "https", "file", "sqlite", "databricks")


def _one_line(limit: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not value or len(value) > limit or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError(f"must be one line of 1 to {limit} printable characters")
        return value

    return check


TrackerName = Annotated[str, AfterValidator(_one_line(250))]
Tags = Annotated[list[TrackerName], Field(max_length=64)]


class _Section(BaseModel):
    # the job spec's section config (jobspec/models.py's Section), spelled here so models.py can import this
    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        str_strip_whitespace=True,
        strict=True,
        allow_inf_nan=False,
        defer_build=True,
    )


class Wandb(_Section):
    """A Weights & Biases run: one per hpctrain run, whatever the number of restarts."""

    project: Annotated[str, Field(pattern=NAME_PATTERN, description="W&B project the run goes to.")]
    entity: Annotated[
        str | None, Field(pattern=NAME_PATTERN, description="W&B team or user. Default: your default.")
    ] = None
    name: Annotated[TrackerName | None, Field(description="Display name. Default: NAME/RUN_ID.")] = None
    tags: Annotated[Tags, Field(description="Tags on the run.")] = []
    mode: Annotated[
        Literal["offline", "online"],
        Field(
            description="offline: 'hpctrain sync' writes one W&B offline run folder in the run directory "
            "(RUN/wandb/), for 'wandb sync' where the internet is; online: 'hpctrain sync' sends to W&B itself."
        ),
    ] = "offline"


class Mlflow(_Section):
    """An MLflow run: one per hpctrain run, whatever the number of restarts."""

    tracking_uri: Annotated[
        Annotated[str, AfterValidator(_one_line(2000))],
        Field(
            description="MLflow tracking server, e.g. http://mlflow.example.org:5000 (credentials: "
            "MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN where 'hpctrain sync' runs).",
        ),
    ]
    experiment: Annotated[TrackerName, Field(description="Experiment name; created when missing.")] = "hpctrain"
    tags: Annotated[
        dict[TrackerName, Annotated[str, AfterValidator(_one_line(5000))]],
        Field(max_length=64, description="Tags set on the run (key: value)."),
    ] = {}

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in _URI_SCHEMES:
            raise ValueError(f"a URI of scheme {', '.join(_URI_SCHEMES)}, e.g. http://mlflow.example.org:5000")
        if parts.password is not None or (parts.username and parts.scheme in ("http", "https")):
            raise ValueError(
                "holds a user name or password: the spec is copied into the run directory and printed; "
                "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD where 'hpctrain sync' runs instead"
            )
        return value


class Tracking(_Section):
    """Experiment trackers the run appears in (docs/tracking.md); TensorBoard (RUN/tb/) is always written."""

    wandb: Annotated[Wandb | None, Field(description="A Weights & Biases run (pip install 'hpctrain[wandb]').")] = None
    mlflow: Annotated[Mlflow | None, Field(description="An MLflow run (pip install 'hpctrain[mlflow]').")] = None

    @property
    def trackers(self) -> tuple[str, ...]:
        """The configured trackers' names, in a fixed order."""
        return tuple(name for name in PACKAGES if getattr(self, name) is not None)


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

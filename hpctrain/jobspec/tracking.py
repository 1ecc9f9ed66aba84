"""The ``tracking:`` section: which experiment trackers a run appears in (W&B, MLflow).

Pure and torch-free; no tracker library is imported here. The checks that
need the rest of the spec (is the tracker installed, a secret in ``env:``)
and what ``--dry-run`` says are ``tracking_checks.py``'s; the wing that sends
runs there is ``hpctrain/tracking/`` (docs/tracking.md). Credentials are
never spec keys: a URI's ``user:password@`` is refused here, since the spec
is copied into the run directory and printed by ``--dry-run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import AfterValidator, Field, field_validator, model_validator

from hpctrain.jobspec.fields import NAME_PATTERN
from hpctrain.jobspec.section import Section

TRACKERS = ("wandb", "mlflow")  # in the order they are synced
_URI_SCHEMES = ("http", "https", "file", "sqlite", "databricks")


def _one_line(limit: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not value or len(value) > limit or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError(f"must be one line of 1 to {limit} printable characters")
        return value

    return check


TrackerName = Annotated[str, AfterValidator(_one_line(250))]
Tags = Annotated[list[TrackerName], Field(max_length=64)]


class Wandb(Section):
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


class Mlflow(Section):
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
        if value == "databricks":  # MLflow's name for the workspace of the default Databricks profile
            return value
        parts = urlsplit(value)
        if parts.scheme not in _URI_SCHEMES:
            raise ValueError(f"a URI of scheme {', '.join(_URI_SCHEMES)}, e.g. http://mlflow.example.org:5000")
        if parts.password is not None or (parts.username and parts.scheme in ("http", "https")):
            raise ValueError(
                "holds a user name or password: the spec is copied into the run directory and printed; "
                "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD where 'hpctrain sync' runs instead"
            )
        if problem := _uri_problem(value, parts):
            raise ValueError(problem)
        return value


def _uri_problem(value: str, parts: SplitResult) -> str:
    """What makes a tracking URI of a known scheme unusable, said with the form to write; "" when none."""
    if any(c.isspace() for c in value):
        return "has a space in it; e.g. http://mlflow.example.org:5000"
    if parts.scheme in ("http", "https"):
        try:
            port = parts.port
        except ValueError:
            return f"has a port that is not a number from 1 to 65535 ({parts.netloc!r}); e.g. http://host:5000"
        if not parts.hostname:
            return "has no host name; e.g. http://mlflow.example.org:5000 (the address 'mlflow server' listens on)"
        if port == 0:
            return "has port 0; e.g. http://mlflow.example.org:5000"
        if parts.query or parts.fragment:
            return "has a query or fragment; give the server's base address, e.g. http://mlflow.example.org:5000"
    if parts.scheme == "file" and (parts.netloc not in ("", "localhost") or not parts.path.startswith("/")):
        return "a file store is an absolute folder: file:///home/me/mlruns (three slashes)"
    if parts.scheme == "sqlite" and (parts.netloc or len(parts.path) < 2 or not parts.path.startswith("/")):
        return "a SQLite store is sqlite:///relative.db or sqlite:////absolute/path.db"
    return ""


class Tracking(Section):
    """Experiment trackers the run appears in (docs/tracking.md); TensorBoard (RUN/tb/) is always written."""

    wandb: Annotated[Wandb | None, Field(description="A Weights & Biases run (pip install 'hpctrain[wandb]').")] = None
    mlflow: Annotated[Mlflow | None, Field(description="An MLflow run (pip install 'hpctrain[mlflow]').")] = None
    live: Annotated[
        bool,
        Field(
            description="Also send from the job while it trains: global rank 0's node runs 'hpctrain sync' in a "
            "process of its own every live_interval_s (for clusters whose nodes reach the trackers; training never "
            "waits on it). Off: only 'hpctrain sync' (or status --watch --sync) where you run it sends.",
        ),
    ] = False
    live_interval_s: Annotated[
        float, Field(ge=5, le=3600, description="tracking.live: seconds between the node's syncs.")
    ] = 30.0

    @model_validator(mode="after")
    def _live_needs_a_tracker(self) -> Tracking:
        if self.live and not self.trackers:
            raise ValueError("tracking.live sends to the trackers this section names: add tracking.mlflow or .wandb")
        return self

    @property
    def trackers(self) -> tuple[str, ...]:
        """The configured trackers' names, in a fixed order."""
        return tuple(name for name in TRACKERS if getattr(self, name) is not None)

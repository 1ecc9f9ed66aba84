"""The MLflow side of ``hpctrain sync``: one MLflow run per hpctrain run, found again by its tracking id.

Only this module imports ``mlflow`` (its client; ``pip install 'hpctrain[mlflow]'``),
and only when a sync sends there. Each batch is one ``log_batch`` with explicit
steps and each value's own line's time as the timestamp (``StepValues.time_of``), plus the tag
``hpctrain.synced_through`` (the last step it holds): MLflow keeps a metric once
per (key, step, time, value), so a batch sent again after a sync was killed
between the server's answer and the cursor's write adds nothing, and a cursor
that was lost is rebuilt from the run's tags. Credentials are MLflow's own:
``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` or ``MLFLOW_TRACKING_TOKEN`` in the
environment of the machine that syncs; hpctrain never reads or writes them.
A server that is down fails the sync after a few retries (not MLflow's default
of minutes), unless ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` says otherwise.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpctrain.errors import HpctrainError, printable
from hpctrain.jobspec.tracking import Mlflow
from hpctrain.tracking.plan import StepValues

MAX_METRICS_PER_BATCH = 900  # MLflow takes 1000 entities per log_batch: metrics, params and tags together
MAX_PER_CALL = 100  # params, and tags, per log_batch
SYNCED_TAG = "hpctrain.synced_through"
ID_TAG = "hpctrain.tracking_id"
STATUSES = {"completed": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}


class TrackerError(HpctrainError):
    """A tracker refused or could not be reached; what was acknowledged before is kept."""


def _client(uri: str) -> Any:
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise TrackerError(
            "mlflow is not installed here", hint="pip install 'hpctrain[mlflow]' where 'hpctrain sync' runs"
        ) from None
    return MlflowClient(tracking_uri=uri)


def failed(what: str, exc: Exception, uri: str) -> TrackerError:
    text = printable(str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
    return TrackerError(
        f"MLflow at {printable(uri)}: {what} failed: {text}",
        hint="check that the server is up and reachable from here (MLFLOW_TRACKING_USERNAME/PASSWORD or "
        "MLFLOW_TRACKING_TOKEN if it asks for a login); run 'hpctrain sync' again: nothing is sent twice",
    )


class MlflowSink:
    """One hpctrain run's MLflow run: opened (found or created), then fed batches."""

    acks_each_batch = True  # log_batch returns once the server stored it
    rewrites = False

    def __init__(self, config: Mlflow) -> None:
        self.config = config
        self.client: Any = None  # made by open: a sync with nothing to send never imports mlflow
        self.run_id: str | None = None
        self.server_params: dict[str, str] = {}  # a run found by its tag: what it holds (MLflow keeps the first)

    @property
    def where(self) -> str:
        return f"{self.config.tracking_uri} experiment '{self.config.experiment}'"

    def open(self, tracking_id: str, run_ref: str | None, label: str, run_dir: Path) -> tuple[str, int | None]:
        """The MLflow run's id, and (when found by its tag, not the cursor) the last step it holds."""
        self.client = _client(self.config.tracking_uri)
        try:
            if run_ref:
                self.run_id = run_ref
                return run_ref, None
            experiment = self.client.get_experiment_by_name(self.config.experiment)
            experiment_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(self.config.experiment)
            )
            found = self.client.search_runs(
                [experiment_id], filter_string=f"tags.`{ID_TAG}` = '{tracking_id}'", max_results=1
            )
            if found:
                self.run_id = found[0].info.run_id
                self.server_params = dict(found[0].data.params)
                synced = found[0].data.tags.get(SYNCED_TAG)
                return self.run_id, int(synced) if synced and synced.lstrip("-").isdigit() else None
            tags = {**self.config.tags, ID_TAG: tracking_id, "hpctrain.run_dir": str(run_dir)}
            run = self.client.create_run(experiment_id, tags=tags, run_name=label)
            self.run_id = run.info.run_id
            return self.run_id, None
        except HpctrainError:
            raise
        except Exception as exc:
            raise failed("opening the run", exc, self.config.tracking_uri) from None

    def send_steps(self, steps: list[StepValues], *, through: int) -> None:
        """One log_batch of ``steps`` (at most MAX_METRICS_PER_BATCH values); returns once acknowledged."""
        from mlflow.entities import Metric, RunTag

        metrics = [
            Metric(key, value, int(entry.time_of(key) * 1000), entry.step)
            for entry in steps
            for key, value in entry.values.items()
        ]
        self._batch(metrics=metrics, tags=[RunTag(SYNCED_TAG, str(through))])

    def send_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in params.items() if key not in self.server_params]
        for start in range(0, len(items), MAX_PER_CALL):
            self._batch(params=items[start : start + MAX_PER_CALL])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(key, value) for key, value in tags.items()]
        for start in range(0, len(items), MAX_PER_CALL):
            self._batch(tags=items[start : start + MAX_PER_CALL])

    def send_artifacts(self, paths: Iterable[Path]) -> None:
        for path in paths:
            try:
                self.client.log_artifact(self.run_id, str(path), "report")
            except Exception as exc:
                raise failed(f"uploading {path.name}", exc, self.config.tracking_uri) from None

    def finish(self, status: str | None, numbers: Mapping[str, float], step: int | None, time_s: float) -> None:
        """The summary's numbers and the run's end (FINISHED, KILLED or FAILED); a resumed run reopens it."""
        from mlflow.entities import Metric

        self._batch(metrics=[Metric(k, v, int(time_s * 1000), step or 0) for k, v in numbers.items()])
        try:
            if status in STATUSES:
                with contextlib.redirect_stdout(io.StringIO()):  # its "View run" lines would break --json
                    self.client.set_terminated(self.run_id, STATUSES[status], end_time=int(time_s * 1000))
            else:
                self.client.update_run(self.run_id, "RUNNING")
        except Exception as exc:
            raise failed("setting the run's status", exc, self.config.tracking_uri) from None

    def _batch(self, **entities: Any) -> None:
        try:
            self.client.log_batch(self.run_id, **entities)
        except Exception as exc:
            raise failed("log_batch", exc, self.config.tracking_uri) from None

    def close(self) -> None:
        pass

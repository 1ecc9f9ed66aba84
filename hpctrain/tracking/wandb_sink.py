"""The W&B side of ``hpctrain sync``: one W&B run per hpctrain run, its id the run's tracking id.

Only this module imports ``wandb`` (``pip install 'hpctrain[wandb]'``), and only
when a sync writes there. Two modes (``tracking.wandb.mode``):

* ``offline`` (nodes and login node without W&B access, the default): each
  sync that has something new writes the **whole** settled run again as one
  offline run folder, ``RUN/wandb/offline-run-*-ID/``, and removes the one
  before. ``wandb sync`` of that folder, once or again later, gives W&B one
  complete run under the id: W&B's own merging of several offline folders of
  one id (wandb #3841) never comes into play.
* ``online`` (a login node that reaches W&B): each sync resumes the run
  (``resume="allow"``) and logs only the steps after the cursor, in order.

W&B acknowledges a run's records when ``finish`` returns, so the cursor is
written after :meth:`WandbSink.close` (``acks_each_batch`` is False). The
API key is W&B's own (``WANDB_API_KEY`` or ``~/.netrc`` where the sync runs).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import wandb_dir
from hpctrain.contract.runfiles import real_path
from hpctrain.errors import printable
from hpctrain.jobspec.tracking import Wandb
from hpctrain.tracking.mlflow_sink import TrackerError
from hpctrain.tracking.plan import StepValues


class WandbSink:
    acks_each_batch = False

    def __init__(self, config: Wandb) -> None:
        self.config = config
        self.rewrites = config.mode == "offline"
        self.run: Any = None
        self.status: str | None = None
        self.folder: Path | None = None

    @property
    def where(self) -> str:
        place = f"{self.config.entity}/{self.config.project}" if self.config.entity else self.config.project
        return f"W&B {place} ({self.config.mode})"

    def open(self, tracking_id: str, run_ref: str | None, label: str, run_dir: Path) -> tuple[str, int | None]:
        try:
            import wandb
        except ImportError:
            raise TrackerError(
                "wandb is not installed here", hint="pip install 'hpctrain[wandb]' where 'hpctrain sync' runs"
            ) from None
        self.folder = wandb_dir(run_dir)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._before = set(self.folder.glob(f"offline-run-*-{tracking_id}"))
        os.environ.setdefault("WANDB_SILENT", "true")
        try:
            self.run = wandb.init(
                project=self.config.project,
                entity=self.config.entity,
                name=self.config.name or label,
                id=tracking_id,
                tags=list(self.config.tags),
                dir=str(run_dir),
                mode=self.config.mode,
                resume="allow",
                # the login node's git, code and system stats are not the run's: the run's facts come from its files
                settings=wandb.Settings(
                    console="off", silent=True, x_disable_stats=True, disable_git=True, disable_code=True
                ),
            )
        except Exception as exc:
            raise _failed("opening the run", exc) from None
        return tracking_id, None

    def send_steps(self, steps: list[StepValues], *, through: int) -> None:
        for entry in steps:
            self.run.log(dict(entry.values), step=entry.step)

    def send_params(self, params: Mapping[str, str]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.run.summary.update(dict(tags))

    def send_artifacts(self, paths: Iterable[Path]) -> None:
        for path in paths:
            self.run.save(str(path), base_path=str(path.parent), policy="now")

    def finish(self, status: str | None, numbers: Mapping[str, float], step: int | None, time_s: float) -> None:
        self.run.summary.update(dict(numbers))
        self.status = status

    def close(self) -> None:
        """Finish the run (W&B's acknowledgement); offline, the folders of earlier syncs then go."""
        if self.run is None:
            return
        current = real_path(Path(self.run.dir).parent)  # RUN/wandb/offline-run-DATE-ID/files -> its folder
        try:
            self.run.finish(exit_code=1 if self.status == "failed" else 0)
        except Exception as exc:
            raise _failed("finishing the run", exc) from None
        finally:
            self.run = None
        if self.rewrites and self.folder is not None:
            for old in self._before:
                if real_path(old) != current:
                    shutil.rmtree(old, ignore_errors=True)


def _failed(what: str, exc: Exception) -> TrackerError:
    text = printable(str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
    return TrackerError(
        f"W&B: {what} failed: {text}",
        hint="online: check WANDB_API_KEY (or 'wandb login') and the network here; run 'hpctrain sync' again",
    )

"""``summary.json``: what a run says about itself, as one typed, tolerant record. Torch-free.

Global rank 0 writes it (the trainer's reporter, the hang watchdog, the record
of a failed task, the healing supervisor's record of a lost node); ``status``,
``status --watch``, ``report``, ``cancel``, ``resume`` and ``rehearse`` read it.
Every key the project writes is declared on :class:`Summary`: a reader names a
field, never fishes in the extra keys. Every field may be missing, a field of
the wrong type is dropped when read (never raised), and keys this version
does not know (a newer hpctrain, a user's own) are kept and written back.
A writer that rewrites the file keeps what others wrote (:func:`kept_fields`): a
script job's wrapper keeps the loop's ``task.set_summary`` fields in the final
summary, deciding only the :data:`OUTCOME_KEYS`. Where the file lies is
``contract/rundir.py``'s (:func:`~hpctrain.contract.rundir.summary_path`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator

from hpctrain.contract.rundir import read_json_object, run_home, summary_path, write_json_atomic
from hpctrain.errors import RunDirError

Status = Literal["running", "completed", "stopped", "failed"]
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "stopped", "failed"})
# keys a new attempt of a run keeps: what the supervisor recorded about nodes (lost, burn-in, evicted)
CARRIED_SUMMARY_KEYS = ("excluded_nodes", "node_failures", "burn_in", "evictions")
# what the wrapper of a script job says about how an attempt ended; when it writes, every other key the
# attempt wrote -- the loop's own task.set_summary fields (total_steps, weights_sha256, ...), its step -- stays
OUTCOME_KEYS = frozenset(
    {
        "status",
        "stop_reason",
        "error",
        "exit_code",
        "wall_s",
        "updated_at",
        "failed_rank",
        "failed_node",
        "failed_reason",
        "failed_exit_code",
        "failed_signal",
        "failed_stderr",
    }
)


class Summary(BaseModel):
    """What ``summary.json`` says about a run; every field may be missing.

    The keys are a contract (tests and users' scripts read them): every key the
    project writes is declared here. Unknown keys are kept (``model_extra``) and
    written back (:meth:`fields`).
    """

    model_config = ConfigDict(extra="allow", defer_build=True, allow_inf_nan=False)

    # where the run stands
    status: Status | None = None
    stop_reason: str | None = None
    restarts: int | None = None
    error: str | None = None
    wall_s: float | None = None
    started_at: str | None = None
    updated_at: str | None = None
    # what runs (written once per attempt: trainer/reporting.py's run_facts)
    name: str | None = None
    job_id: str | None = None
    arch: str | None = None
    strategy: str | None = None
    precision: str | None = None
    world_size: int | None = None
    num_nodes: int | None = None
    hostnames: list[str] | None = None
    device: str | None = None
    epochs: int | None = None  # with steps_per_epoch: the total steps 'status --watch' counts to
    steps_per_epoch: int | None = None
    total_steps: int | None = None  # a user loop's own total (hpctrain.task.set_summary): wins over the product
    batch_size: int | None = None
    global_batch_size: int | None = None
    deterministic: bool | None = None
    global_rank: int | None = None  # the rank that wrote it (0)
    # progress (trainer/state.py's Progress)
    epochs_completed: int | None = None
    global_step: int | None = None
    train_top1: float | None = Field(None, ge=0, le=100)  # percent
    train_top5: float | None = Field(None, ge=0, le=100)  # percent
    train_loss: float | None = None
    val_loss: float | None = None
    val_top1: float | None = Field(None, ge=0, le=100)  # percent
    val_top5: float | None = Field(None, ge=0, le=100)  # percent
    best_val_top1: float | None = Field(None, ge=0, le=100)  # percent
    train_images_per_s: float | None = Field(None, ge=0)
    data_wait_fraction: float | None = Field(
        None, ge=0, le=1
    )  # time blocked on the next batch / step time (input-bound if high)
    skipped_samples: int | None = None  # unreadable images replaced this attempt
    weights_sha256: str | None = None  # of the final weights (a run that ended)
    # who failed first (runtime/failures.py), and a hang (runtime/hang.py)
    failed_rank: int | None = None
    failed_node: str | None = None
    failed_reason: str | None = None
    hung_rank: int | None = None  # the rank that stopped making progress first (hang detection)
    hung_node: str | None = None
    hung_phase: str | None = None
    hung_step: int | None = None  # the hung rank's last step
    hung_frozen_s: float | None = None  # the hung rank's whole process froze: its heartbeat was silent this long
    failed_exit_code: int | None = None  # a script job: the first failed script's exit code ...
    failed_signal: str | None = None  # ... or the signal that killed it (SIGKILL)
    failed_stderr: list[str] | None = None  # ... and its last lines of output
    hang_job_id: str | None = None  # the job whose hang this is (a requeued job's next attempt is not hung)
    stack_dumps: str | None = None  # the folder of every rank's stacks at the hang (rundir.stacks_dir)
    # node health (healing/), kept by every later attempt
    excluded_nodes: list[str] | None = None  # nodes a healing run keeps away from (healing/supervisor.py)
    # one record per decision about a node, per burn-in, per eviction: contract/node_records.py reads them typed
    node_failures: list[dict[str, Any]] | None = None  # node, kind, step, checkpoint_step, reason, action, nodes
    burn_in: list[dict[str, Any]] | None = None  # each burn-in's node scores and flagged nodes
    evictions: list[dict[str, Any]] | None = None  # each slow node evicted during training
    # a strategy's own report
    hogwild_workers: list[dict[str, Any]] | None = None  # strategies/hogwild.py: each worker's steps and images
    ps_rejected_pushes: int | None = None  # strategies/ps.py: stale pushes an async server refused
    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("excluded_nodes", "node_failures", mode="before")
    @classmethod
    def _drop_malformed_entries(cls, value: Any, info: ValidationInfo) -> Any:
        """One malformed entry costs that entry, not the whole list (every lost node's line with it)."""
        if not isinstance(value, list):
            return value
        kind = str if info.field_name == "excluded_nodes" else dict
        return [item for item in value if isinstance(item, kind)]

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    def fields(self) -> dict[str, Any]:
        """Every key the file had (even one of an unexpected type), for writing back."""
        return {**self._raw, **self.model_dump(exclude_unset=True)}


def parse_summary(data: Any) -> Summary | None:
    """A Summary from decoded JSON; fields of the wrong type are dropped, never raised."""
    if not isinstance(data, dict):
        return None
    raw, data = dict(data), dict(data)
    for _ in range(len(data) + 1):
        try:
            summary = Summary.model_validate(data)
            summary._raw = raw
            return summary
        except ValidationError as exc:
            bad = {error["loc"][0] for error in exc.errors() if error["loc"]}
            if not bad & data.keys():
                return None
            for key in bad:
                data.pop(key, None)
    return None


def read_summary(run_dir: Path) -> Summary | None:
    """The run's summary, or None when there is none (yet) or it cannot be read."""
    return parse_summary(read_json_object(summary_path(run_dir), within=run_home(run_dir)))


def kept_fields(current: Summary | None, keep: Collection[str] | None = None) -> dict[str, Any]:
    """What a writer that rewrites ``summary.json`` keeps of ``current``: the keys in ``keep``; with None, every
    key but the :data:`OUTCOME_KEYS` it decides itself (a script job's wrapper after its script wrote)."""
    fields = current.fields() if current is not None else {}
    if keep is None:
        return {key: value for key, value in fields.items() if key not in OUTCOME_KEYS}
    return {key: value for key, value in fields.items() if key in keep}


def write_summary(run_dir: Path, fields: Mapping[str, Any]) -> None:
    """Write ``summary.json`` exactly as ``fields`` (rank 0 only); its status must be a known one."""
    status = fields.get("status")
    if status is not None and status not in (*FINAL_STATUSES, "running"):
        raise RunDirError(f"summary status {status!r} is not one of running, completed, stopped, failed")
    write_json_atomic(summary_path(run_dir), fields)

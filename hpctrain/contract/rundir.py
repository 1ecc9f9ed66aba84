"""Run directories: ``OUTPUT_DIR/NAME/RUN_ID/``, never reused for a new run.

The one owner of the folder's layout: every name below is spelled here, and
the trainer, the runtime, the healing supervisor, ``jobspec/lead_time`` and
every verb find paths only through here (tests too). A file with a payload
of its own has its owner beside this one (named in parentheses). A run
directory holds::

    spec.yaml                           the resolved spec
    run.json                            what was submitted where: job ids, cluster, submitit folder, a local
                                        run's proof (launch/local_run.py)
    trial-NNN/                          a sweep's trials, each a run directory (sharing the sweep's submitit/)
    submitit/JOBID_RANK_log.{out,err}   each task's output
    submitit/JOBID_guardian_log.err     a healing job's guardian, when it has something to say
    checkpoints/step-NNNNNNNN/{state.pt,meta.json}, checkpoints/best.json     (the trainer's)
    checkpoints/step-NNNNNNNN/{.metadata,__R_0.distcp,meta.json}              (hpctrain.task's; both listed,
                                        complete or ignored, by contract/checkpoint_listing.py)
    tb/                                 TensorBoard events
    metrics.jsonl                       every step, epoch and validation (contract/metrics.py)
    summary.json                        what the run says about itself (contract/summary.py); its node events,
                                        burn-ins and evictions (contract/node_records.py)
    code/                               the entry point's code, copied at submit (launch/code_snapshot.py)
    heartbeats/rank-NNNNN.json          each rank's last step, phase and step times (contract/heartbeat_files.py)
    stacks/rank-NNNNN.txt               each rank's Python stacks, dumped when the job hangs
    stacks/.hang-reported-JOB           the one rank that reports job JOB's hang claims it (O_EXCL)
    report/                             ``hpctrain report RUN``'s output, by default
    .hpctrain/cancel-requested          ``hpctrain cancel``'s marker (contract/cancel_marker.py)
    .hpctrain/torchrun-failures.log     launcher torchrun: each node's first failed rank, for rank 0
    .hpctrain/script-exits/ATTEMPT/task-N.json  a script job: how task N's script failed (exit code, last
                                        lines; runtime/script/outcome.py)
    .hpctrain/supervisor.json           a healing job's record of the step it runs (contract/node_records.py;
                                        written by healing/record.py)
    .hpctrain/slurm-relay/              a container job's Slurm requests, answered outside the image
                                        (runtime/slurm_relay.py)
    .hpctrain/tracking/TRACKER.json     what 'hpctrain sync' has sent to each tracker (contract/tracking_state.py)
    wandb/                              the run's W&B offline run folder, written by 'hpctrain sync'

A study (one Slurm job per resource point) is ``OUTPUT_DIR/NAME/STUDY_ID/``
with ``study.json`` listing its points (contract/study_file.py) and one run
directory per point.

Outside any run: the user's bad-node ledger, ``$XDG_STATE_HOME/hpctrain/
bad-nodes.jsonl`` (contract/bad_nodes.py), which runs add to and ``submit``
excludes from; and, on a compute node, the job's own folder
``<stage_dir>/hpctrain-<uid>/job-<job>/`` (dataset/node_folder.py).

A checkpoint is complete (its ``meta.json``, written last, records the size
of every file it holds: the trainer's ``state.pt``, or a
torch.distributed.checkpoint folder's files) or it is ignored;
``contract/step_folders.py`` writes them. A folder's step is what its
``meta.json`` records; a ``step-N`` name (ASCII digits, at most 18) is only
believed when it says the same N. ``summary.json`` is read as a typed
:class:`~hpctrain.contract.summary.Summary` that tolerates missing, extra and
half-written fields.
Every write here is atomic (temp file, fsync, rename). Torch-free.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract.file_writes import write_atomic
from hpctrain.contract.runfiles import RunFileError, check_inside, printable, read_json, real_path
from hpctrain.errors import RunDirError

RUN_FILE = "run.json"
SPEC_FILE = "spec.yaml"
SUMMARY_FILE = "summary.json"
SUBMITIT_DIR = "submitit"
CHECKPOINTS_DIR = "checkpoints"
TB_DIR = "tb"
METRICS_FILE = "metrics.jsonl"
CONTROL_DIR = ".hpctrain"
CANCEL_MARKER_NAME = "cancel-requested"
TORCHRUN_FAILURES_NAME = "torchrun-failures.log"
SUPERVISOR_RECORD_NAME = "supervisor.json"
SCRIPT_EXITS_NAME = "script-exits"
SLURM_RELAY_NAME = "slurm-relay"
TRACKING_NAME = "tracking"
WANDB_DIR = "wandb"
REPORT_DIR = "report"
STATE_FILE = "state.pt"
META_FILE = "meta.json"
BEST_FILE = "best.json"
HEARTBEATS_DIR = "heartbeats"
STACKS_DIR = "stacks"
STUDY_FILE = "study.json"
CHAIN_END_NAME = "chain-ended.json"  # why after: ended this run without running it (contract/chain_links.py)
DEPENDENTS_NAME = "dependents"  # one file per run chained after this one
BURN_IN_VERDICTS_NAME = "burn-in-verdicts"  # a node's burn-in verdict for its other tasks (healing/script_burn_in.py)
CODE_DIR = "code"  # the snapshot of the entry point's code (a sweep's trials share their sweep's)
TRIAL_DIR = re.compile(r"^trial-\d{3,}$")
_JOB_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_.-]{0,63}$")


# ------------------------------------------------------------------ paths


def spec_path(run_dir: Path) -> Path:
    return Path(run_dir) / SPEC_FILE


def run_info_path(run_dir: Path) -> Path:
    return Path(run_dir) / RUN_FILE


def summary_path(run_dir: Path) -> Path:
    return Path(run_dir) / SUMMARY_FILE


def metrics_path(run_dir: Path) -> Path:
    return Path(run_dir) / METRICS_FILE


def tb_dir(run_dir: Path) -> Path:
    return Path(run_dir) / TB_DIR


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def cancel_marker_path(run_dir: str | Path) -> Path:
    """Where ``hpctrain cancel`` leaves its marker for the run in ``run_dir``."""
    return Path(run_dir) / CONTROL_DIR / CANCEL_MARKER_NAME


def torchrun_failures_path(run_dir: str | Path) -> Path:
    """Where the torchrun launcher's node tasks report failed ranks (srun's report, in srun's words)."""
    return Path(run_dir) / CONTROL_DIR / TORCHRUN_FAILURES_NAME


def script_exit_path(run_dir: str | Path, attempt: str, task: int) -> Path:
    """Where task ``task`` of a script job's start ``attempt`` records how its script failed (runtime/script/)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", attempt) or "local"
    return Path(run_dir) / CONTROL_DIR / SCRIPT_EXITS_NAME / safe / f"task-{task:05d}.json"


def supervisor_record_path(run_dir: str | Path) -> Path:
    """Where a healing job's batch step records the step it runs (healing/supervisor.py)."""
    return Path(run_dir) / CONTROL_DIR / SUPERVISOR_RECORD_NAME


def chain_end_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONTROL_DIR / CHAIN_END_NAME


def dependents_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONTROL_DIR / DEPENDENTS_NAME


def slurm_relay_dir(run_dir: str | Path) -> Path:
    """Where a container job's tasks leave Slurm requests for the batch step outside the image."""
    return Path(run_dir) / CONTROL_DIR / SLURM_RELAY_NAME


def burn_in_verdict_path(run_dir: str | Path, attempt: str, node_rank: int) -> Path:
    """Where a node's burn-in prober leaves this start's (``attempt``) verdict for the node's other tasks."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", attempt or "local")
    return Path(run_dir) / CONTROL_DIR / BURN_IN_VERDICTS_NAME / f"{safe}-node{node_rank}"


def tracking_dir(run_dir: str | Path) -> Path:
    """Where ``hpctrain sync`` keeps what it has sent to each tracker (contract/tracking_state.py)."""
    return Path(run_dir) / CONTROL_DIR / TRACKING_NAME


def wandb_dir(run_dir: str | Path) -> Path:
    """Where ``hpctrain sync`` writes the run's W&B offline run (``tracking.wandb.mode: offline``)."""
    return Path(run_dir) / WANDB_DIR


def report_dir(run_dir: str | Path) -> Path:
    """Where ``hpctrain report RUN`` writes, unless told otherwise."""
    return Path(run_dir) / REPORT_DIR


def trial_dir(sweep_dir: Path, index: int) -> Path:
    """Where trial ``index`` of a sweep runs (its own run directory)."""
    return Path(sweep_dir) / f"trial-{index:03d}"


def is_trial_dir(path: Path) -> bool:
    """Whether ``path`` is named as a sweep's trial (``trial-NNN``)."""
    return bool(TRIAL_DIR.match(Path(path).name))


def run_home(run_dir: Path) -> Path:
    """The folder a run shares with its siblings: a trial's sweep directory, else the run directory itself."""
    run_dir = Path(run_dir)
    return run_dir.parent if is_trial_dir(run_dir) else run_dir


def code_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CODE_DIR


def task_log_name(job_id: str, rank: int | str, *, err: bool) -> str:
    """submitit's name for one task's stdout/stderr (``%j``/``%t`` patterns for sbatch work too)."""
    return f"{job_id}_{rank}_log.{'err' if err else 'out'}"


def guardian_log_path(run_dir: Path, job_id: str) -> Path:
    """A healing job's guardian log, beside the job's other logs (every start of the job appends to it)."""
    return submitit_dir(run_dir) / f"{job_id}_guardian_log.err"


def heartbeats_dir(run_dir: Path) -> Path:
    return Path(run_dir) / HEARTBEATS_DIR


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    """Rank ``rank``'s heartbeat file (written atomically at a low rate)."""
    return heartbeats_dir(run_dir) / f"rank-{rank:05d}.json"


def stacks_dir(run_dir: Path) -> Path:
    return Path(run_dir) / STACKS_DIR


def stack_dump_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` dumps its Python stacks (faulthandler) when the job hangs."""
    return stacks_dir(run_dir) / f"rank-{rank:05d}.txt"


def hang_claim_path(run_dir: Path, job_id: str) -> Path:
    """The marker the one rank that reports job ``job_id``'s hang creates (O_EXCL) before writing the summary."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(job_id) or "local")
    return stacks_dir(run_dir) / f".hang-reported-{safe}"


def study_file(study_dir: Path) -> Path:
    return Path(study_dir) / STUDY_FILE


def is_study_dir(path: Path) -> bool:
    """A study directory holds ``study.json`` (its points are run directories below it)."""
    return study_file(Path(path)).is_file()


def submitit_dir(run_dir: Path, info: Mapping[str, Any] | None = None) -> Path:
    """submitit's folder (pickles, logs): as ``run.json`` records it, if that lies inside the run.

    "Inside" is the run directory, or for a sweep's trial the sweep's directory
    (its one array shares a folder). A recorded folder elsewhere -- a run copied
    or moved, or a crafted run.json -- is not followed: the folder has the same
    place in this copy, so that place is used. That place is read only where
    it stays inside too (``RUN/submitit`` a symlink out of the run is not
    followed): every reader of the logs passes the run's home as ``within``.
    """
    run_dir = Path(run_dir)
    home = run_home(run_dir)
    recorded = (info or {}).get("submitit_dir")
    if isinstance(recorded, str) and recorded:
        path = run_dir / recorded  # an absolute path replaces run_dir
        if is_inside(path, home):
            return path
        return home / SUBMITIT_DIR
    return run_dir / SUBMITIT_DIR


def submitit_dir_ignored(run_dir: Path, info: Mapping[str, Any]) -> str | None:
    """run.json's ``submitit_dir`` when :func:`submitit_dir` did not follow it (for a note), else None."""
    recorded = info.get("submitit_dir")
    if not isinstance(recorded, str) or not recorded:
        return None
    return None if submitit_dir(run_dir, info) == Path(run_dir) / recorded else recorded


def is_inside(path: Path, root: Path) -> bool:
    """Whether ``path``, symlinks resolved, lies inside ``root``: the one rule every reader of a run
    directory follows (``runfiles.check_inside``; ``within=`` of the bounded readers)."""
    try:
        check_inside(path, root)
    except RunFileError:
        return False
    return True


def task_log_path(run_dir: Path, info: Mapping[str, Any], rank: int, *, err: bool) -> Path:
    """One task's stdout/stderr of the run's latest job (as submitit names them).

    The job id becomes part of a file name, so it must be one (``123``, ``123_4``, a pid).
    """
    job_id = str(info.get("job_id"))
    if not _JOB_ID.match(job_id):
        raise RunDirError(
            f"{Path(run_dir) / RUN_FILE}: job_id {printable(job_id)!r} is not a job id; its logs are not looked for",
            hint="run.json was edited or damaged; the logs are in " + str(submitit_dir(run_dir, info)),
        )
    return submitit_dir(run_dir, info) / task_log_name(job_id, rank, err=err)


# ------------------------------------------------------------------ atomic writes


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` so readers see the old file or the new one, never half (and never through a link)."""
    write_atomic(path, text)


def write_json_atomic(path: Path, value: Mapping[str, Any], *, sort_keys: bool = False) -> None:
    """The one JSON writer for shared run files (summary, run.json, best.json)."""
    atomic_write_text(path, json.dumps(dict(value), indent=2, sort_keys=sort_keys, default=str) + "\n")


def read_json_object(path: Path, *, within: Path | None = None) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when missing, unreadable, not an object or (``within``: the
    run's home) reached through a symlink out of the run; never raises."""
    try:
        value = read_json(path, within=within)
    except (OSError, ValueError, RunFileError):
        return None
    return value if isinstance(value, dict) else None


# ------------------------------------------------------------------ run directories


def new_run_id(now: float | None = None) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now))


def next_run_dir(output_dir: str, name: str, now: float | None = None) -> Path:
    """The directory a new run would get (not created): a dry run shows this."""
    base = real_path(Path(output_dir).expanduser()) / name
    run_id = new_run_id(now)
    candidate, suffix = base / run_id, 1
    while candidate.exists():
        suffix += 1
        candidate = base / f"{run_id}-{suffix}"
    return candidate


def create_run_dir(output_dir: str, name: str) -> Path:
    """Create a fresh run directory; a concurrent submit never gets the same one."""
    for _ in range(100):
        candidate = next_run_dir(output_dir, name)
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
        except OSError as exc:
            raise RunDirError(
                f"cannot create run directory under {candidate.parent}: {exc.strerror}",
                hint="set output_dir in the spec (or --set output_dir=DIR) to a writable directory",
            ) from None
    raise RunDirError(f"could not find a free run directory under {Path(output_dir).expanduser() / name}")


def write_run_info(run_dir: Path, info: dict[str, Any]) -> None:
    write_json_atomic(run_dir / RUN_FILE, info, sort_keys=True)


def read_run_info(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_FILE
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory", hint="'hpctrain status' lists recent runs")
    if not path.exists():
        raise RunDirError(
            f"{run_dir}: not an hpctrain run directory (no {RUN_FILE})",
            hint="pass a directory OUTPUT_DIR/NAME/RUN_ID created by 'hpctrain submit'",
        )
    try:
        info = read_json(path, within=run_home(run_dir))
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable ({exc})") from None
    if not isinstance(info, dict):
        raise RunDirError(
            f"{path}: holds a JSON {type(info).__name__}, not the run's record (an object)",
            hint="the file was overwritten; the run's logs and checkpoints are still in " + str(run_dir),
        )
    return info

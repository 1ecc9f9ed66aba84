"""From a loaded job to a submitit executor, its sbatch script, and a submitted run.

There is one script (TorchX's ``submit = schedule(dryrun(...))``): spec ->
executor parameters is the pure ``jobscript.parameters.slurm_parameters``, tested
against golden files, and ``jobscript.sbatch_script.render_sbatch`` turns those
parameters into the text ``sbatch`` receives. ``render_script`` prints it for ``--dry-run`` without
importing submitit; ``build_executor``'s submitit executor writes the same
text when ``submit`` hands it the per-task callable.
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpctrain.contract import job_registry
from hpctrain.contract.file_writes import write_failure
from hpctrain.contract.rundir import (
    atomic_write_text,
    create_run_dir,
    read_run_info,
    spec_path,
    submitit_dir,
    trial_dir,
    write_run_info,
)
from hpctrain.contract.runfiles import real_path
from hpctrain.contract.tracking_state import TRACKING_ID_KEY, new_tracking_id
from hpctrain.dataset import squashfs
from hpctrain.errors import ClusterError, RunDirError, UsageError
from hpctrain.jobscript.parameters import container_mounts, node_needs, slurm_parameters, supervisor_command
from hpctrain.jobscript.sbatch_script import python_command, render_sbatch, task_command
from hpctrain.jobspec.load import LoadedJob
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.slurm_time import seconds_to_minutes
from hpctrain.jobspec.yaml_source import dump_yaml
from hpctrain.launch.exclusion import Exclusion, plan_exclusion
from hpctrain.launch.expedite import Expedite, expedite_for
from hpctrain.runtime.rank_plan import local_visible_devices
from hpctrain.version import __version__

if TYPE_CHECKING:
    import submitit

    from hpctrain.launch import code_snapshot

Backend = Literal["slurm", "local"]


def backend_for(job: LoadedJob, local: bool) -> Backend:
    return "local" if local or job.profile.scheduler == "local" else "slurm"


def task_python(spec: JobSpec) -> str:
    """The command srun starts every task with (submitit appends ``-u -m submitit.core._submit DIR``)."""
    if spec.container is None:
        return python_command(hold_stop_signals=True)
    inner = python_command(spec.container.python, hold_stop_signals=True)
    if spec.container.runtime == "pyxis":
        return inner
    apptainer = ["apptainer", "exec", "--bind", ",".join(container_mounts(spec)), "--pwd", str(real_path(Path.cwd()))]
    if spec.data.root and squashfs.is_image(Path(spec.data.root).expanduser()):  # a packed dataset image
        image = str(real_path(Path(spec.data.root).expanduser()))
        apptainer += ["--bind", f"{image}:{squashfs.APPTAINER_BIND}:image-src=/"]
        apptainer += ["--env", f"{squashfs.BIND_ENV}={squashfs.APPTAINER_BIND}"]
    options = list(spec.container.options)
    if spec.resources.gpus_per_node and "--nv" not in options:
        options.insert(0, "--nv")
    apptainer[2:2] = options
    return shlex.join([*apptainer, spec.container.image]) + " " + inner


def task_count(spec: JobSpec, backend: Backend) -> int:
    """The job's tasks (submitit's, one log each): a process per rank, or one per node where that process
    starts the node's ranks (torchrun on Slurm, a script per node)."""
    if backend == "local":
        return int(local_parameters(spec)["tasks_per_node"])
    return spec.resources.nodes * spec.slurm_tasks_per_node


def local_parameters(spec: JobSpec) -> dict[str, Any]:
    """submitit LocalExecutor parameters: the whole world as tasks on this machine."""
    gpus = (spec.resources.gpus_per_node or 0) * spec.resources.nodes
    per_node = spec.script is not None and spec.script.per == "node"  # each "node" starts its own workers
    return {
        "tasks_per_node": spec.resources.nodes if per_node else spec.world_size,
        "nodes": 1,
        "timeout_min": seconds_to_minutes(spec.resources.time_s),
        "gpus_per_node": gpus,
        "signal_delay_s": spec.signals.signal_delay_s,
    }


def local_devices(spec: JobSpec, environ: Mapping[str, str] | None = None) -> str:
    """The GPUs a local run's tasks see: a subset of the user's ``CUDA_VISIBLE_DEVICES``; UsageError when it
    holds fewer than the job asks for."""
    environ = os.environ if environ is None else environ
    gpus = (spec.resources.gpus_per_node or 0) * spec.resources.nodes
    return local_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"), gpus)


def build_executor(
    job: LoadedJob, backend: Backend, run_dir: Path, exclude: tuple[str, ...] = (), *, expedite: bool = False
) -> submitit.Executor:
    # here, not at the top: submitit imports asyncio, a fifth of a login-node command's time
    from hpctrain.launch.submitit_executor import LocalExecutor, SlurmExecutor

    folder = submitit_dir(run_dir)
    if backend == "local":
        # Its controller carries a run token; run.json records what proves it (launch/local_run.py).
        executor: submitit.Executor = LocalExecutor(folder=folder)
        executor.update_parameters(**local_parameters(job.spec))
        executor.visible_devices = local_devices(job.spec)
    else:
        # Each task starts under the reaper's exec wrapper, so everything it
        # starts carries its token and is cleaned up after it (cleanup.py).
        executor = SlurmExecutor(folder=folder, python=task_python(job.spec))
        executor.update_parameters(**slurm_parameters(job.spec, job.profile, run_dir, exclude, expedite=expedite))
        executor.supervisor = supervisor_command(job.spec, run_dir)
    return executor


def render_script(job: LoadedJob, run_dir: Path, exclude: tuple[str, ...] = (), *, expedite: bool = False) -> str:
    """The exact sbatch script ``submit`` would hand to Slurm for this job (without importing submitit)."""
    parameters = slurm_parameters(job.spec, job.profile, run_dir, exclude, expedite=expedite)
    if job.is_sweep:
        parameters["map_count"] = len(job.trials)
    folder = submitit_dir(run_dir)
    command = task_command(task_python(job.spec), folder)
    return render_sbatch(parameters, folder, command, supervisor_command(job.spec, run_dir))


@dataclass
class SubmittedRun:
    job_id: str
    run_dir: Path
    backend: Backend
    jobs: list[submitit.Job]
    trial_dirs: list[Path]
    code: code_snapshot.Snapshot | None = None  # what was copied into RUN/code, and what was left out
    notes: tuple[str, ...] = ()  # what the submit says besides: the bad-node ledger's exclusions, expedited requeue


def submit_run(
    job: LoadedJob,
    *,
    local: bool = False,
    run_dir: Path | None = None,
    snapshot: bool = True,
    exclude_bad_nodes: bool = True,
) -> SubmittedRun:
    """Create the run directory (a new one, or ``run_dir``: a study's point), write the resolved spec,
    copy the user's code, and submit, away from the nodes of the user's bad-node ledger
    (``exclude_bad_nodes``; ``launch/exclusion.py``)."""
    from hpctrain.contract.slurm import Slurm  # here: --dry-run need not load it

    backend = backend_for(job, local)
    if job.spec.script is not None:
        from hpctrain.launch.script_code import require_program

        require_program(job)
    if backend == "slurm" and not Slurm().available():
        raise ClusterError(
            f"{job.source}: cluster '{job.profile.name}' needs Slurm, but 'sbatch' is not on this machine",
            hint=f"run it here with 'hpctrain submit {job.source} --local', or submit from a login node",
        )
    exclusion = bad_node_exclusion(job, backend, exclude_bad_nodes)
    expedite = expedite_choice(job, backend)
    if run_dir is None:
        run_dir = create_run_dir(job.spec.output_dir, job.spec.name)
    else:
        run_dir.mkdir(parents=True)
    try:
        trial_dirs = _write_trials(job, run_dir)
        copied = _snapshot_code(job, run_dir) if snapshot else None
        record = copied.as_json() if copied else None
        code_root = str(run_dir / copied.import_root) if copied and job.spec.script is None else None
        jobs = _launch(job, backend, run_dir, trial_dirs, code_root, exclusion.nodes, record, expedite.used)
    except (ClusterError, UsageError):
        _remove_unsubmitted(run_dir)
        raise
    except OSError as exc:  # a full disk, a quota, a folder turned read-only: which file, which disk
        message = write_failure(exc, run_dir)
        _remove_unsubmitted(run_dir)
        hint = "free space there, or set output_dir (--set output_dir=DIR) to another file system"
        raise RunDirError(message, hint=hint) from None
    job_id = jobs[0].job_id.split("_")[0] if job.is_sweep else jobs[0].job_id
    code = {"code_snapshot": record} if record else {}
    code.update(_expedite_record(expedite))
    from hpctrain.launch.code_snapshot import for_trial

    for one_dir, one in zip(trial_dirs, jobs):
        trial_code = {"code_snapshot": for_trial(record, run_dir, one_dir)} if record else {}
        extra = {**trial_code, **_expedite_record(expedite), **_local_record(one)}
        _record_submission(one_dir, job, backend, one.job_id, submitit_dir(run_dir), extra=extra)
    if job.is_sweep:
        extra = {**code, **_local_record(jobs[0])}
        _record_submission(run_dir, job, backend, job_id, submitit_dir(run_dir), trials=len(jobs), extra=extra)
    return SubmittedRun(job_id, run_dir, backend, jobs, trial_dirs, copied, exclusion.notes + expedite.notes)


def expedite_choice(job: LoadedJob, backend: Backend) -> Expedite:
    """Whether a Slurm submit uses ``--requeue=expedite`` (``launch/expedite.py``), asking the cluster."""
    if backend != "slurm":
        return Expedite()
    from hpctrain.contract.slurm import Slurm

    return expedite_for(job, support=Slurm().expedited_requeue)


def _expedite_record(expedite: Expedite) -> dict[str, Any]:
    """run.json's ``expedited_requeue`` (only when used): ``hpctrain doctor`` and the docs' readers look for it."""
    return {"expedited_requeue": True} if expedite.used else {}


def bad_node_exclusion(job: LoadedJob, backend: Backend, use_ledger: bool) -> Exclusion:
    """The nodes a Slurm submit excludes, asking Slurm for the partition's usable nodes."""
    if backend != "slurm":
        return Exclusion()
    from hpctrain.contract.slurm import Slurm

    needs = node_needs(job.spec)  # only nodes that can hold one of the job's nodes (GPUs, CPUs, features)
    return plan_exclusion(
        job, use_ledger=use_ledger, available=lambda partition: Slurm().partition_nodes(partition, needs=needs)
    )


def resubmit(run_dir: Path, job: LoadedJob, *, local: bool = False) -> SubmittedRun:
    """Continue an existing run as a new job in the same run directory."""
    from hpctrain.contract.slurm import Slurm

    backend = backend_for(job, local)
    if backend == "slurm" and not Slurm().available():
        raise ClusterError("'sbatch' is not on this machine", hint="resume from a login node, or pass --local")
    from hpctrain.launch import code_snapshot  # here: --dry-run need not load it

    record = read_run_info(run_dir).get("code_snapshot")
    code_root = code_snapshot.import_root(run_dir, record) if job.spec.script is None else None
    exclusion = bad_node_exclusion(job, backend, True)  # the nodes this run (or another) found bad
    expedite = expedite_choice(job, backend)
    root = str(code_root) if code_root else None
    jobs = _launch(job, backend, run_dir, [run_dir], root, exclusion.nodes, record, expedite.used)
    extra = {**_expedite_record(expedite), **_local_record(jobs[0])}
    _record_submission(run_dir, job, backend, jobs[0].job_id, submitit_dir(run_dir), extra=extra)
    return SubmittedRun(jobs[0].job_id, run_dir, backend, jobs, [run_dir], notes=exclusion.notes + expedite.notes)


def _write_trials(job: LoadedJob, run_dir: Path) -> list[Path]:
    atomic_write_text(spec_path(run_dir), dump_yaml(job.spec.model_dump(mode="json")))
    if not job.is_sweep:
        return [run_dir]
    dirs = []
    for index, (trial, params) in enumerate(zip(job.trials, job.trial_params)):
        folder = trial_dir(run_dir, index)
        folder.mkdir()
        header = f"# sweep trial {index}: {params}\n"
        atomic_write_text(spec_path(folder), header + dump_yaml(trial.model_dump(mode="json")))
        dirs.append(folder)
    return dirs


def _snapshot_code(job: LoadedJob, run_dir: Path) -> code_snapshot.Snapshot | None:
    """Copy the entry point's or the script's code into the run directory (see code_snapshot.py,
    script_code.py); None when nothing is copied."""
    if job.spec.script is not None:
        from hpctrain.launch import script_code

        found = script_code.locate(job.spec.script)
        return script_code.take(found, job.spec, run_dir) if found is not None else None
    if job.spec.entrypoint is None:
        return None
    from hpctrain.launch import code_snapshot  # here: --dry-run need not load it

    source = code_snapshot.locate(job.spec.entrypoint)
    return code_snapshot.take(source, run_dir) if source is not None else None


def _launch(
    job: LoadedJob,
    backend: Backend,
    run_dir: Path,
    trial_dirs: list[Path],
    code_root: str | None = None,
    exclude: tuple[str, ...] = (),
    code_record: object = None,
    expedite: bool = False,
) -> list[submitit.Job]:
    from submitit.core.utils import FailedJobError

    from hpctrain.contract.slurm_answers import classify_sbatch_failure
    from hpctrain.launch.task_programs import script_launchers, task_launchers

    executor = build_executor(job, backend, run_dir, exclude, expedite=expedite)
    if job.spec.script is not None:
        launchers = script_launchers(job, run_dir, trial_dirs, backend, code_record)
    else:
        launchers = task_launchers(job, trial_dirs, backend, code_root)
    try:
        if backend == "local":  # one controller per trial, each told the run directory it serves
            jobs = []
            for launcher, one_dir in zip(launchers, trial_dirs, strict=True):
                executor.run_dir = one_dir  # type: ignore[attr-defined]
                jobs.append(executor.submit(launcher))
            return jobs
        if len(launchers) == 1:
            return [executor.submit(launchers[0])]
        return list(executor.submit_array(launchers))
    except (FailedJobError, OSError, RuntimeError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, FileNotFoundError):
            raise  # writing the job's files (a full disk): submit_run names the file and its disk
        meaning, hint = classify_sbatch_failure(str(exc))
        raise ClusterError(f"sbatch: {meaning}: {_first_lines(str(exc))}", hint=hint) from None


def _record_submission(
    run_dir: Path,
    job: LoadedJob,
    backend: Backend,
    job_id: str,
    folder: Path,
    trials: int | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    try:
        info = read_run_info(run_dir)
    except Exception:
        info = {
            "name": job.spec.name,
            "created_at": time.time(),
            "hpctrain_version": __version__,
            "spec_source": str(real_path(job.source)),
            "job_ids": [],
        }
    info.update(
        {
            "backend": backend,
            "cluster": job.profile.name,
            "job_id": job_id,
            "world_size": job.spec.world_size,
            "tasks": task_count(job.spec, backend),  # one log each: 'hpctrain logs --rank N' names one
            "nodes": job.spec.resources.nodes,  # a resume may change it (resume --set resources.nodes=K)
            "submitit_dir": str(folder),
            "submitted_at": time.time(),
        }
    )
    if job.spec.runs_trainer:
        info.setdefault("global_batch_size", job.spec.global_batch_size)  # as first submitted: resumes keep it
    info["job_ids"] = [*info.get("job_ids", []), job_id]
    info.setdefault(TRACKING_ID_KEY, new_tracking_id())  # chosen once: every start continues one tracker run
    if trials is not None:
        info["trials"] = trials
    info.update(extra or {})
    write_run_info(run_dir, info)
    job_registry.record(job_id, run_dir)


def _local_record(job: submitit.Job) -> dict[str, Any]:
    """run.json's proof of a local job's controller (``local_process``); nothing for a Slurm job.

    A resumed run replaces the record of its previous attempt, whose controller has ended.
    """
    from hpctrain.launch.local_run import RECORD_KEY

    record = getattr(job, "local_process", None)
    return {RECORD_KEY: record.as_json()} if record is not None else {}


def _remove_unsubmitted(run_dir: Path) -> None:
    """A submission that never reached Slurm leaves nothing behind."""
    shutil.rmtree(run_dir, ignore_errors=True)


def _first_lines(text: str, count: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[:count])

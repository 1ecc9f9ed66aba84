"""What ``submit --dry-run`` shows: the exact sbatch script, the code snapshot plan and each rank's view.

Its text quotes spec values, arguments and folder names: command lines are
written with :func:`shell_words` (exact and pasteable, unprintable characters
as ``$'\\u202e'``), and the CLI escapes whatever else it holds
(``hpctrain.errors.printable``) before it reaches a terminal.

The script is rendered from the same executor parameters a real submit uses
(``submission.render_script``), so what it prints is what Slurm gets; nothing
touches Slurm or the output directory. Torch-free.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import NamedTuple

from hpctrain.contract.rundir import next_run_dir
from hpctrain.jobspec.load import LoadedJob
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.node_health import burn_in_applies
from hpctrain.jobspec.node_loss import node_count_text
from hpctrain.jobspec.tracking_checks import where_runs_appear
from hpctrain.launch.exclusion import plan_exclusion
from hpctrain.launch.expedite import expedite_for
from hpctrain.launch.submission import backend_for, local_devices, render_script


class DryRun(NamedTuple):  # not a dataclass: building one costs --dry-run 0.7 ms of start-up
    """What ``submit`` would do, touching neither Slurm nor the output directory.

    ``script``: the exact sbatch script (None when the job runs on this machine, or for a
    study, whose points each get their own); ``text``: all that ``hpctrain submit --dry-run``
    prints (the script, the code snapshot plan and each rank's view, or a study's plan).
    """

    run_dir: Path
    script: str | None
    text: str


def dry_run(job: LoadedJob, *, local: bool = False, snapshot: bool = True, exclude_bad_nodes: bool = True) -> DryRun:
    run_dir = next_run_dir(job.spec.output_dir, job.spec.name)
    if job.is_study:
        from hpctrain.launch.study import render_study_plan

        return DryRun(run_dir, None, render_study_plan(job, run_dir, local=local))
    from hpctrain.runtime.rank_plan import plan_ranks, render_rank_table

    if backend_for(job, local) == "local":
        script = None
        text = (
            f"# cluster '{job.profile.name}' runs on this machine through submitit's local executor:\n"
            f"# {job.spec.world_size} task(s), run directory {run_dir}; no sbatch script is used.\n"
        )
        if job.spec.uses_gpus:
            text += f"# GPUs: the tasks see CUDA_VISIBLE_DEVICES={local_devices(job.spec)}\n"
    else:
        exclusion = plan_exclusion(job, use_ledger=exclude_bad_nodes)  # asks Slurm nothing
        expedite = expedite_for(job, support=None)  # nor here: auto is decided at submit
        script = text = render_script(job, run_dir, exclusion.nodes, expedite=expedite.used)
        if job.spec.resources.heals:  # the script's --nodes counts the spares too
            text += f"\n# nodes: {node_count_text(job.spec.resources)}; the batch step supervises the training step\n"
        notes = exclusion.notes + expedite.notes
        text += "".join(f"\n# {note}" for note in notes) + ("\n" if notes else "")
    text += "".join(f"\n# {line}\n" for line in where_runs_appear(job.spec, f"{job.spec.name}/{run_dir.name}"))
    if job.spec.script is not None:
        from hpctrain.launch.script_code import require_program

        require_program(job)
        return DryRun(run_dir, script, text + script_plan(job, run_dir, local=local, snapshot=snapshot))
    text += burn_in_note(job.spec, local=backend_for(job, local) == "local")
    for line in snapshot_plan(job, snapshot=snapshot):
        text += f"\n{line}\n"
    text += f"\n# {job.spec.name}: what each rank will see\n"
    text += render_rank_table(plan_ranks(job.spec), max_rows=64) + "\n"
    return DryRun(run_dir, script, text)


def script_plan(job: LoadedJob, run_dir: Path, *, local: bool, snapshot: bool) -> str:
    """A script job's plan: its code, and the exact command line of every process with its placeholders
    filled (a sweep: its first trial's; hosts are node0.., a port derived from the job id shows its rule)."""
    import sys

    from hpctrain.launch.script_code import planned
    from hpctrain.runtime.script.command import plan_commands

    spec = job.trials[0]
    assert spec.script is not None
    code, lines = planned(spec, run_dir, snapshot=snapshot)
    python = spec.container.python if spec.container is not None and not local else sys.executable
    rows = plan_commands(spec, str(run_dir), code, python)
    per = "node" if spec.script.per == "node" else "rank"
    text = "".join(f"\n{line}\n" for line in lines)
    if spec.launcher == "torchrun" and not local:
        text += (
            f"\n# each node runs torchrun (--nnodes {spec.resources.nodes} --nproc-per-node {spec.tasks_per_node}, "
            "c10d rendezvous on the first node, --max-restarts 0, --tee 3); each rank it starts runs its script:\n"
        )
    text += burn_in_note(spec, local=local)
    first = f" (sweep trial 0 of {len(job.trials)})" if job.is_sweep else ""
    workdirs = {row[1] for row in rows}
    where = f"in {workdirs.pop()}" if len(workdirs) == 1 else "each in its own folder"
    text += f"\n# {spec.name}{first}: what each {per} runs, {where}\n"
    shown = rows if len(rows) <= 16 else [*rows[:8], None, *rows[-8:]]
    for row in shown:
        if row is None:
            text += f"...  ({len(rows) - 16} more)\n"
            continue
        who, folder, argv = row
        text += f"{who}: {shell_words(argv)}" + ("" if len(workdirs) <= 1 else f"   (in {folder})") + "\n"
    return text


def shell_words(argv: list[str]) -> str:
    """``argv`` as a shell command line a person can read and paste: an argument holding a character that
    prints as nothing or reorders the line (a control, bidi, U+2028) is written in bash's ``$'...'`` form with
    that character escaped, so the line shows exactly what the process gets; the rest as ``shlex.quote``."""
    return " ".join(_ansi_c(word) if not word.isprintable() else shlex.quote(word) for word in argv)


def _ansi_c(word: str) -> str:
    def one(char: str) -> str:
        if char in "\\'":
            return "\\" + char
        if char.isprintable():
            return char
        return f"\\x{ord(char):02x}" if ord(char) < 0x80 else f"\\u{ord(char):04x}"

    return "$'" + "".join(one(char) for char in word) + "'"


def burn_in_note(spec: JobSpec, *, local: bool) -> str:
    """Whether every start probes its nodes before the script or the training starts (healing/burn_in.py;
    under launcher: torchrun each node task, before torchrun)."""
    nodes, settings = spec.resources.nodes, spec.health.burn_in
    if local or not burn_in_applies(spec, nodes):
        return ""
    before = "the script starts" if spec.script is not None else "training starts"
    if spec.launcher == "torchrun":
        before = "torchrun starts (each node task probes its node)"
    return (
        f"\n# burn-in: every start probes its {nodes} nodes before {before} (up to {settings.budget_s:g} s; "
        "a sick node is taken out while its partition can spare it; health.burn_in.enabled: false turns it off; "
        "docs/node-health.md)\n"
    )


def snapshot_plan(job: LoadedJob, *, snapshot: bool) -> list[str]:
    """Which code every attempt will import the entry point from (nothing without an entry point)."""
    if job.spec.entrypoint is None:
        return []
    from hpctrain.launch import code_snapshot

    source = code_snapshot.locate(job.spec.entrypoint) if snapshot else None
    if source is not None:
        chosen = code_snapshot.plan(source)
        commit, dirty = code_snapshot.git_state(source.git_root, chosen) if source.git_root else (None, None)
        where = f" (git {commit[:12]}{', with uncommitted changes' if dirty else ''})" if commit else ""
        lines = [
            f"# code: {', '.join(chosen.packages)} from {chosen.root}{where}: {len(chosen.files)} files are copied "
            "into RUN_DIR/code/ and imported from there"
        ]
        notes = chosen.notes()
        return lines + ([f"# code: left out: {'; '.join(notes)}"] if notes else [])
    if snapshot and job.spec.entrypoint.startswith("hpctrain."):
        return ["# code: the entry point is part of hpctrain; every attempt runs the installed hpctrain"]
    if snapshot:
        return [
            f"# code: {job.spec.entrypoint} is not copied (not found from here, or part of the Python environment:"
            " site-packages or the standard library); the nodes import it from their environment"
        ]
    return ["# code: --no-snapshot: every attempt imports the entry point from the live tree"]

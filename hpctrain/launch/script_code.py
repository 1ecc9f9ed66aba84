"""Where a ``script:`` job's code is for every attempt: its folder copied at submit, or the live file.

Like an entry point's package (``code_snapshot.py``), a script's code is copied
into ``RUN_DIR/code/`` at submit time, so a requeue days later runs what was
submitted: the script's folder (Python's first import directory for it), by
the rules an entry point's snapshot follows (``launch/code_selection.py``: in
a git work tree only what git lists; never a hidden file, a symlink out of the
folder, bytecode, a FIFO; what was left out is said), and never the run's
output directory. Every attempt runs the copy: ``python RUN_DIR/code/train.py``,
its working directory the run directory; ``{script_dir}`` names the copy of the
script's folder. A ``module:`` is copied like an entry point's package (its
import closure) and run with the copy first on ``PYTHONPATH``; one installed
into the environment (or hpctrain's own) is not copied. ``run.json`` records the copy under
``code_snapshot`` with ``script_dir``, which ``resume`` reads back.

Also here: the partition's preemption GraceTime, read once at submit, which
tells the task wrappers how long a preempted script may take to stop. Torch-free.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hpctrain.contract.rundir import CODE_DIR, run_home
from hpctrain.contract.runfiles import real_path
from hpctrain.contract.script_env import ScriptCode
from hpctrain.errors import ClusterError, SpecError, SpecProblem, UsageError, printable
from hpctrain.jobspec.load import LoadedJob
from hpctrain.jobspec.models import JobSpec, Script
from hpctrain.jobspec.problems import position_of
from hpctrain.jobspec.script_checks import module_file, program_problems
from hpctrain.jobspec.yaml_source import read_spec_file
from hpctrain.launch import code_snapshot
from hpctrain.launch.code_selection import Selection, root_refusal, select_folder

SCRIPT_DIR_KEY = "script_dir"  # run.json code_snapshot: the copy of the script's folder, relative to the run


def require_program(job: LoadedJob) -> None:
    """A ``SpecError`` naming ``script.path``/``script.module`` when the script is not there to be submitted
    (``validate``, ``submit``, ``--dry-run``; a resume runs the run's copy instead)."""
    problems = program_problems(job.spec) if job.spec.script is not None else []
    if problems:
        try:
            positions = read_spec_file(job.source)[1]
        except SpecError:  # the spec file went away: the problems still stand, without their lines
            positions = {}
        problems = [SpecProblem(p.key, p.message, *position_of(p.key, positions)) for p in problems]
        raise SpecError(str(job.source), problems, hint="fix the path, or run hpctrain where it is relative to")


def locate(script: Script) -> code_snapshot.CodeSource | None:
    """What to copy for ``script``; None when nothing is (a module of the environment, or not found).

    A script whose folder (symlinks resolved) is a home directory, a file system's root, a shared folder
    such as ``/tmp`` or lies in a hidden folder (``~/.ssh``) is refused: its "folder" would be everything
    the user has, everybody's files, or secrets (``code_selection.root_refusal``).
    """
    if script.module is not None:
        return code_snapshot.locate(f"{script.module}:main")
    assert script.path is not None
    folder = real_path(script.path).parent
    if code_snapshot.in_environment(folder):
        return None
    why = root_refusal(folder)
    if why is not None:
        raise UsageError(
            f"{printable(script.path)} lies directly in {printable(folder)}, and hpctrain copies a script's "
            f"folder into the run (so a requeue runs what you submitted): {why}, so it would copy all of it",
            hint="move the script into a folder of its own, or submit with --no-snapshot",
        )
    name = Path(script.path).name
    return code_snapshot.CodeSource(
        package=name, import_dir=folder, files_root=folder, git_root=code_snapshot.git_toplevel(folder)
    )


def plan(source: code_snapshot.CodeSource, spec: JobSpec) -> Selection:
    """What :func:`take` copies: a script's folder, or a module's package and what it imports from beside
    it (``launch/code_selection.py``'s rules either way), never the run's output directory."""
    assert spec.script is not None
    if spec.script.module is not None:
        return code_snapshot.plan(source)
    listed = code_snapshot.git_lister(source) if source.git_root is not None else None
    chosen = select_folder(source.import_dir, listed, skip=[Path(spec.output_dir)])
    code_snapshot.check_size(chosen, source)  # the dry run decides as the submit does
    return chosen


def take(source: code_snapshot.CodeSource, spec: JobSpec, run_dir: Path) -> code_snapshot.Snapshot:
    """Copy ``source`` into ``run_dir/code``; ``run.json``'s record of it names the script's folder's copy."""
    assert spec.script is not None
    chosen = plan(source, spec)
    snapshot = code_snapshot.take(source, run_dir, chosen)
    return replace(snapshot, script_dir=str(_copy_of_folder(spec.script, source)))


def _copy_of_folder(script: Script, source: code_snapshot.CodeSource) -> Path:
    """Where the copy of the script's folder lies, relative to the run directory."""
    if script.path is not None:
        return Path(CODE_DIR)  # the folder is the copy's root
    assert script.module is not None
    found = module_file(script.module, [str(source.import_dir)])
    folder = real_path(found).parent if found is not None else source.import_dir
    return Path(CODE_DIR) / folder.relative_to(real_path(source.import_dir))


def script_code(spec: JobSpec, run_dir: Path, record: object = None) -> ScriptCode:
    """The code every attempt runs: the copy ``record`` (run.json's ``code_snapshot``) describes, or the
    live file when there is none (``--no-snapshot``, or nothing to copy)."""
    script = spec.script
    assert script is not None
    copied = _copied_dir(run_dir, record)
    if copied is not None:
        if script.path is not None:
            return ScriptCode(str(copied / Path(script.path).name), None, str(copied))
        root = code_snapshot.import_root(run_dir, record)
        return ScriptCode(None, script.module, str(copied), str(root) if root is not None else None)
    if script.path is not None:
        path = Path(script.path)
        return ScriptCode(str(path), None, str(path.parent))
    found = module_file(str(script.module))
    return ScriptCode(None, script.module, str(found.parent if found is not None else Path.cwd()))


def _copied_dir(run_dir: Path, record: object) -> Path | None:
    """The copy of the script's folder, if the record names one inside the run (a crafted run.json is not followed)."""
    if not isinstance(record, dict) or not isinstance(record.get(SCRIPT_DIR_KEY), str):
        return None
    home = run_home(real_path(run_dir))
    folder = real_path(real_path(run_dir) / record[SCRIPT_DIR_KEY])
    return folder if home in folder.parents else None


def preempt_grace_s(spec: JobSpec) -> float | None:
    """The GraceTime of the partition the job runs in (seconds), from one ``scontrol show partition``;
    None when Slurm does not say."""
    from hpctrain.contract.slurm import Slurm
    from hpctrain.jobspec.slurm_time import parse_time_limit

    try:
        found = Slurm().partitions()
    except ClusterError:
        return None
    name = spec.resources.partition or next((n for n, p in found.items() if p.get("Default") == "YES"), None)
    value = found.get(name or "", {}).get("GraceTime", "")
    if value.isdigit():
        return float(value)  # scontrol prints it in seconds
    try:
        return float(parse_time_limit(value)) if value else None
    except ValueError:
        return None


def planned(spec: JobSpec, run_dir: Path, *, snapshot: bool) -> tuple[ScriptCode, list[str]]:
    """What a submit would run, and the dry run's lines about the copy: nothing is copied or written."""
    script = spec.script
    assert script is not None
    source = locate(script) if snapshot else None
    if source is None:
        code = script_code(spec, run_dir)
        why = "--no-snapshot" if not snapshot else "not copied (part of the Python environment)"
        return code, [f"# code: {why}: every attempt runs the live {code.file or script.module}"]
    chosen = plan(source, spec)
    record = {SCRIPT_DIR_KEY: str(_copy_of_folder(script, source)), "import_root": CODE_DIR}
    code = _from_record(spec, run_dir, record)
    commit, dirty = code_snapshot.git_state(source.git_root, chosen) if source.git_root else (None, None)
    where = f" (git {commit[:12]}{', with uncommitted changes' if dirty else ''})" if commit else ""
    lines = [
        f"# code: {chosen.root}{where}: {len(chosen.files)} files are copied into RUN_DIR/code/; "
        "every attempt runs the copy"
    ]
    notes = chosen.notes()
    return code, lines + ([f"# code: left out: {'; '.join(notes)}"] if notes else [])


def _from_record(spec: JobSpec, run_dir: Path, record: dict[str, str]) -> ScriptCode:
    """:func:`script_code` for a copy that does not exist yet (the dry run's)."""
    script = spec.script
    assert script is not None
    copied = Path(run_dir) / record[SCRIPT_DIR_KEY]
    if script.path is not None:
        return ScriptCode(str(copied / Path(script.path).name), None, str(copied))
    return ScriptCode(None, script.module, str(copied), str(Path(run_dir) / record["import_root"]))

"""The Python API: the login-node verbs as functions (``import hpctrain``), the second face of one library.

Each function checks its arguments, calls the same library sequence as its
``hpctrain`` verb and returns that sequence's typed result: ``submit`` ->
``launch/submit.py``, ``resume`` -> ``launch/resume.py``, ``cancel`` ->
``launch/cancel.py``, ``status`` -> ``observe/status.py``, ``report`` ->
``observe/report/build.py``, ``doctor`` -> ``diagnose/doctor.py``'s ``doctor_spec``, ``nodes``
and ``forget_node`` -> ``observe/node_ledger.py``,
``load_job`` -> ``launch/plan.py``'s validate, ``sync`` -> ``tracking/sync.py``. So both faces give the same
and ``forget_node`` -> ``observe/node_ledger.py``, ``plan`` -> ``planning/plan.py``,
``load_job`` -> ``launch/plan.py``'s validate. So both faces give the same
answers: the same script, checks, status rule, cancel and resume policy.
With ``cluster=`` naming a profile with ``login:``, ``submit``, ``status``,
``cancel`` and ``resume`` go through that login node instead, by the CLI's
``--cluster`` door (``remote/calls.py``): the same exactly-once, the same
``RemoteError`` when no connection is open, the same result types.
Nothing here exits or imports torch, and nothing prints but a local run
stopped by Ctrl-C or a signal while waiting (on stderr); every refusal, a
wrong argument type included, is an ``HpctrainError`` (``hpctrain.errors``)
with a ``hint``. ``hpctrain/__init__.py`` exposes these names lazily, so
``import hpctrain`` stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hpctrain.errors import UsageError

if TYPE_CHECKING:
    from hpctrain.diagnose.doctor import DoctorReport
    from hpctrain.jobspec.load import LoadedJob
    from hpctrain.launch.cancel import Cancelled
    from hpctrain.launch.submit import Steps, Submission
    from hpctrain.observe.node_ledger import NodeLedger
    from hpctrain.observe.report.build import Report
    from hpctrain.observe.run_status import RunStatus
    from hpctrain.observe.status import StudyStatus
    from hpctrain.planning.plan import Plan
    from hpctrain.tracking.sync import Synced

MAX_TIMEOUT_S = 86400.0  # as 'hpctrain cancel --timeout'


def load_job(path: str | Path, overrides: Sequence[str] = (), *, cluster: str | None = None) -> LoadedJob:
    """Read and validate a job spec, as ``hpctrain validate PATH --set KEY=VALUE``; ``overrides``:
    ``"key=value"`` strings (the value is read as YAML). Raises ``SpecError`` listing every problem."""
    from hpctrain.launch.plan import validate

    return validate(_path("path", path), _overrides(overrides), cluster=_optional_text("cluster", cluster)).job


def submit(
    job: LoadedJob | str | Path,
    *,
    dry_run: bool = False,
    local: bool = False,
    wait: bool = False,
    preflight: bool = True,
    snapshot: bool = True,
    exclude_bad_nodes: bool = True,
    log: TextIO | None = None,
    after: str | None = None,
    cluster: str | None = None,
) -> Submission:
    """Submit a job (a ``load_job`` result, or a spec path) to Slurm, or with ``local=True`` run it here.

    ``dry_run``: touch nothing, return the sbatch ``script`` and the ``plan``. ``wait``: return once
    the job ended (a local run: its processes; Slurm: the job) with ``state`` set. Without ``wait`` a
    local run goes on in the background while this Python process lives. ``preflight=False`` skips
    the checks before the queue (``--no-preflight``), ``snapshot=False`` the code copy
    (``--no-snapshot``), ``exclude_bad_nodes=False`` the bad-node ledger's ``--exclude``
    (``--no-exclude``); ``log``: a stream that gets rank 0's log of a local run while waiting.
    A ``load_job`` result changed since is checked again (``SpecError``). ``after``: start once that run
    (a run directory or job id) has completed (``--after``; docs/chains.md). ``cluster``: that cluster
    profile instead of the spec's; a profile with ``login:`` submits on its login node from here, as
    ``hpctrain submit SPEC --cluster NAME`` does (the current folder shipped, exactly once;
    docs/remote.md): ``job`` is then a spec path, and ``dry_run``, ``local`` and ``log`` are refused.
    """
    from hpctrain.jobspec.load import LoadedJob
    from hpctrain.launch.submit import submit as sequence

    if not isinstance(job, LoadedJob):
        job = _path("job", job)
    flags = _flags(
        dry_run=dry_run,
        local=local,
        wait=wait,
        preflight=preflight,
        snapshot=snapshot,
        exclude_bad_nodes=exclude_bad_nodes,
    )
    if (remote := _remote(cluster, selector=False)) is not None:
        return _submit_there(remote, job, flags, log, _optional_text("after", after))
    if cluster is not None and not isinstance(job, LoadedJob):
        job = load_job(job, cluster=cluster)
    return sequence(job, **flags, steps=_steps(log), after=after)


def status(run: str | Path, *, cluster: str | None = None) -> RunStatus | StudyStatus:
    """A run's status (a run directory or a Slurm job id): ``RunStatus``, the facts
    ``hpctrain status RUN --json`` prints (and each rank's heartbeat, ``ranks``); a study directory:
    ``StudyStatus``, one row per point. ``cluster``: a profile with ``login:``, asked through its login
    node (``run`` is a path there; ``ranks`` stay there; a study is refused: give a point)."""
    from hpctrain.observe.status import status as sequence

    if (remote := _remote(cluster)) is not None:
        from hpctrain.remote import calls

        return calls.status(remote, _run("run", run))
    return sequence(_run("run", run))


def cancel(
    run: str | Path, *, timeout_s: float = 60.0, cluster: str | None = None
) -> Cancelled | tuple[Cancelled, ...]:
    """Cancel a run (run directory or job id) and wait until no process of it is left: ``Cancelled``
    (the job's end, the run's status, the last checkpoint's step). A study: one per submitted point.

    A run that has already ended is not cancelled: nothing is written or signalled, and the result
    says so (``already_ended``), as ``hpctrain cancel`` does. A run whose process nothing proves to be
    the run's is refused (``RunDirError``); a study point's error is raised after the other points
    were cancelled. ``cluster``: a profile with ``login:``, cancelled through its login node.
    """
    from hpctrain.launch.cancel import Cancelled
    from hpctrain.launch.cancel import cancel as sequence

    if (remote := _remote(cluster)) is not None:
        from hpctrain.remote import calls

        return calls.cancel(remote, _run("run", run), _seconds("timeout_s", timeout_s))

    done = sequence(_run("run", run), _seconds("timeout_s", timeout_s))
    if isinstance(done, Cancelled):
        return done
    error = done.error()
    if error is not None:
        raise error
    return tuple(point.result for point in done.points if point.result is not None)


def resume(
    run: str | Path,
    overrides: Sequence[str] = (),
    *,
    local: bool = False,
    wait: bool = False,
    log: TextIO | None = None,
    cluster: str | None = None,
) -> Submission:
    """Continue a stopped, cancelled or failed run as a new job in the same run directory, from its
    latest checkpoint; ``overrides``: ``resources.*`` only (another shape that keeps the global batch).

    Refused (``UsageError``) for a study, a sweep, or while the previous attempt may still be writing.
    ``cluster``: a profile with ``login:``, resumed through its login node exactly once (a retry after a
    dropped connection answers from the first attempt; docs/remote.md); ``local`` and ``log`` refused.
    """
    from hpctrain.launch.resume import resume as sequence

    flags = _flags(local=local, wait=wait)
    if (remote := _remote(cluster)) is not None:
        from hpctrain.remote import calls

        _local_only(remote, local=local, log=log)
        sets = [word for text in _overrides(overrides) for word in ("--set", text)]
        return calls.resume(remote, _run("run", run), [*sets, *(["--wait"] if wait else [])])
    return sequence(_run("run", run), _overrides(overrides), **flags, steps=_steps(log))


def report(
    runs: str | Path | Sequence[str | Path], *, out: str | Path | None = None, baseline: str | None = None
) -> Report:
    """Plots and tables from runs and studies, as ``hpctrain report``: ``report.html`` (self-contained)
    and ``report.md`` in ``out`` (default: RUN/report for one run; required for several).

    Never overwrites a file it did not write (``UsageError``).
    """
    from hpctrain.observe.report.build import report as sequence

    targets = [runs] if isinstance(runs, (str, Path)) else runs
    if isinstance(targets, (bytes, bytearray)) or not isinstance(targets, Sequence) or not targets:
        raise UsageError(f"runs={runs!r}: give a run or study directory, or a list of them")
    listed = [_path("runs", target) for target in targets]
    return sequence(listed, None if out is None else _path("out", out), _optional_text("baseline", baseline))


def doctor(
    spec: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    cluster: str | None = None,
    probe: bool = False,
    probe_timeout_s: float = 300.0,
) -> DoctorReport:
    """Will this cluster run this job? Every check of ``hpctrain doctor [SPEC] [--set ...] [--cluster C]
    [--probe]``, each ok / warning / error with its fix (``DoctorReport``: ``checks``, ``ok``, ``as_json()``).
    The spec is loaded by the same door as the verb's (``diagnose/doctor.py``'s ``doctor_spec``): a spec
    wrong in itself is a ``SpecError``; a missing script file or an entry point that cannot take ``ctx``
    is an error check of the report."""
    from hpctrain.diagnose.doctor import doctor_spec

    return doctor_spec(
        None if spec is None else _path("spec", spec),
        _overrides(overrides),
        cluster=_optional_text("cluster", cluster),
        **_flags(probe=probe),
        probe_timeout_s=_seconds("probe_timeout_s", probe_timeout_s),
    )


def sync(run: str | Path, *, follow: bool = False, interval_s: float = 30.0, ended: bool = False) -> tuple[Synced, ...]:
    """Send what is new in a run (a study's points, a sweep's trials) to each tracker its spec names, as
    ``hpctrain sync RUN [--follow] [--ended]``: one ``Synced`` per run and tracker (its ``error``, if the
    tracker could not be reached: running it again sends the rest, nothing twice). docs/tracking.md."""
    from hpctrain.tracking.sync import resolve_target
    from hpctrain.tracking.sync import sync as sequence

    flags = _flags(follow=follow, ended=ended)
    target = resolve_target(_run("run", run))
    return tuple(sequence(target, interval_s=_seconds("interval_s", interval_s), **flags))


def plan(
    spec: str | Path,
    *,
    nodes: Sequence[int] | str | None = None,
    overrides: Sequence[str] = (),
    cluster: str | None = None,
    steps: int | None = None,
    samples_per_epoch: int | None = None,
    step_time_s: float | None = None,
    step_time_nodes: int | None = None,
    margin: float = 0.10,
    restart_s: float | None = None,
    measure_steps: int | None = None,
) -> Plan:
    """When ``spec`` would start and finish at each node count, and which to ask for, as ``hpctrain plan``:
    ``Plan`` (``shapes``: each one's steps, step time and its source, start, chunks, finish, node- and
    GPU-hours; ``choice``: the recommended node count and the reason; ``as_json()``: what ``--json`` prints).
    ``nodes``: ``[1, 2, 4, 8]`` or ``"1,2,4,8"``; ``step_time_s``/``steps``/``samples_per_epoch``: what no
    earlier run of the spec says. ``measure_steps``: first run the spec at one node for that many steps and
    wait for it (``hpctrain plan --measure``). A start Slurm did not give is None, never guessed.
    ``restart_s``: each chunk's start-up; None: the median start cost the spec's earlier runs recorded, else 120 s."""
    from hpctrain.planning.plan import parse_shapes
    from hpctrain.planning.plan import plan as sequence

    if nodes is not None and not isinstance(nodes, str):
        if isinstance(nodes, (bytes, bytearray)) or not isinstance(nodes, Sequence):
            raise UsageError(f"nodes={nodes!r}: give a list of node counts", hint="nodes=[1, 2, 4, 8]")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes):
            raise UsageError(f"nodes={nodes!r}: node counts are whole numbers", hint="nodes=[1, 2, 4, 8]")
        nodes = ",".join(str(n) for n in nodes)
    for name, value in (
        ("steps", steps),
        ("samples_per_epoch", samples_per_epoch),
        ("step_time_nodes", step_time_nodes),
        ("measure_steps", measure_steps),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"{name}={value!r}: expected a whole number of at least 1, or None")
    for name, number in (("step_time_s", step_time_s), ("margin", margin), ("restart_s", restart_s)):
        if number is None and name != "margin":
            continue
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number) or number < 0:
            raise UsageError(f"{name}={number!r}: expected a finite number of at least 0")
    if step_time_s is not None and step_time_s <= 0:
        raise UsageError(f"step_time_s={step_time_s!r}: a step takes more than 0 seconds")
    return sequence(
        _path("spec", spec),
        nodes=parse_shapes(nodes) if nodes is not None else None,
        overrides=_overrides(overrides),
        cluster=_optional_text("cluster", cluster),
        steps=steps,
        samples_per_epoch=samples_per_epoch,
        step_time_s=None if step_time_s is None else float(step_time_s),
        step_time_nodes=step_time_nodes,
        margin=float(margin),
        restart_s=None if restart_s is None else float(restart_s),
        measure_steps=measure_steps,
        submit=_submit_sequence() if measure_steps is not None else None,
    )


def _submit_sequence() -> Any:
    """The one submit sequence, which ``plan``'s measurement runs through (planning stands beneath launch)."""
    from hpctrain.launch.submit import submit as sequence

    return sequence


def nodes(*, cluster: str | None = None, include_expired: bool = False) -> NodeLedger:
    """The nodes your runs found sick or lost (the bad-node ledger), as ``hpctrain nodes [--cluster C] [--all]``:
    ``NodeLedger`` (``path``, ``rows``, ``warnings``, ``as_json()``: what ``--json`` prints). ``submit``
    excludes the live ones (``exclude_bad_nodes=False``: not)."""
    from hpctrain.observe.node_ledger import nodes as sequence

    return sequence(cluster=_optional_text("cluster", cluster), **_flags(include_expired=include_expired))


def forget_node(node: str, *, cluster: str | None = None) -> int:
    """Remove ``node`` from the bad-node ledger (on ``cluster`` only, when given), as ``hpctrain nodes
    --forget NODE``; how many entries were removed."""
    from hpctrain.observe.node_ledger import forget_node as sequence

    if not isinstance(node, str) or not node.strip():
        raise UsageError(f"node={node!r}: expected a node name", hint="forget_node('n3')")
    return sequence(node, cluster=_optional_text("cluster", cluster))


# ------------------------------------------------------------------ a cluster reached through its login node


def _remote(cluster: Any, *, selector: bool = True) -> str | None:
    """The cluster this call goes to through its login node (docs/remote.md), or None: it runs here.
    ``selector``: ``cluster`` only says where (status, cancel, resume), so a profile without ``login:``
    is refused; for submit it may also be just the profile to use here. On the login node itself
    (the remote side of a forwarded command) every call runs here."""
    import os

    from hpctrain.remote import verbs

    name = _optional_text("cluster", cluster)
    if name is None or os.environ.get(verbs.REMOTE_SIDE):
        return None
    if selector:
        if verbs.login_of(name) is None:
            raise UsageError(
                f"cluster profile {name!r} names no login host, so cluster= has nowhere to go",
                hint=f"add login: {{host: ...}} to {name}'s profile (docs/remote.md), or call without cluster=",
            )
        return name
    from hpctrain.jobspec.profiles import load_profile

    try:
        return name if load_profile(name).login is not None else None
    except KeyError:
        return None  # load_job says which profiles there are


def _local_only(cluster: str, **given: Any) -> None:
    for name, value in given.items():
        if value not in (None, False):
            raise UsageError(
                f"{name}={value!r} with cluster={cluster!r}: a call through the login node cannot do that",
                hint=f"call it without {name}=, or run it on the login node itself",
            )


def _submit_there(cluster: str, job: Any, flags: dict[str, bool], log: Any, after: str | None) -> Submission:
    from hpctrain.jobspec.load import LoadedJob
    from hpctrain.remote import calls

    if isinstance(job, LoadedJob):
        raise UsageError(
            f"cluster={cluster!r}: a remote submit ships a spec file, not a load_job result",
            hint="hpctrain.submit('jobs/x.yaml', cluster=...) from your project folder",
        )
    _local_only(cluster, dry_run=flags["dry_run"], local=flags["local"], log=log)
    words = ["--cluster", cluster]
    words += ["--wait"] if flags["wait"] else []
    words += [] if flags["preflight"] else ["--no-preflight"]
    words += [] if flags["snapshot"] else ["--no-snapshot"]
    words += [] if flags["exclude_bad_nodes"] else ["--no-exclude"]
    words += ["--after", after] if after else []
    return calls.submit(cluster, job, words)


# ------------------------------------------------------------------ arguments: refused with the name and the fix


def _path(name: str, value: Any) -> str | Path:
    if isinstance(value, (str, Path)) and str(value).strip() and "\0" not in str(value):
        return value
    raise UsageError(f"{name}={value!r}: expected a path (str or pathlib.Path)", hint=f"{name}='jobs/x.yaml'")


def _run(name: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)  # a Slurm job id
    return str(_path(name, value))


def _optional_text(name: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise UsageError(f"{name}={value!r}: expected a string or None")


def _overrides(value: Any) -> list[str]:
    """``overrides`` as a list of strings; a bare string (which would be read letter by letter) is refused."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"overrides={value!r}: give a list of 'key=value' strings", hint="['trainer.epochs=5']")
    return list(value)


def _flags(**flags: Any) -> dict[str, bool]:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise UsageError(f"{name}={value!r}: expected True or False")
    return flags


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_TIMEOUT_S:
        raise UsageError(f"{name}={value!r}: expected a number of seconds from 0 to {MAX_TIMEOUT_S:.0f}")
    if not math.isfinite(value):
        raise UsageError(f"{name}={value!r}: expected a finite number of seconds")
    return float(value)


def _steps(log: Any) -> Steps:
    """The sequence's steps, heard and ignored; a followed local run's log goes to ``log``."""
    from hpctrain.launch.submit import Steps

    if log is not None and not callable(getattr(log, "write", None)):
        raise UsageError(f"log={log!r}: expected a text stream (with .write), or None")
    steps = Steps()
    steps.log = log
    return steps

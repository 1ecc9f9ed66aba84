"""The Python API's remote door: ``hpctrain.submit(..., cluster="hal")`` and its kin. Torch-free.

The same door as the CLI's ``--cluster`` (``verbs.py``): the cluster's one
master connection in BatchMode, the login node's hpctrain checked, submit
and resume exactly once per token. Two differences only, both of a face:
nothing is printed (the login node's ``--json`` answer is read back into
the same typed results the local API returns: ``Submission``,
``RunStatus``, ``Cancelled``), and no connection is ever opened from here
(no terminal prompt from a library call): with no live master the error is
the CLI's, ``RemoteError(kind="no_master")`` naming ``hpctrain login NAME``.
A refusal there (a run still running, a wrong spec) is raised here as the
same error type, its message and hint the login node's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.errors import ClusterError, HpctrainError, RemoteError, UsageError
from hpctrain.remote import verbs
from hpctrain.remote.ssh import Connection, no_master

if TYPE_CHECKING:
    from hpctrain.launch.cancel import Cancelled
    from hpctrain.launch.submit import Submission
    from hpctrain.observe.run_status import RunStatus

# The login node's exit status -> the error type its CLI turned into it (hpctrain/errors.py).
RAISED: dict[int, type[HpctrainError]] = {2: UsageError, 3: ClusterError, 6: RemoteError}


def submit(cluster: str, spec: str | Path, flags: Sequence[str] = ()) -> Submission:
    """``hpctrain submit SPEC --json FLAGS`` on ``cluster``'s login node, the project (the current
    folder) shipped first; exactly once per (cluster, flags, spec bytes) as the CLI's."""
    connection = _connected(cluster)
    words = ["submit", str(spec), "--json", *flags]
    done = verbs.submit(connection, argparse.Namespace(spec=str(spec)), words, capture=True)
    return _waited(cluster, _submission(cluster, _answer(cluster, done, waited="--wait" in flags)), flags)


def resume(cluster: str, run: str, flags: Sequence[str] = ()) -> Submission:
    """``hpctrain resume RUN --json FLAGS`` there, exactly once per (cluster, run, flags)."""
    connection = _connected(cluster)
    done = verbs.resume(connection, ["resume", run, "--json", *flags], capture=True)
    return _waited(cluster, _submission(cluster, _answer(cluster, done, waited="--wait" in flags)), flags)


def _waited(cluster: str, submitted: Submission, flags: Sequence[str]) -> Submission:
    """With ``--wait`` the login node answered once the job ended: its end, as the local API gives it."""
    if "--wait" not in flags or submitted.points:
        return submitted
    from dataclasses import replace

    ended = status(cluster, str(submitted.run_dir))
    state = ended.status if submitted.backend == "local" else ended.slurm_state
    return replace(submitted, state=state, run_completed=ended.status == "completed")


def status(cluster: str, run: str) -> RunStatus:
    """``hpctrain status RUN --json`` there, as a ``RunStatus`` (its ``ranks`` stay on the login node)."""
    from hpctrain.observe.run_status import RunStatus

    found = _answer(cluster, _ask(cluster, ["status", run, "--json"]))
    if not isinstance(found, dict) or "points" in found:
        raise UsageError(
            f"{cluster}: {run} is a study; a remote status is of one run",
            hint="give one point's run directory (hpctrain status STUDY --cluster NAME lists them)",
        )
    return _typed(RunStatus, found)


def cancel(cluster: str, run: str, timeout_s: float) -> Cancelled | tuple[Cancelled, ...]:
    """``hpctrain cancel RUN --json`` there: a ``Cancelled`` (a study: one per submitted point; a point's
    error raised after the others were cancelled, as the local API does)."""
    found = _answer(cluster, _ask(cluster, ["cancel", run, "--json", "--timeout", str(timeout_s)]))
    if isinstance(found, dict) and "points" in found:  # a study whose every point was cancelled
        return tuple(_cancelled(p["result"]) for p in found["points"] if isinstance(p.get("result"), dict))
    return _cancelled(found)


def _connected(cluster: str) -> Connection:
    """The cluster's live master (never one opened here), its hpctrain checked."""
    if not isinstance(cluster, str) or not cluster.strip():
        raise UsageError(f"cluster={cluster!r}: expected a cluster profile's name", hint="cluster='hal'")
    if verbs.login_of(cluster) is None:
        raise UsageError(
            f"cluster profile {cluster!r} names no login host, so cluster= has nowhere to go",
            hint=f"add login: {{host: ...}} to {cluster}'s profile (docs/remote.md), or call without cluster=",
        )
    connection = verbs.connect(cluster)
    if not connection.alive():
        raise no_master(cluster)
    verbs.check_hpctrain(connection)
    return connection


def _ask(cluster: str, words: list[str]) -> verbs.Answer:
    connection = _connected(cluster)
    return connection.run([*verbs.hpctrain_words(connection), *words], capture=True)


def _answer(cluster: str, done: verbs.Answer, *, waited: bool = False) -> Any:
    """The login node's JSON answer; its refusal raised as the error type it was there. ``waited``: a
    submit that waited exits non-zero when its job failed, yet answered (the local API returns it too)."""
    if done.returncode != 0 and not (waited and done.stdout.strip().startswith(b"{")):
        _raise(cluster, done)
    try:
        return json.loads(done.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(
            f"{cluster}: the login node's answer was not JSON: {done.stdout[-300:].decode(errors='replace')!r}",
            "answer",
            hint="is login.hpctrain the hpctrain command (not a wrapper that prints)?",
        ) from None


def _raise(cluster: str, done: verbs.Answer) -> None:
    said = done.stderr.decode(errors="replace").splitlines()
    message = next((line[7:] for line in reversed(said) if line.startswith("error: ")), None)
    hint = next((line[6:] for line in reversed(said) if line.startswith("hint: ")), None)
    if message is None:
        message = f"the login node's hpctrain exited {done.returncode}" + (f": {said[-1]}" if said else "")
    kind = RAISED.get(done.returncode, HpctrainError)
    error: HpctrainError = (
        RemoteError(f"{cluster}: {message}", "refused", hint)
        if kind is RemoteError
        else kind(f"{cluster}: {message}", hint)
    )
    if kind is HpctrainError:
        error.exit_code = done.returncode
    raise error


def _submission(cluster: str, found: Any) -> Submission:
    from hpctrain.launch.submit import Submission

    if not isinstance(found, dict) or "run_dir" not in found and "study_dir" not in found:
        raise RemoteError(f"{cluster}: the login node's answer names no run: {found!r}", "answer")
    if "study_dir" in found:
        points = tuple(
            Submission(
                Path(p["run_dir"]), p.get("job_id"), "slurm", label=p.get("label"), world_size=p.get("world_size")
            )
            for p in found.get("runs", [])
        )
        return Submission(Path(found["study_dir"]), None, "slurm", points=points, cluster=cluster)
    backend = "local" if found.get("backend") == "local" else "slurm"
    return Submission(Path(found["run_dir"]), found.get("job_id"), backend, cluster=found.get("cluster") or cluster)


def _cancelled(found: Any) -> Cancelled:
    from hpctrain.launch.cancel import Cancelled

    if not isinstance(found, dict):
        raise RemoteError(f"the login node's cancel answer is not a run's: {found!r}", "answer")
    found = {**found, "run_dir": Path(found["run_dir"]), "dependents": tuple(map(Path, found.get("dependents", [])))}
    return _typed(Cancelled, found)


def _typed(kind: Any, found: dict[str, Any]) -> Any:
    """``kind(**found)`` with the fields ``kind`` has (a key only the login node's release knows is dropped)."""
    names = {f.name for f in fields(kind)}
    try:
        return kind(**{key: value for key, value in found.items() if key in names})
    except TypeError as exc:
        raise RemoteError(f"the login node's answer does not fit {kind.__name__}: {exc}", "answer") from None

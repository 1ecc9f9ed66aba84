"""launch/chain.py: linking a spec to its upstream, re-pointing dependents on resume, cancelling a chain."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from hpctrain.contract.chain_links import dependents_of, read_chain_end, record_dependent, upstream_link
from hpctrain.contract.summary import write_summary
from hpctrain.errors import RunDirError, UsageError
from hpctrain.jobspec.load import load_job
from hpctrain.launch import chain

pytestmark = pytest.mark.usefixtures("isolated")


class StubSlurm:
    """Slurm's answers by job id; what was re-pointed."""

    def __init__(self, states: dict[str, str]) -> None:
        self.states = states
        self.pointed: list[tuple[str, str]] = []

    def job_state(self, job_id: str) -> str:
        return self.states[job_id]

    def set_dependency(self, job_id: str, dependency: str) -> None:
        self.pointed.append((job_id, dependency))


def make_run(folder: Path, job_id: str, status: str | None = None, **info: object) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"job_id": job_id, "backend": "slurm", **info}))
    if status is not None:
        write_summary(folder, {"status": status})
    return folder


def job_after(tmp_path: Path, run: str | Path, when: str = "completed", extra: str = ""):  # noqa: ANN201
    path = tmp_path / "dep.yaml"
    path.write_text(textwrap.dedent(f"name: dep\ndata: {{root: /d}}\nafter: {{run: '{run}', when: {when}}}\n{extra}"))
    return load_job(path)


def test_a_running_upstream_gives_afterany_on_its_current_job(tmp_path: Path) -> None:
    upstream = make_run(tmp_path / "up", "41", "running")
    job = chain.linked(job_after(tmp_path, upstream), slurm=StubSlurm({"41": "RUNNING"}))  # type: ignore[arg-type]
    assert job.spec.resources.slurm_extra["dependency"] == "afterany:41"
    assert job.spec.after is not None and job.spec.after.run == str(upstream.resolve())
    assert job.trials[0].resources.slurm_extra["dependency"] == "afterany:41"


def test_a_completed_upstream_starts_now_without_a_dependency(tmp_path: Path) -> None:
    upstream = make_run(tmp_path / "up", "41", "completed")
    job = chain.linked(job_after(tmp_path, upstream), slurm=StubSlurm({"41": "COMPLETED"}))  # type: ignore[arg-type]
    assert "dependency" not in job.spec.resources.slurm_extra


@pytest.mark.parametrize(
    ("status", "state", "said", "hint"),
    [
        ("failed", "FAILED", "failed", "choose another run"),
        ("stopped", "TIMEOUT", "stopped before it completed", "resume it first"),
    ],
)
def test_a_condition_that_cannot_hold_now_is_refused(
    tmp_path: Path, status: str, state: str, said: str, hint: str
) -> None:
    upstream = make_run(tmp_path / "up", "41", status)
    with pytest.raises(UsageError) as info:
        chain.linked(job_after(tmp_path, upstream), slurm=StubSlurm({"41": state}))  # type: ignore[arg-type]
    assert said in info.value.message and "after.run" in info.value.message
    assert hint in (info.value.hint or "")


def test_a_missing_upstream_is_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        chain.linked(job_after(tmp_path, tmp_path / "nowhere"), slurm=StubSlurm({}))  # type: ignore[arg-type]
    assert "after.run" in info.value.message and "nowhere" in info.value.message


def test_a_cycle_in_the_records_is_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make_run(a, "1", "running", after={"run_dir": str(b)})
    make_run(b, "2", "running", after={"run_dir": str(a)})
    with pytest.raises(UsageError) as info:
        chain.linked(job_after(tmp_path, a), slurm=StubSlurm({"1": "RUNNING"}))  # type: ignore[arg-type]
    assert "cycle" in info.value.message


def test_an_upstream_not_writable_by_you_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = make_run(tmp_path / "up", "41", "running")
    monkeypatch.setattr(chain.os, "access", lambda path, mode: False)  # another user's run (as root, chmod is moot)
    with pytest.raises(UsageError) as info:
        chain.linked(job_after(tmp_path, upstream), slurm=StubSlurm({"41": "RUNNING"}))  # type: ignore[arg-type]
    assert "not writable" in info.value.message and "your own runs" in (info.value.hint or "")


def test_a_local_dependent_cannot_wait(tmp_path: Path) -> None:
    upstream = make_run(tmp_path / "up", "41", "running")
    with pytest.raises(UsageError) as info:
        chain.linked(job_after(tmp_path, upstream), local=True, slurm=StubSlurm({"41": "RUNNING"}))  # type: ignore[arg-type]
    assert "local run cannot wait" in info.value.message


def test_record_links_both_runs_and_cancels_when_it_cannot(tmp_path: Path) -> None:
    upstream = make_run(tmp_path / "up", "41", "running")
    job = chain.linked(job_after(tmp_path, upstream), slurm=StubSlurm({"41": "RUNNING"}))  # type: ignore[arg-type]
    dependent = make_run(tmp_path / "dep", "42")
    chain.record(dependent, job, cancel=lambda: pytest.fail("cancelled"))
    assert upstream_link(dependent).upstream == upstream.resolve()  # type: ignore[union-attr]
    assert [link.run_dir for link in dependents_of(upstream)] == [dependent]
    cancelled = []
    with pytest.raises(RunDirError):
        chain.record(tmp_path / "gone", job, cancel=lambda: cancelled.append(True))
    assert cancelled == [True]


def test_repoint_moves_pending_dependents_and_resubmits_those_the_chain_ended(tmp_path: Path) -> None:
    upstream = make_run(tmp_path / "up", "50")
    pending = make_run(tmp_path / "pending", "51")
    ended = make_run(tmp_path / "ended", "52", "stopped")
    finished = make_run(tmp_path / "finished", "53", "completed")
    for one in (pending, ended, finished):
        record_dependent(upstream, one, "completed")
    from hpctrain.contract.chain_links import write_chain_end

    write_chain_end(ended, "after: up stopped", upstream, "wait")
    slurm = StubSlurm({"51": "PENDING", "52": "COMPLETED", "53": "COMPLETED"})
    again: list[Path] = []
    said = chain.repoint(upstream, "60", again.append, slurm=slurm)  # type: ignore[arg-type]
    assert slurm.pointed == [("51", "afterany:60")]
    assert again == [ended]
    assert len(said) == 2 and all("60" in line for line in said)


def test_cancel_dependents_cancels_the_chain_below_and_records_why(tmp_path: Path) -> None:
    first = make_run(tmp_path / "first", "1", "running")
    second = make_run(tmp_path / "second", "2")
    third = make_run(tmp_path / "third", "3")
    done_already = make_run(tmp_path / "done", "4", "completed")
    record_dependent(first, second, "completed")
    record_dependent(second, third, "completed")
    record_dependent(first, done_already, "completed")
    cancelled: list[Path] = []
    assert chain.cancel_dependents(first, cancelled.append) == [third, second]
    assert cancelled == [third, second]
    assert "cancelled with" in read_chain_end(second)["reason"]  # type: ignore[index]
    assert read_chain_end(done_already) is None


def test_after_from_the_command_line_or_python_names_the_upstream(tmp_path: Path) -> None:
    assert chain.after_override("12345") == ['after.run="12345"'] and chain.after_override(None) == []
    job = chain.with_upstream(job_after(tmp_path, "/old", when="failed"), "/new")
    assert job.spec.after is not None and (job.spec.after.run, job.spec.after.when) == ("/new", "failed")
    assert job.trials[0].after == job.spec.after

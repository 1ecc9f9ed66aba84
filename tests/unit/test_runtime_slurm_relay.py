"""The relay that runs scontrol for tasks inside a container: the rendered batch-step loop (real bash,
a stand-in scontrol) answering the runner the requeue logic uses."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.contract import slurm
from hpctrain.jobscript.templates import render_slurm_relay
from hpctrain.runtime.slurm_relay import relay_runner, request_for, slurm_runner

FAKE_SCONTROL = """#!/bin/bash
[ "$1" = --version ] && { echo "slurm 24.11.5"; exit 0; }  # asked once by the batch script, not by the loop
echo "$*" >> "$CALLS"
case "$1 $2" in
  "--oneliner show") echo "JobId=$4 JobName=x JobState=RUNNING Restarts=0" ;;
  "requeue 404") echo "scontrol: error: Invalid job id specified" >&2; exit 1 ;;
  requeue*) ;;
  "update JobId=77") [ "$3" = Requeue=0 ] || exit 3 ;;
  *) exit 3 ;;
esac
"""


def start_relay(tmp_path: Path) -> subprocess.Popen[bytes]:
    """The rendered batch-step loop for job 77, with a stand-in scontrol that records its calls."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    script = tmp_path / "batch.sh"
    script.write_text("#!/bin/bash\n" + "\n".join(render_slurm_relay(str(tmp_path / "relay"))) + "\nwait\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "77",
        "CALLS": str(tmp_path / "calls"),
    }
    return subprocess.Popen(["bash", str(script)], env=env, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    folder = tmp_path / "relay" / "77"
    folder.mkdir(parents=True)
    (folder / "stale.res").write_text("0\n")  # gone once the loop has tidied up and a task may ask
    proc = start_relay(tmp_path)
    try:
        deadline = time.monotonic() + 20
        while (folder / "stale.res").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        yield folder, tmp_path / "calls"
    finally:
        stop(proc)


def test_show_and_requeue_go_through_the_relay(relay: tuple[Path, Path]) -> None:
    folder, calls = relay
    run = relay_runner(folder)
    record = slurm.Slurm(run).show_job("77", timeout_s=20)
    assert record["JobState"] == "RUNNING"
    slurm.Slurm(run).requeue_job("77", timeout_s=20)
    with pytest.raises(slurm.SlurmCommandError) as caught:
        slurm.Slurm(run).requeue_job("404", timeout_s=20)
    assert caught.value.kind == "unknown-job"
    slurm.Slurm(run).disable_requeue("77", timeout_s=20)  # the run ended: Slurm must not start it again
    said = ["--oneliner show job 77", "requeue 77", "requeue 404", "update JobId=77 Requeue=0"]
    assert calls.read_text().splitlines() == said
    deadline = time.monotonic() + 20  # the loop removes its claim (.run) just after publishing the answer
    while list(folder.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in folder.iterdir()) == []  # every answer collected, every claim removed


def test_the_loop_runs_nothing_else(relay: tuple[Path, Path]) -> None:
    folder, calls = relay
    deadline = time.monotonic() + 20
    refused = {"a": "requeue 77; touch /tmp/pwned", "b": "cancel 77", "c": "show $(id)", "d": "norequeue 77 x"}
    for name, line in refused.items():
        (folder / f"{name}.req").write_text(line + "\n")
    while len(list(folder.glob("*.res"))) < len(refused) and time.monotonic() < deadline:
        time.sleep(0.05)
    for name in refused:
        code, _, text = (folder / f"{name}.res").read_text().partition("\n")
        assert code == "2" and "refused" in text
    assert not calls.exists()


def test_a_request_left_by_an_earlier_start_is_dropped_not_run(tmp_path: Path) -> None:
    # "scontrol requeue" ends the batch step that runs it, maybe before the loop
    # tidies up; the job's next start must not requeue itself again (and again).
    folder = tmp_path / "relay" / "77"
    folder.mkdir(parents=True)
    for name in ("old.req", "older.run", "old.res", ".half.tmp"):
        (folder / name).write_text("requeue 77\n")
    proc = start_relay(tmp_path)
    try:
        deadline = time.monotonic() + 20
        while list(folder.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(folder.iterdir()) == []
        assert slurm.Slurm(relay_runner(folder)).show_job("77", timeout_s=20)["JobState"] == "RUNNING"
        assert (tmp_path / "calls").read_text().splitlines() == ["--oneliner show job 77"]
    finally:
        stop(proc)


def test_only_the_requeue_logics_commands_are_relayed(tmp_path: Path) -> None:
    assert request_for(slurm.show_job_command("12_3")) == "show 12_3"
    assert request_for(slurm.requeue_command("12")) == "requeue 12"
    assert request_for(slurm.disable_requeue_command("12_3")) == "norequeue 12_3"
    assert request_for(["scontrol", "update", "JobId=12", "Requeue=1"]) is None
    assert request_for(["scontrol", "update", "12", "Requeue=0"]) is None
    assert request_for(["scancel", "12"]) is None
    with pytest.raises(FileNotFoundError):
        relay_runner(tmp_path)(["sacct", "-j", "1"])


def test_a_relay_that_never_answers_times_out(tmp_path: Path) -> None:
    with pytest.raises(slurm.SlurmCommandError) as caught:
        slurm.Slurm(relay_runner(tmp_path / "silent")).show_job("5", timeout_s=0.3)
    assert caught.value.kind == "timeout"
    assert not list((tmp_path / "silent").glob("*.req")), "an unanswered request is withdrawn"


def test_runner_follows_the_environment(tmp_path: Path) -> None:
    assert slurm_runner({}) is subprocess.run
    assert slurm_runner({"HPCTRAIN_SLURM_RELAY": str(tmp_path)}) is not subprocess.run


def test_inside_an_image_the_slurm_release_is_the_one_recorded_outside(tmp_path: Path) -> None:
    """From Slurm 24.05 on, rank 0 must leave a preempted job's requeue to Slurm (requeue.py). Inside an
    image ``scontrol --version`` cannot run, so the batch script records it outside; without that the
    release was unknown, rank 0 requeued the preempted job itself, and 24.11 requeued its next run again."""
    from hpctrain.runtime.requeue import rank_zero_action

    inside = slurm_runner({"HPCTRAIN_SLURM_RELAY": str(tmp_path), "HPCTRAIN_SLURM_VERSION": "slurm 24.11.5"})
    version = slurm.Slurm(inside).client_version()
    assert version == (24, 11)
    assert rank_zero_action("slurm-requeues", "preempting", False, version) == "exit"
    unknown = slurm_runner({"HPCTRAIN_SLURM_RELAY": str(tmp_path), "HPCTRAIN_SLURM_VERSION": ""})
    assert slurm.Slurm(unknown).client_version() is None
    assert not list(tmp_path.iterdir()), "the version is never asked of the relay loop"
    assert "export HPCTRAIN_SLURM_VERSION=" in "".join(render_slurm_relay(str(tmp_path)))

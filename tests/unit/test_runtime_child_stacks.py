"""Which children the hang watchdog asks for stacks: only data-loader workers that catch the signal."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hpctrain.runtime.child_stacks import (
    STACKS_SIGNAL,
    answering_workers,
    ask_workers_for_stacks,
    catches,
    child_pids,
    silent_workers,
)

QUIT_CAUGHT = 1 << (signal.SIGQUIT - 1)


def status(caught: int) -> str:
    return f"Name:\tpython\nSigBlk:\t0000000000000000\nSigIgn:\t0000000001001000\nSigCgt:\t{caught:016x}\n"


def fake_proc(root: Path, parent: int, children: dict[int, tuple[str, int]]) -> Path:
    """A /proc with ``parent``'s children spread over two threads; children: pid -> (comm, SigCgt mask)."""
    pids = list(children)
    for tid, mine in ((parent, pids[: len(pids) // 2]), (parent + 1, pids[len(pids) // 2 :])):
        task = root / str(parent) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "children").write_text("".join(f"{pid} " for pid in mine))
    for pid, (comm, caught) in children.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "status").write_text(status(caught))
    return root


def test_catches_reads_the_sigcgt_mask() -> None:
    assert catches(status(QUIT_CAUGHT | 1 << (signal.SIGTERM - 1)), signal.SIGQUIT)
    assert not catches(status(1 << (signal.SIGTERM - 1)), signal.SIGQUIT)
    assert not catches("Name:\tpython\n", signal.SIGQUIT)
    assert not catches("SigCgt:\tnot-hex\n", signal.SIGQUIT)


def test_only_workers_that_answer_are_asked(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        100,
        {
            201: ("pt_data_worker", QUIT_CAUGHT),  # a worker that called answer_stack_requests
            202: ("pt_data_worker", 0),  # a worker still starting: SIGQUIT would end it
            203: ("python", QUIT_CAUGHT),  # another child (a tracker): not ours to signal
            204: ("pt_data_worker", QUIT_CAUGHT),
        },
    )
    assert child_pids(100, proc) == [201, 202, 203, 204]
    assert answering_workers(100, proc) == [201, 204]


def test_a_process_without_proc_entries_has_no_workers(tmp_path: Path) -> None:
    assert child_pids(100, tmp_path) == []
    assert ask_workers_for_stacks(100, tmp_path) == []


def test_this_process_without_workers_asks_nobody() -> None:
    assert STACKS_SIGNAL == signal.SIGQUIT
    assert ask_workers_for_stacks(os.getpid()) == []


def test_workers_are_asked_one_at_a_time_each_after_a_header(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Two workers that dump at once interleave their lines in the one log (a hung validation's train and
    val workers did): each is asked after the one before had ``gap_s`` to write, under a line naming it."""
    proc = fake_proc(tmp_path, 100, {201: ("pt_data_worker", QUIT_CAUGHT), 204: ("pt_data_worker", QUIT_CAUGHT)})
    events: list[tuple[str, float | int]] = []
    asked = ask_workers_for_stacks(
        100,
        proc,
        gap_s=0.7,
        sleep=lambda s: events.append(("sleep", s)),
        kill=lambda pid, sig: events.append(("kill", pid)),
    )
    assert asked == [201, 204]
    assert events == [("kill", 201), ("sleep", 0.7), ("kill", 204)]
    err = capfd.readouterr().err.splitlines()
    assert [line.split(":")[1].strip() for line in err] == [
        "data-loader worker 201 of pid 100",
        "data-loader worker 204 of pid 100",
    ]
    assert "not where the rank is now" in err[0]


def test_a_worker_that_ended_meanwhile_is_not_counted(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 100, {201: ("pt_data_worker", QUIT_CAUGHT), 204: ("pt_data_worker", QUIT_CAUGHT)})

    def kill(pid: int, sig: int) -> None:
        if pid == 201:
            raise ProcessLookupError(pid)

    assert ask_workers_for_stacks(100, proc, gap_s=0.0, kill=kill) == [204]


def test_a_worker_that_cannot_answer_is_described_from_proc(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path, 100, {201: ("pt_data_worker", QUIT_CAUGHT), 202: ("pt_data_worker", 0), 203: ("python", 0)}
    )
    (proc / "202" / "status").write_text("Name:\tpt_data_worker\nState:\tS (sleeping)\n" + status(0))
    (proc / "202" / "wchan").write_text("futex_wait_queue")
    assert silent_workers(100, proc) == ["202 (comm pt_data_worker, state S (sleeping), waiting in futex_wait_queue)"]

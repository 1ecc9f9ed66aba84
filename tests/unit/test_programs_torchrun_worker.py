"""A rank's process under torchrun (hpctrain/programs/torchrun_worker.py's run_worker, which the script's
worker shares): what it leaves in the node task's state folder and the status it exits with."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hpctrain.programs.script_torchrun as script_torchrun
from hpctrain.programs.torchrun_node import PEER_FAILURE_EXIT, SPEC_FILE, death_reason
from hpctrain.programs.torchrun_worker import run_worker
from hpctrain.runtime.script.outcome import PeerFailed, ScriptFailed

RANK = 3


def ending(outcome: Any) -> Callable[[dict[str, Any], Path], Callable[[], dict[str, Any]]]:
    """A worker factory whose worker returns ``outcome``, or raises it."""

    def make(payload: dict[str, Any], state_dir: Path) -> Callable[[], dict[str, Any]]:
        assert payload == {"spec": {}, "run_dir": "runs/x"}

        def run() -> dict[str, Any]:
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        return run

    return make


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RANK", str(RANK))
    (tmp_path / SPEC_FILE).write_text(json.dumps({"spec": {}, "run_dir": "runs/x"}))
    return tmp_path


def test_a_result_is_left_whole_for_the_node_task(state: Path) -> None:
    result = {"rank": RANK, "loss": 0.5}
    assert run_worker([str(state)], "m", ending(result)) == 0
    assert pickle.loads((state / f"result-{RANK}.pkl").read_bytes()) == result
    assert death_reason(state, RANK) is None


def test_an_error_is_named_and_a_peers_echo_is_nobodys_first_failure(state: Path) -> None:
    assert run_worker([str(state)], "m", ending(ValueError("bad batch"))) == 1
    assert death_reason(state, RANK) == "ValueError: bad batch"
    echo = RuntimeError("Connection closed by peer [10.0.0.2]:29500")
    assert run_worker([str(state)], "m", ending(echo)) == PEER_FAILURE_EXIT
    assert death_reason(state, RANK) is None


def test_the_script_workers_own_failures(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script that failed wrote its marker already; one that ended because a peer failed is an echo."""
    (state / SPEC_FILE).write_text(json.dumps({"spec": {}, "run_dir": "runs/x", "script_code": {}}))

    def worker(error: Exception) -> Callable[..., Callable[[], dict[str, Any]]]:
        return lambda *args: ending(error)({"spec": {}, "run_dir": "runs/x"}, state)

    monkeypatch.setattr(script_torchrun, "ScriptTorchrunWorker", worker(PeerFailed("rank 1 failed first")))
    assert script_torchrun.main([str(state)]) == PEER_FAILURE_EXIT and death_reason(state, RANK) is None
    (state / f"failed-{RANK}").write_text("the script exited with code 3")  # as save_failure_marker leaves it
    monkeypatch.setattr(script_torchrun, "ScriptTorchrunWorker", worker(ScriptFailed("exited with code 3")))
    assert script_torchrun.main([str(state)]) == 1
    assert death_reason(state, RANK) == "the script exited with code 3", "its own marker is kept"
    monkeypatch.setattr(script_torchrun, "ScriptTorchrunWorker", worker(OSError("disk full")))
    assert script_torchrun.main([str(state)]) == 1 and death_reason(state, RANK) == "OSError: disk full"


def test_a_wrong_command_line_says_how_to_call_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_worker([], "hpctrain.programs.torchrun_worker", ending({})) == 2
    assert capsys.readouterr().err == "usage: python -m hpctrain.programs.torchrun_worker STATE_DIR\n"

"""The node probe's verdicts (healing/evidence.py): a node is lost on Slurm's decision or on its slurmd's
silence, never on a guess -- a slurmd port that was not learnt, a late answer to the controller's ping."""

from __future__ import annotations

import socket

import pytest

from hpctrain.healing.evidence import NodeProbe
from tests.fake_slurm import FakeSlurm


class Probe(NodeProbe):
    """A probe whose slurmd connects are scripted: node -> answers (None: it answered)."""

    def __init__(self, slurm: FakeSlurm, dead: set[str]) -> None:
        super().__init__(slurm.client())
        self.dead = dead
        self.asked: list[str] = []

    def lost_reason(self, node: str) -> str | None:
        self.asked.append(node)
        return "its slurmd does not answer" if node in self.dead else None


@pytest.mark.parametrize("state", ["down", "down*", "drained", "draining*", "fail", "failing~"])
def test_a_state_slurm_or_an_administrator_decided_is_a_loss_without_asking_the_node(state: str) -> None:
    probe = Probe(FakeSlurm(), dead=set())
    assert probe.lost_by_state("n2", state) and probe.asked == []


@pytest.mark.parametrize("state", ["mixed*", "allocated*", "idle*", "unknown", "unknown*"])
def test_a_node_that_only_answered_a_ping_late_is_lost_only_when_its_slurmd_is_silent_too(state: str) -> None:
    alive, dead = Probe(FakeSlurm(), dead=set()), Probe(FakeSlurm(), dead={"n1"})
    assert not alive.lost_by_state("n1", state) and alive.asked == ["n1"]
    assert dead.lost_by_state("n1", state) and dead.asked == ["n1"]


@pytest.mark.parametrize("state", ["mixed", "allocated", "idle", "completing", "mixed-"])
def test_a_healthy_state_is_no_loss(state: str) -> None:
    probe = Probe(FakeSlurm(), dead={"n1"})
    assert not probe.lost_by_state("n1", state) and probe.asked == []


def test_a_slurmd_port_the_controller_did_not_say_is_no_proof_of_a_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """``scontrol show config`` timed out: the probe cannot tell (no guessed port, nothing remembered), and
    learns the port at the next ask."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    monkeypatch.setattr(socket, "gethostbyname", lambda node: "127.0.0.1")
    answers = {"scontrol show config": (1, "slurm_load_ctl_conf error: Socket timed out on send/recv operation")}
    slurm = FakeSlurm(answers=answers)
    probe = NodeProbe(slurm.client())
    try:
        assert probe.lost_reason("n1") is None and probe.slurmd_port() is None
        slurm.answers["scontrol show config"] = (0, f"SlurmdPort              = {port}\n")
        assert probe.lost_reason("n1") is None and probe.slurmd_port() == port  # it answers on the learnt port
        listener.close()
        assert probe.lost_reason("n1") == "its slurmd does not answer"
    finally:
        listener.close()

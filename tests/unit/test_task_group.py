"""task.group.SideGroup.arrive's one exchange, with gloo's point-to-point calls faked (their timeouts decide it)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch

from hpctrain.errors import CheckpointError
from hpctrain.task import group as group_mod


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class Work:
    """A request whose wait takes ``takes`` seconds of the fake clock, or fails when that is past its timeout."""

    def __init__(self, clock: FakeClock, takes: float, fill: torch.Tensor | None = None, into: Any = None) -> None:
        self.clock, self.takes, self.fill, self.into = clock, takes, fill, into

    def wait(self, timeout: timedelta) -> bool:
        if self.takes > timeout.total_seconds():
            self.clock.now += timeout.total_seconds()
            raise RuntimeError("Application timeout caused pair closure")
        self.clock.now += self.takes
        if self.fill is not None:
            self.into.copy_(self.fill)
        return True


class FakeDist:
    """Rank ``rank`` of ``world``: each peer's word arrives after ``arrives[peer]`` s; each send takes ``sends`` s."""

    def __init__(self, clock: FakeClock, rank: int, world: int, arrives: dict[int, float], sends: float) -> None:
        self.clock, self.rank, self.world, self.arrives, self.sends = clock, rank, world, arrives, sends
        self.send_timeouts: list[float] = []

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.world

    def irecv(self, tensor: torch.Tensor, src: int, group: Any, tag: int) -> Work:
        value = torch.full_like(tensor, 0)
        value[0], value[1] = 7, -7  # every peer is at step 7
        return Work(self.clock, self.arrives.get(src, 0.0), value, tensor)

    def isend(self, tensor: torch.Tensor, dst: int, group: Any, tag: int) -> Work:
        outer = self

        class Send(Work):
            def wait(self, timeout: timedelta) -> bool:
                outer.send_timeouts.append(timeout.total_seconds())
                return super().wait(timeout)

        return Send(self.clock, self.sends)


def side_group(monkeypatch: pytest.MonkeyPatch, fake: FakeDist, clock: FakeClock) -> group_mod.SideGroup:
    monkeypatch.setattr(group_mod, "dist", fake)
    monkeypatch.setattr(group_mod, "time", clock)
    side = group_mod.SideGroup.__new__(group_mod.SideGroup)
    side.timeout = timedelta(seconds=5)
    side._group, side._made = object(), True
    return side


def test_a_rank_that_comes_at_the_last_moment_still_gets_its_answer_in_a_timeout_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 2 came 4.999 s into rank 0's 5 s: the answer round is not left with the 1 ms that remained (which
    failed the send with a raw gloo error on rank 0)."""
    clock = FakeClock()
    fake = FakeDist(clock, rank=0, world=3, arrives={1: 0.5, 2: 4.499}, sends=0.01)
    assert side_group(monkeypatch, fake, clock).arrive("save(step=7)", 7) == (True, 0)
    assert fake.send_timeouts[0] == pytest.approx(5.0)


def test_a_rank_that_came_but_does_not_take_the_answer_is_a_checkpoint_error_not_a_gloo_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    fake = FakeDist(clock, rank=0, world=2, arrives={1: 0.5}, sends=60.0)
    with pytest.raises(CheckpointError, match="not every rank called it within 5 s .a rank that came did not take"):
        side_group(monkeypatch, fake, clock).arrive("save(step=7)", 7)


def test_a_rank_waits_for_rank_0s_answer_up_to_twice_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 may come up to one timeout after rank 1 and then wait up to one for the others."""
    clock = FakeClock()
    fake = FakeDist(clock, rank=1, world=3, arrives={0: 9.0}, sends=0.5)
    assert side_group(monkeypatch, fake, clock).arrive("save(step=7)", 7) == (True, 0)
    fake = FakeDist(clock, rank=1, world=3, arrives={0: 11.0}, sends=0.5)
    with pytest.raises(CheckpointError, match="rank 0 did not answer: see rank 0's log"):
        side_group(monkeypatch, fake, clock).arrive("save(step=7)", 7)

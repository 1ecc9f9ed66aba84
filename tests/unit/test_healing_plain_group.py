"""A CPU script's burn-in without torch (healing/plain_group.py, plain_probes.py): members joined over loopback
TCP, in threads of one process here (a child process for the whole burn-in); the real nodes' run is
tests/slurm/test_node_loss_e2e.py's script burn-in."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpctrain.errors import DistributedSetupError
from hpctrain.healing.plain_group import MAX_MESSAGE, PlainGroup, send
from hpctrain.healing.plain_probes import HashWork, pair_rates, probe_threads
from hpctrain.runtime.context import TaskEnv

KEY = "41.0."


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def member(rank: int, world: int, port: int) -> TaskEnv:
    names = tuple(f"n{i + 1}" for i in range(world))
    return TaskEnv(rank, world, 0, 1, rank, world, names, "127.0.0.1", port, "41", 0, "slurm", node_name=names[rank])


def in_threads(world: int, body: Callable[[PlainGroup], Any], *, timeout_s: float = 20) -> list[Any]:
    """``body`` on every member of a group of ``world``, each in its thread; their results by rank."""
    port = free_port()
    results: list[Any] = [None] * world

    def one(rank: int) -> None:
        group = PlainGroup(member(rank, world, port), port, KEY, timeout_s)
        try:
            results[rank] = body(group)
        except Exception as exc:  # noqa: BLE001  (the test looks at it)
            results[rank] = exc
        finally:
            group.close()

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s * 3)
    return results


def test_members_gather_broadcast_and_agree() -> None:
    def body(group: PlainGroup) -> Any:
        gathered = group.all_gather({"rank": group.rank, "name": f"n{group.rank + 1}"})
        told = group.broadcast("from rank 0" if group.rank == 0 else "ignored")
        group.barrier()
        return gathered, told, group.agree(10.0 - group.rank), group.agree(10.0 - group.rank, "MAX")

    results = in_threads(3, body)
    expected = [{"rank": r, "name": f"n{r + 1}"} for r in range(3)]
    assert results == [(expected, "from rank 0", 8.0, 10.0)] * 3


def test_strangers_on_the_port_are_closed_and_waited_past() -> None:
    """Rank 0 drops a connection announcing a message over the bound, one that is not JSON, one from another
    start (its key), one claiming a rank that is not in the group, and takes the real member after them."""
    port = free_port()
    hosted: list[Any] = []
    host = threading.Thread(target=lambda: hosted.append(PlainGroup(member(0, 2, port), port, KEY, 20)))
    host.start()
    strangers = [
        (MAX_MESSAGE + 1).to_bytes(4, "big") + b"x" * 64,
        (5).to_bytes(4, "big") + b"\xff\xfe{[x",
        None,  # a well-formed hello from another start
        None,  # ... and one with a rank beyond the group
    ]
    hellos = [{"rank": 1, "world": 2, "key": "99.0."}, {"rank": 5, "world": 2, "key": KEY}]
    for blob in strangers:
        conn = connect(port)
        if blob is not None:
            conn.sendall(blob)
        else:
            send(conn, hellos.pop(0))
        assert closed(conn)
        conn.close()
    joined: list[Any] = []
    late = threading.Thread(target=lambda: joined.append(PlainGroup(member(1, 2, port), port, KEY, 20)))
    late.start()
    host.join(30)
    late.join(30)
    groups = [hosted[0], joined[0]]
    try:
        answers: list[Any] = [None, None]
        threads = [
            threading.Thread(target=lambda g=g: answers.__setitem__(g.rank, g.all_gather(g.rank))) for g in groups
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert answers == [[0, 1], [0, 1]]
    finally:
        for group in groups:
            group.close()


def closed(conn: socket.socket) -> bool:
    """Whether the other end closed ``conn`` (a reset when it left our bytes unread)."""
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def connect(port: int) -> socket.socket:
    for _ in range(200):
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            threading.Event().wait(0.05)
    raise AssertionError(f"nothing listens on {port}")


def test_a_taken_port_and_a_member_that_never_comes_are_one_line_errors() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(DistributedSetupError, match=f"could not listen on the burn-in's port {port}"):
            PlainGroup(member(0, 2, port), port, KEY, 5)
    port = free_port()
    with pytest.raises(DistributedSetupError, match=r"the burn-in's ranks \[1, 2\] did not join rank 0 within 0.5 s"):
        PlainGroup(member(0, 3, port), port, KEY, 0.5)
    with pytest.raises(DistributedSetupError, match="could not reach rank 0 at 127.0.0.1"):
        PlainGroup(member(1, 2, port), port, KEY, 0.5)


def test_a_member_that_leaves_fails_the_others_calls_instead_of_hanging() -> None:
    def body(group: PlainGroup) -> Any:
        if group.rank == 1:
            return "left"  # closes its connection without answering
        return group.all_gather(0)

    first, second = in_threads(2, body, timeout_s=5)
    assert isinstance(first, DistributedSetupError) and "rank 0 lost its group" in str(first)
    assert second == "left"


def test_the_pairs_rates_are_measured_between_the_two_members_of_each_pair() -> None:
    rounds = [[(0, 1)], [(1, 2)], [(2, 0)]]

    def body(group: PlainGroup) -> dict[int, float]:
        return pair_rates(group, [0, 1, 2], rounds, time.perf_counter() + 30, one_at_a_time=True)

    results = in_threads(3, body)
    for node, rates in enumerate(results):
        assert not isinstance(rates, Exception), rates
        assert set(rates) == {0, 1, 2} and all(rate > 0 for rate in rates.values()), (node, rates)


def test_the_hash_workload_takes_its_threads_from_the_tasks_share() -> None:
    assert probe_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert probe_threads({"OMP_NUM_THREADS": "0"}) == probe_threads({}) >= 1
    work = HashWork(2)
    try:
        work(5)  # 2 + 3 units over the two threads
    finally:
        work.close()


DRIVER = r"""
import json, os, sys, threading
from pathlib import Path
from hpctrain.healing.burn_in import run_burn_in
from hpctrain.healing.plain_group import CPU, joined
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.context import TaskContext, TaskEnv
from hpctrain.runtime.stop import StopRequest

run_dir, port = Path(sys.argv[1]), int(sys.argv[2])
spec = JobSpec.model_validate({"name": "s", "resources": {"nodes": 2}, "script": {"path": "t.py"},
                               "health": {"burn_in": {"budget_s": 2}}})
exits = []

def one(rank):
    env = TaskEnv(rank, 2, 0, 1, rank, 2, ("n1", "n2"), "127.0.0.1", port, "41", 0, "slurm", node_name=f"n{rank + 1}")
    with joined(env, port, "41.0.1", 20) as group:
        ctx = TaskContext(env=env, spec=spec, run_dir=run_dir, device=CPU, stop=StopRequest())
        run_burn_in(ctx, exit_process=exits.append, plain=group)

threads = [threading.Thread(target=one, args=(rank,)) for rank in (0, 1)]
[t.start() for t in threads]
[t.join(60) for t in threads]
print(json.dumps({"torch": "torch" in sys.modules, "exits": exits}))
"""


def test_the_whole_plain_burn_in_records_both_nodes_and_imports_no_torch(tmp_path: Path) -> None:
    from hpctrain.contract.summary import read_summary
    from hpctrain.jobspec.node_health import BURN_IN_EXIT

    env = {**os.environ, "HPCTRAIN_STEP_ID": "41.0.1", "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("HPCTRAIN_BURN_IN", None)  # a flagged node: the supervisor's exit, asked for (no decider here)
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path), str(free_port())],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["torch"] is False
    summary = read_summary(tmp_path)
    assert summary is not None
    [record] = summary.burn_in
    assert record["nodes"] == ["n1", "n2"] and record["ring_mb_s"] is None
    for score in record["scores"]:
        assert score["compute_ms"] > 0 and score["allreduce_mb_s"] > 0, record
    assert said["exits"] == ([BURN_IN_EXIT] * 2 if record["flagged"] else [])  # flagged: the supervisor decides

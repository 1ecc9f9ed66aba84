"""Master port derivation and the address/port checks."""

from __future__ import annotations

import socket

import pytest

from hpctrain.errors import DistributedSetupError
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.master import (
    PORT_RANGE_END,
    PORT_RANGE_START,
    check_master_address,
    check_port_free,
    derive_master_port,
)


def test_port_is_in_range_and_below_the_ephemeral_range() -> None:
    ports = [derive_master_port(str(job), restart) for job in range(0, 200_000, 997) for restart in range(3)]
    assert all(PORT_RANGE_START <= port < PORT_RANGE_END for port in ports)
    assert PORT_RANGE_END <= 29500 < 32768  # torchrun's default and Linux's ephemeral range stay clear


def test_port_is_stable() -> None:
    # A fixed value: every rank (and every release of hpctrain) must agree on it.
    assert derive_master_port("1234", 0) == 16234
    assert derive_master_port("1234", 0) == derive_master_port("1234", 0)
    assert derive_master_port("abc", 2) == derive_master_port("abc", 2)


def test_consecutive_jobs_never_share_a_port() -> None:
    ports = {derive_master_port(str(job), 0) for job in range(500_000, 500_000 + (PORT_RANGE_END - PORT_RANGE_START))}
    assert len(ports) == PORT_RANGE_END - PORT_RANGE_START


def test_restarts_never_repeat_a_port() -> None:
    ports = [derive_master_port("777", restart) for restart in range(100)]
    assert len(set(ports)) == 100
    assert derive_master_port("777", 1) != derive_master_port("778", 0)


def test_non_numeric_ids_are_hashed_into_range() -> None:
    port = derive_master_port("torchrun-run-3f2a", 0)
    assert PORT_RANGE_START <= port < PORT_RANGE_END
    assert derive_master_port("²", 0) != 0  # not int()-ed by accident


def test_negative_restart_count_is_a_bug() -> None:
    with pytest.raises(ValueError):
        derive_master_port("1", -1)


def make_env(master_addr: str, num_nodes: int) -> TaskEnv:
    return TaskEnv(
        global_rank=0,
        world_size=num_nodes,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=num_nodes,
        hostnames=tuple(f"n{i}" for i in range(num_nodes)),
        master_addr=master_addr,
        master_port=20000,
        job_id="1",
        restart_count=0,
        source="slurm",
    )


def test_loopback_master_is_fine_on_one_node() -> None:
    check_master_address(make_env("localhost", 1))


def test_loopback_master_in_a_multi_node_job_is_an_error_with_a_hint() -> None:
    with pytest.raises(DistributedSetupError) as raised:
        check_master_address(make_env("localhost", 2))
    assert "loopback" in raised.value.message
    assert raised.value.hint and "/etc/hosts" in raised.value.hint
    check_master_address(make_env("localhost", 2), allow_loopback=True)


def test_unresolvable_master_is_an_error() -> None:
    with pytest.raises(DistributedSetupError, match="does not resolve"):
        check_master_address(make_env("no-such-host.invalid", 2))


def test_taken_port_is_reported() -> None:
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(DistributedSetupError, match=f"port {port} on .* is taken; set distributed.master_port"):
            check_port_free(port)
    check_port_free(port)  # free again once released

"""The rendezvous endpoint: which port rank 0 listens on, and whether it can.

The port is derived from the job id, so every rank computes the same value
without talking and two jobs sharing a node do not fight over torchrun's fixed
29500. ``derive_master_port`` is pure; the two ``check_*`` functions touch the
network stack and run on compute nodes just before the process group starts,
turning what would be a silent 30-minute rendezvous hang into a clear error.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket

from hpctrain.errors import DistributedSetupError
from hpctrain.runtime.context import TaskEnv

# Why 15000-29499:
# - below Linux's default ephemeral range (32768-60999, net.ipv4.ip_local_port_range),
#   so the kernel never hands our port to some process's outgoing connection;
# - above the low ports where services usually listen;
# - stopping short of 29500 keeps clear of torchrun's default, which
#   hand-launched jobs on the same node are likely to be using.
PORT_RANGE_START = 15000
PORT_RANGE_END = 29500  # exclusive
_PORT_SPAN = PORT_RANGE_END - PORT_RANGE_START
# Restart k moves the port by k * stride. The stride is prime and shares no
# factor with the span, so 14500 restarts of a job never repeat a port, and
# restart 1 of job J lands where job J + 7919 (unlikely to be running at the
# same time) would, not where job J + 1 would.
_RESTART_STRIDE = 7919


def derive_master_port(job_id: str, restart_count: int = 0) -> int:
    """A port in [PORT_RANGE_START, PORT_RANGE_END) that is the same on every rank.

    Numeric Slurm job ids map by modulo, so jobs with nearby ids (the ones
    likely to run at the same time, array tasks included: each array task has
    its own SLURM_JOB_ID) never collide within 14500 consecutive ids. Other ids
    (a torchrun run id) are hashed. A new restart gets a new port, because the
    previous run's socket may linger in TIME_WAIT or a leaked process of it may
    still hold the port.
    """
    if restart_count < 0:
        raise ValueError(f"restart_count must be >= 0, got {restart_count}")
    return PORT_RANGE_START + (_job_number(job_id) + restart_count * _RESTART_STRIDE) % _PORT_SPAN


def burn_in_port(master_port: int, step_key: str) -> int:
    """The rendezvous port of a script job's burn-in (``healing/script_burn_in.py``): derived like the master
    port from ``step_key`` (the step's id), never the script's own ``master_port``: the script's rendezvous
    follows the burn-in's at once, while the burn-in's store may still be closing on the first node."""
    port = derive_master_port(f"{step_key}.burn-in")
    return port if port != master_port else PORT_RANGE_START + (port - PORT_RANGE_START + 1) % _PORT_SPAN


def second_port(master_port: int, *, chosen: bool) -> int:
    """A job's second rendezvous port (the parameter server's RPC group): ``master_port + 1`` when the user
    chose the master port (``distributed.master_port``: their firewall's pair), else half the derived range
    away. ``master_port + 1`` of a derived port is the next job id's master port, and jobs of nearby ids run
    at the same time, on the same first node as often as not (rehearsal 25: a ps job's RPC group took the
    port of the job submitted after it). Half the range away it is the master port of a job 7,250 ids off."""
    if chosen or not PORT_RANGE_START <= master_port < PORT_RANGE_END:
        return master_port + 1 if master_port < 65535 else master_port - 1
    return PORT_RANGE_START + (master_port - PORT_RANGE_START + _PORT_SPAN // 2) % _PORT_SPAN


def _job_number(job_id: str) -> int:
    if job_id.isascii() and job_id.isdigit():
        return int(job_id)
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")


def check_master_address(env: TaskEnv, *, allow_loopback: bool = False) -> None:
    """Fail fast when other nodes could not reach the master by its name.

    In a multi-node job the master's name must resolve, on every node, to an
    address the other nodes can reach. Debian-style ``127.0.1.1 <hostname>``
    lines in /etc/hosts make it resolve to loopback, and then gloo/NCCL
    advertise an address nobody else can connect to. ``allow_loopback`` is for
    test clusters whose "nodes" really are loopback aliases of one machine.
    """
    if env.num_nodes <= 1:
        return
    here = socket.gethostname()
    try:
        infos = socket.getaddrinfo(env.master_addr, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise DistributedSetupError(
            f"the master address {env.master_addr!r} (first node of the job) does not resolve on {here}: {exc}",
            hint=f"every node must resolve {env.master_addr!r}: add it to DNS or /etc/hosts on {here}",
        ) from exc
    addresses = sorted({str(info[4][0]) for info in infos})
    loopback = [address for address in addresses if ipaddress.ip_address(address.split("%")[0]).is_loopback]
    if loopback and not allow_loopback:
        raise DistributedSetupError(
            f"the master address {env.master_addr!r} resolves to loopback {', '.join(loopback)} on {here} "
            f"in a {env.num_nodes}-node job; other nodes cannot connect to it",
            hint=f"fix /etc/hosts on {here}: {env.master_addr!r} must map to the address other nodes reach it by "
            "(remove a '127.0.1.1 <hostname>' line), or set HPCTRAIN_ALLOW_LOOPBACK_MASTER=1 if all nodes "
            "really are this one machine",
        )


def check_port_free(port: int, host: str | None = None) -> None:
    """Raise if something already listens on ``port`` here (rank 0 only).

    Binds with SO_REUSEADDR like torch's TCPStore does, so a socket of a
    finished run lingering in TIME_WAIT does not count as taken. Without this
    check a taken port surfaces only when the other ranks give up connecting.
    """
    where = host or socket.gethostname()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as exc:
            raise DistributedSetupError(
                f"port {port} on {where} is taken; set distributed.master_port",
                hint=f"{exc.strerror}: another job or a leftover process of an earlier run holds it "
                f"(`ss -ltnp 'sport = :{port}'` on {where} shows which); set distributed.master_port to a free port "
                f"in {PORT_RANGE_START}-{PORT_RANGE_END - 1}, or unset MASTER_PORT so hpctrain derives one per job",
            ) from exc

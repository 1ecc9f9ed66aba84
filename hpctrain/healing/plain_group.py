"""A torch-free group for a CPU script's burn-in: the members of one start, joined over plain TCP.

A ``script:`` job on CPUs brings its own process group and its own model: its
burn-in (``healing/script_burn_in.py``) needs only a few small collectives
(the layout, numbers to agree on, the verdict) and a link rate between the
nodes' pairs, and importing torch for them was 2.2-2.6 s of the 5.9 s a start
paid before the script began (``benchmarks/script_overhead.py --burn-in``).
Here instead:

* the control group is a star: rank 0 listens on ``master.burn_in_port``
  (every interface), the others connect within the distributed timeout and
  say who they are (rank, world size, the start's key); a connection that
  says anything else is closed and waited past. Messages are length-prefixed
  JSON of at most :data:`MAX_MESSAGE` bytes: no pickle, nothing a stranger on
  the port can make us allocate beyond it;
* :meth:`PlainGroup.exchange` measures a pair of members' link: each listens
  on a port of its own (told to the others at the start), the lower node
  connects, and both send and receive :data:`PAIR_BYTES` at once, the best of
  a few repeats counting (the rate a DDP bucket's all-reduce between the two
  would see, without gloo).

Every wait is bounded (the timeout, or the probe's deadline); a member that
fails or leaves makes every call a :class:`~hpctrain.errors.DistributedSetupError`
that the child prints in one line before the script starts without a verdict.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from hpctrain.errors import DistributedSetupError
from hpctrain.runtime.context import TaskEnv

MAX_MESSAGE = 1 << 20  # a rank's numbers and the verdict are a few kB
HELLO_S = 5.0  # a member sends its hello as soon as it connects; a silent connection is dropped after this
RETRY_S = 0.1
BUCKET_MB = 25.0  # DistributedDataParallel's default bucket_cap_mb: what each all-reduce of a step moves
PAIR_BYTES = int(BUCKET_MB * (1 << 20))  # a pair's exchange, each way: a bucket, as the torch probe's all-reduce
CHUNK = 1 << 20
CPU = SimpleNamespace(type="cpu", index=None)  # what a torch.device("cpu") tells the burn-in


class PlainGroup:
    """The members of one burn-in: :meth:`all_gather`, :meth:`broadcast` (from rank 0), :meth:`barrier`,
    :meth:`agree`, and :meth:`exchange` between two members. Collective calls, in the same order on every
    member, as a process group's."""

    def __init__(self, env: TaskEnv, port: int, key: str, timeout_s: float) -> None:
        self.rank, self.world, self.key, self.timeout_s = env.global_rank, env.world_size, key, timeout_s
        self._peers: dict[int, socket.socket] = {}
        self._control: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._token = secrets.token_hex(8)
        self._pairs: list[Any] = []  # every member's (address, pair port, token)
        deadline = time.monotonic() + timeout_s
        if self.rank == 0:
            self._host(port, deadline)
        else:
            self._join(env.master_addr, port, deadline)
        self._open_pair_port()

    # -- joining ----------------------------------------------------------------------------------------------
    def _host(self, port: int, deadline: float) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("", port))
            listener.listen(self.world)
        except OSError as exc:
            listener.close()
            raise DistributedSetupError(
                f"rank 0 could not listen on the burn-in's port {port} on {socket.gethostname()}: {exc.strerror}"
            ) from exc
        try:
            while len(self._peers) < self.world - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(1, self.world)) - set(self._peers))
                    raise DistributedSetupError(
                        f"the burn-in's ranks {missing} did not join rank 0 within {self.timeout_s:g} s"
                    )
                listener.settimeout(left)
                try:
                    conn, _ = listener.accept()
                except OSError:  # the timeout (the loop says who is missing), or a connection gone at once
                    continue
                self._admit(conn)
        finally:
            listener.close()

    def _admit(self, conn: socket.socket) -> None:
        """Keep ``conn`` when it says it is one of this start's members not yet joined; else close it."""
        hello = _hello(conn)
        if hello is None:
            return
        rank = hello.get("rank")
        fits = isinstance(rank, int) and not isinstance(rank, bool) and 0 < rank < self.world
        if not fits or hello.get("key") != self.key or hello.get("world") != self.world or rank in self._peers:
            conn.close()
            return
        conn.settimeout(self.timeout_s)
        self._peers[rank] = conn

    def _join(self, address: str, port: int, deadline: float) -> None:
        conn = _dial(address, port, deadline)
        if conn is None:
            raise DistributedSetupError(
                f"the burn-in's rank {self.rank} on {socket.gethostname()} could not reach rank 0 at "
                f"{address}:{port} within {self.timeout_s:g} s"
            )
        conn.settimeout(self.timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._control = conn
        self._call(send, conn, {"rank": self.rank, "world": self.world, "key": self.key})

    def _open_pair_port(self) -> None:
        """Listen on a port of this member's own, on the address the control connection uses, and tell
        every member where (collective)."""
        control = self._control or next(iter(self._peers.values()), None)
        address = control.getsockname()[0] if control is not None else "127.0.0.1"
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((address, 0))
        listener.listen(4)
        self._listener = listener
        self._pairs = self.all_gather([address, listener.getsockname()[1], self._token])

    # -- collectives ------------------------------------------------------------------------------------------
    def all_gather(self, value: Any) -> list[Any]:
        """Every member's ``value``, by rank, on every member."""
        if self.rank == 0:
            gathered = [value] + [self._call(receive, self._peers[r]) for r in range(1, self.world)]
            for r in range(1, self.world):
                self._call(send, self._peers[r], gathered)
            return gathered
        assert self._control is not None
        self._call(send, self._control, value)
        got = self._call(receive, self._control)
        if not isinstance(got, list) or len(got) != self.world:
            raise DistributedSetupError(f"the burn-in's rank 0 sent rank {self.rank} a malformed answer")
        return got

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every member (the others pass anything)."""
        if self.rank == 0:
            for r in range(1, self.world):
                self._call(send, self._peers[r], value)
            return value
        assert self._control is not None
        return self._call(receive, self._control)

    def barrier(self) -> None:
        self.all_gather(None)

    def agree(self, value: float, op: str = "MIN") -> float:
        """The smallest (``op="MAX"``: largest) ``value`` over every member."""
        numbers = [float(v) if isinstance(v, (int, float)) else value for v in self.all_gather(value)]
        return max(numbers) if op == "MAX" else min(numbers)

    def _call(self, what: Any, conn: socket.socket, *args: Any) -> Any:
        try:
            return what(conn, *args)
        except (OSError, ValueError) as exc:  # a peer gone, a timeout, a malformed message
            raise DistributedSetupError(f"the burn-in's rank {self.rank} lost its group: {exc}") from exc

    # -- a pair's link ----------------------------------------------------------------------------------------
    def exchange(self, peer: int, repeats: int, deadline: float) -> float | None:
        """Best seconds of ``repeats`` (after one warm-up) of both members sending :data:`PAIR_BYTES` to each
        other at once; None when the deadline (and a margin) passed before the two met. Both call it."""
        conn = self._pair_connection(peer, deadline)
        if conn is None:
            return None
        out = bytes(PAIR_BYTES)
        into = bytearray(CHUNK)
        best = float("inf")
        try:
            conn.settimeout(max(self.timeout_s, 1.0))
            for number in range(repeats + 1):
                started = time.perf_counter()
                failure: list[BaseException] = []
                sender = threading.Thread(target=_send_all, args=(conn, out, failure), daemon=True)
                sender.start()
                left = PAIR_BYTES
                while left:
                    got = conn.recv_into(into, min(CHUNK, left))
                    if not got:
                        raise ConnectionError("the pair's peer closed the connection")
                    left -= got
                sender.join()
                if failure:
                    raise failure[0]
                if number:
                    best = min(best, time.perf_counter() - started)
        except (OSError, ValueError) as exc:
            raise DistributedSetupError(f"the burn-in's link probe from rank {self.rank} to {peer}: {exc}") from exc
        finally:
            conn.close()
        return best

    def _pair_connection(self, peer: int, deadline: float) -> socket.socket | None:
        """The lower rank connects to the higher's pair port and says the higher's token; the higher accepts
        the connection that says it (others are closed)."""
        until = time.monotonic() + max(0.0, deadline - time.perf_counter()) + self.timeout_s
        if self.rank < peer:
            address, port, token = self._pairs[peer]
            conn = _dial(address, int(port), until)
            if conn is not None:
                conn.settimeout(self.timeout_s)
                self._call(send, conn, {"token": token, "from": self.rank})
            return conn
        assert self._listener is not None
        while (left := until - time.monotonic()) > 0:
            self._listener.settimeout(left)
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                break
            except OSError:
                continue
            hello = _hello(conn)
            if hello is not None and hello.get("token") == self._token and hello.get("from") == peer:
                return conn
            conn.close()
        return None

    def close(self) -> None:
        for conn in [*self._peers.values(), self._control, self._listener]:
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self._peers.clear()


def _dial(address: str, port: int, until: float) -> socket.socket | None:
    """A connection to ``address:port``, tried again every :data:`RETRY_S` until ``until`` (monotonic);
    None when nothing answered by then (the listener may not be up yet: its process is still starting)."""
    while (left := until - time.monotonic()) > 0:
        try:
            return socket.create_connection((address, port), timeout=min(left, 2.0))
        except OSError:
            time.sleep(RETRY_S)
    return None


def _hello(conn: socket.socket) -> dict[str, Any] | None:
    """The first message of a connection just accepted, when it is a JSON object sent within :data:`HELLO_S`;
    else None, and ``conn`` is closed (a stranger, or a member that went silent)."""
    conn.settimeout(HELLO_S)
    try:
        hello = receive(conn)
    except (OSError, ValueError):
        hello = None
    if not isinstance(hello, dict):
        conn.close()
        return None
    return hello


def _send_all(conn: socket.socket, data: bytes, failure: list[BaseException]) -> None:
    try:
        conn.sendall(data)
    except OSError as exc:
        failure.append(exc)


def send(conn: socket.socket, value: Any) -> None:
    """One message: its length (4 bytes, big-endian), then its JSON."""
    data = json.dumps(value, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"a burn-in message of {len(data)} bytes (at most {MAX_MESSAGE})")
    conn.sendall(len(data).to_bytes(4, "big") + data)


def receive(conn: socket.socket) -> Any:
    """One message (:func:`send`); a length over :data:`MAX_MESSAGE` or bytes that are not JSON: ValueError."""
    size = int.from_bytes(_exactly(conn, 4), "big")
    if size > MAX_MESSAGE:
        raise ValueError(f"a burn-in message of {size} bytes announced (at most {MAX_MESSAGE})")
    return json.loads(_exactly(conn, size))


def _exactly(conn: socket.socket, size: int) -> bytes:
    parts: list[bytes] = []
    left = size
    while left:
        part = conn.recv(min(left, 1 << 16))
        if not part:
            raise ConnectionError("the connection closed mid-message")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


@contextlib.contextmanager
def joined(env: TaskEnv, port: int, key: str, timeout_s: float) -> Iterator[PlainGroup]:
    """This member in the start's group, for the ``with`` block."""
    group = PlainGroup(env, port, key, timeout_s)
    try:
        yield group
    finally:
        group.close()

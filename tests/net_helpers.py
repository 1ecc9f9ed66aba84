"""A free TCP port on this machine, for the tests that start a process group (the one definition)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS's choice on loopback); the caller binds it soon after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

"""``hpctrain login CLUSTER [--check | --close]``: the one SSH connection to a cluster's login node.

Opened here, in a terminal, by the user's own ssh: the password and the
Duo/OTP code are typed once; every later ``--cluster CLUSTER`` command goes
through it without a prompt (``hpctrain/remote/ssh.py``). The login node's
hpctrain is checked at once, so a missing install is said now, not later.
"""

from __future__ import annotations

import argparse

from hpctrain.remote import verbs


def run(args: argparse.Namespace) -> int:
    connection = verbs.connect(args.cluster)
    if args.check:
        alive = connection.alive()
        print(f"{args.cluster}: {'connected' if alive else 'not connected'} ({connection.login.host})")
        return 0 if alive else 1
    if args.close:
        closed = connection.close()
        print(f"{args.cluster}: {'closed' if closed else 'was not connected'}")
        return 0
    connection.open()
    version = verbs.check_hpctrain(connection)
    print(
        f"{args.cluster}: connected to {connection.login.host} ({version} there); kept open {connection.login.persist}"
    )
    return 0

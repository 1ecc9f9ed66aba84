"""``hpctrain remote prune [--older-than D] [--dry-run] [--cluster NAME]``: clean the login node's shipped folders.

With ``--cluster`` it runs on that cluster's login node (``remote/verbs.py``
forwards it); there, or without it, it prunes this account's
``~/hpctrain-submits`` by ``remote/stages.py``'s policy and prints each
stage with what was done and why.
"""

from __future__ import annotations

import argparse

from hpctrain.remote import stages


def run(args: argparse.Namespace) -> int:
    older = stages.parse_age(args.older_than) if args.older_than is not None else stages.DEFAULT_OLDER_THAN_S
    done = stages.prune(older, dry_run=args.dry_run)
    verb = {"keep": "kept", "drop-tree": "would drop its tree" if args.dry_run else "dropped its tree"}
    for decision in done.decisions:
        action = verb.get(decision.action, "would drop" if args.dry_run else "dropped")
        print(f"{decision.stage.path.name}{'  (report)' if decision.stage.report else ''}: {action} ({decision.why})")
    for line in done.skipped:
        print(f"skipped {line}")
    for line in done.failed:
        print(f"failed {line}")
    root = stages.stages_root()
    if not done.decisions:
        print(f"nothing to prune in {root}")
    else:
        what = "would free" if args.dry_run else "freed"
        print(f"{root}: {len(done.decisions)} stages, {what} {done.freed()}")
    return 1 if done.failed else 0

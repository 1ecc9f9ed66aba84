"""The thin remote runner: a verb typed on a laptop, run by the login node's hpctrain. Torch-free.

Every verb is sent as ``hpctrain VERB ARGS...`` (the profile's
``login.hpctrain``) through the cluster's one connection, and what it prints
streams back unchanged, with its exit status: the answers are the login
node's own. Three verbs need more than that:

* ``submit`` ships the project folder and the spec first, and runs exactly
  once per token (``shipping.py``); ``resume`` ships nothing but runs once
  per token too (a retry after a dropped connection never resumes twice);
* ``report`` writes its files on the login node and copies them back into
  ``--out`` here (default ``./report``);
* every verb checks first that the login node's hpctrain is there and of
  this release (once per master connection).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hpctrain.contract.file_writes import write_atomic
from hpctrain.contract.runfiles import real_path
from hpctrain.errors import RemoteError, UsageError
from hpctrain.jobspec.login import LoginHost
from hpctrain.jobspec.profiles import available_profiles, load_profile
from hpctrain.remote import shipping
from hpctrain.remote.ssh import Connection
from hpctrain.version import __version__

Answer = subprocess.CompletedProcess[bytes]

# Verbs that run on the login node when --cluster names a profile with login:. For the first set
# --cluster only chooses the login node (the login side's verb has no such flag): it is not sent.
SELECTOR_ONLY = ("status", "logs", "cancel", "resume", "report", "sync", "remote")
FORWARDED = (*SELECTOR_ONLY, "submit", "nodes", "doctor", "plan")
REMOTE_SIDE = "HPCTRAIN_REMOTE_SIDE"  # set on the login node: its --cluster never goes remote again
VALUE_OPTIONS = {"--set", "--cluster", "--time-min", "--out", "--baseline", "--nodes", "--rank", "-n", "--lines"}


def login_of(name: str) -> LoginHost | None:
    try:
        profile = load_profile(name)
    except KeyError:
        raise UsageError(
            f"no cluster profile named {name!r}", hint=f"one of: {', '.join(available_profiles())}"
        ) from None
    return profile.login


def remote_cluster(args: argparse.Namespace) -> str | None:
    """The cluster this command runs on remotely, or None: it runs here."""
    name = getattr(args, "cluster", None)
    if not name or args.command not in FORWARDED or os.environ.get(REMOTE_SIDE):
        return None
    if args.command not in SELECTOR_ONLY:  # --cluster is the verb's own (a profile, or a ledger's cluster name)
        try:
            return str(name) if load_profile(name).login is not None else None
        except KeyError:
            return None
    if login_of(name) is None:
        raise UsageError(
            f"cluster profile {name!r} names no login host, so '{args.command} --cluster' has nowhere to go",
            hint=f"add login: {{host: ...}} to {name}'s profile (docs/remote.md), or run without --cluster",
        )
    return str(name)


def connect(name: str) -> Connection:
    login = login_of(name)
    if login is None:
        raise UsageError(
            f"cluster profile {name!r} names no login host", hint="add login: {host: ...} (docs/remote.md)"
        )
    return Connection.for_cluster(name, login)


def hpctrain_words(connection: Connection) -> list[str]:
    return ["env", f"{REMOTE_SIDE}=1", *connection.login.command_words()]


def check_hpctrain(connection: Connection) -> str:
    """The login node's hpctrain version, once per master; RemoteError with the fix when absent or too old."""
    marker = connection.socket.with_name(connection.socket.name + ".checked")
    try:
        if marker.stat().st_mtime >= connection.socket.stat().st_mtime and marker.read_text() == __version__:
            return __version__
    except OSError:
        pass
    done = connection.run([*connection.login.command_words(), "--version"], capture=True)
    said = (done.stdout + done.stderr).decode(errors="replace").strip()
    match = re.search(r"hpctrain (\d+)\.(\d+)\.\S*", said)
    install = f"pip install 'hpctrain=={__version__}'"
    if done.returncode != 0 or match is None:
        raise RemoteError(
            f"{connection.name}: no hpctrain on the login node ({connection.login.hpctrain!r}: "
            f"{said.splitlines()[-1] if said else 'exit ' + str(done.returncode)})",
            "no_hpctrain",
            hint=f"install it there ({install} in a venv) and set login.hpctrain in the profile to that venv's "
            "bin/hpctrain",
        )
    theirs = match.group(0)
    if match.groups() != tuple(__version__.split(".")[:2]):
        raise RemoteError(
            f"{connection.name}: the login node has {theirs}, this laptop hpctrain {__version__}",
            "version",
            hint=f"on the login node: {install} (or upgrade here to its release)",
        )
    write_atomic(marker, __version__)
    return theirs


def forward(name: str, args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the command line ``argv`` on ``name``'s login node; its exit status."""
    connection = connect(name)
    connection.require()
    check_hpctrain(connection)
    words = without_cluster(argv) if args.command in SELECTOR_ONLY else list(argv)
    if args.command == "submit":
        return submit(connection, args, words).returncode
    if args.command == "resume":
        return resume(connection, words).returncode
    if args.command == "report":
        return report(connection, args, words)
    if getattr(args, "spec", None):  # plan SPEC, doctor SPEC: the spec and its code are read there
        return with_project(connection, args, words)
    at_terminal = sys.stdin.isatty() and sys.stdout.isatty()
    return connection.run([*hpctrain_words(connection), *words], terminal=at_terminal).returncode


def ship(connection: Connection, spec_path: str, token: str) -> str:
    """Send the project folder (which must hold the spec) to the login node's stage ``token``; the spec's
    path in it. A stage a first attempt already claimed keeps what it was sent."""
    project = real_path(Path.cwd())
    spec = real_path(spec_path)
    try:
        spec_rel = spec.relative_to(project)
    except ValueError:
        raise UsageError(
            f"{spec_path}: a remote command ships the folder it is run from, and the spec is not in it",
            hint="cd to your project folder (the one holding the spec and its code) and run it from there",
        ) from None
    files = sorted({*shipping.project_files(project), spec_rel})
    data = shipping.tar_stream(project, files)
    shipped = connection.run(["sh", "-c", shipping.RECEIVE, "sh", token], input=data, capture=True)
    if shipped.returncode != 0:
        raise RemoteError(
            f"{connection.name}: could not unpack the project on the login node: "
            f"{shipped.stderr.decode(errors='replace').strip()}",
            "ship",
            hint="is the home folder there full or not writable?",
        )
    return str(spec_rel)


def submit(connection: Connection, args: argparse.Namespace, words: list[str], *, capture: bool = False) -> Answer:
    """Ship the project and the spec, then submit on the login node exactly once for this command line."""
    try:
        spec_bytes = Path(args.spec).read_bytes()
    except OSError as exc:
        raise UsageError(f"{args.spec}: cannot read the spec: {exc.strerror}") from None
    key = shipping.pending_key(connection.name, words, spec_bytes)
    token = claimed_token(connection, key, "submit", quiet=capture)
    spec_rel = ship(connection, args.spec, token)
    done = run_once(connection, key, token, "tree", replace_spec(words, args.spec, spec_rel), capture=capture)
    prune_quietly(connection)
    return done


def resume(connection: Connection, words: list[str], *, capture: bool = False) -> Answer:
    """``resume RUN`` on the login node exactly once for this command line (nothing is shipped: it runs
    from the home folder there, where a relative RUN means what it means in a plain ssh session)."""
    key = shipping.pending_key(connection.name, words, b"")
    token = claimed_token(connection, key, "resume", quiet=capture)
    return run_once(connection, key, token, "home", words, capture=capture)


def claimed_token(connection: Connection, key: str, verb: str, *, quiet: bool = False) -> str:
    token, retried = shipping.token_for(key)
    if retried and not quiet:
        print(f"hpctrain: retrying {verb} {token} (an earlier attempt got no answer)", flush=True)
    return token


def run_once(
    connection: Connection, key: str, token: str, where: str, words: list[str], *, capture: bool = False
) -> Answer:
    """``words`` run by the login node's hpctrain once per ``token`` (``shipping.RUN_ONCE``): a retry
    prints the first attempt's answer. The token is dropped once an answer arrived."""
    remote = [*connection.login.command_words(), *words]
    done = connection.run(["sh", "-s", token, where, *remote], input=shipping.RUN_ONCE.encode(), capture=capture)
    if done.returncode in (97, 98):
        raise RemoteError(
            f"{connection.name}: {words[0]} {token} stopped on the login node before it ended",
            "interrupted",
            hint=f"see 'hpctrain status --all --cluster {connection.name}' before you {words[0]} again; "
            f"its output is in ~/hpctrain-submits/{token}/ there",
        )
    shipping.settled(key)
    return done


def prune_quietly(connection: Connection) -> None:
    """After a submit: the login node's old shipped folders go by the default policy (``stages.py``).
    Best effort: the submit has its answer, so nothing here may turn it into a failure."""
    try:
        connection.run([*hpctrain_words(connection), "remote", "prune"], capture=True)
    except RemoteError:
        pass


def with_project(connection: Connection, args: argparse.Namespace, words: list[str]) -> int:
    """A verb that reads a spec (plan, doctor): run there from a shipped copy of the project, then drop it."""
    token = shipping.new_token()
    spec_rel = ship(connection, args.spec, token)
    run_there = 'stage="$HOME/hpctrain-submits/$1"; shift; (cd "$stage/tree" && "$@"); rc=$?; rm -rf "$stage"; exit $rc'
    command = [*hpctrain_words(connection), *replace_spec(words, args.spec, spec_rel)]
    return connection.run(["sh", "-c", run_there, "sh", token, *command]).returncode


def report(connection: Connection, args: argparse.Namespace, words: list[str]) -> int:
    """The login node's report, its files copied back into --out (default ./report)."""
    local = Path(args.out or "report")
    token = shipping.new_token()
    there = f"~/hpctrain-submits/reports/{token}"
    if args.out:
        index = out_index(words)
        del words[index : index + (1 if "=" in words[index] else 2)]
    code = connection.run([*hpctrain_words(connection), *words, "--out", there]).returncode
    fetched = connection.run(
        ["sh", "-c", 'cd "$HOME/$1" 2>/dev/null && tar -cf - . ; rm -rf "$HOME/$1"', "sh", there[2:]],
        capture=True,
    )
    if fetched.stdout:
        names = shipping.unpack(fetched.stdout, local)
        print(f"report: {len(names)} files copied to {local}/")
    return code


def without_cluster(argv: Sequence[str]) -> list[str]:
    """argv without its --cluster NAME (or --cluster=NAME, or an abbreviation argparse took for it)."""
    out: list[str] = []
    skip = False
    for index, word in enumerate(argv):
        if skip:
            skip = False
            continue
        head = word.split("=", 1)[0]
        if "--" not in argv[:index] and len(head) > 2 and "--cluster".startswith(head) and head.startswith("--"):
            skip = "=" not in word
            continue
        out.append(word)
    return out


def replace_spec(words: list[str], spec: str, remote_spec: str) -> list[str]:
    """The command line with its SPEC (the first positional after the verb) replaced."""
    out = list(words)
    skip = True  # the verb itself
    for index, word in enumerate(out):
        if skip:
            skip = False
            continue
        if word.startswith("-") and word != "-":
            skip = word.split("=", 1)[0] in VALUE_OPTIONS and "=" not in word
            continue
        if word == spec:
            out[index] = remote_spec
            return out
    return out


def out_index(words: list[str]) -> int:
    return next(i for i, w in enumerate(words) if w.split("=", 1)[0] in ("--out", "--ou", "--o"))

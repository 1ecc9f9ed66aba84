"""``hpctrain`` command line: one module per subcommand, errors handled here.

Subcommand modules are imported only when chosen, so ``hpctrain validate`` on
a login node never pays for (or imports) torch. Library code raises
``HpctrainError``; this is the one place that prints cause + hint and exits
with the error's code.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from hpctrain import __version__
from hpctrain.cli.pydantic_plugins import skip_plugin_search
from hpctrain.errors import HpctrainError, printable

# name -> (module, one-line help). Order is the order in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("hpctrain.cli.cmd_validate", "check a job spec and print what it asks for"),
    "submit": ("hpctrain.cli.cmd_submit", "submit a job spec to Slurm (or run it here with --local)"),
    "plan": ("hpctrain.cli.cmd_plan", "when a spec would start and finish at each node count, and which to ask for"),
    "status": ("hpctrain.cli.cmd_status", "show the state and progress of runs"),
    "logs": ("hpctrain.cli.cmd_logs", "print or follow a run's logs"),
    "cancel": ("hpctrain.cli.cmd_cancel", "cancel a run and make sure none of its processes survive"),
    "resume": ("hpctrain.cli.cmd_resume", "continue a stopped run as a new job in the same run directory"),
    "rehearse": ("hpctrain.cli.cmd_rehearse", "submit a job and force one time-limit requeue to prove resume"),
    "init": ("hpctrain.cli.cmd_init", "write a new job spec into jobs/ from the template"),
    "schema": ("hpctrain.cli.cmd_schema", "print the JSON Schema of job specs (for editors)"),
    "make-dataset": ("hpctrain.cli.cmd_make_dataset", "generate a small real-JPEG ImageFolder dataset"),
    "pack": ("hpctrain.cli.cmd_pack", "pack an ImageFolder dataset into one SquashFS image file for data.root"),
    "doctor": ("hpctrain.cli.cmd_doctor", "check that this cluster can run a job spec, with the fix for each problem"),
    "bench-data": ("hpctrain.cli.cmd_bench_data", "measure whether the data pipeline keeps the job's GPUs busy"),
    "report": ("hpctrain.cli.cmd_report", "plots and tables (md + self-contained html) from runs and studies"),
    "sync": ("hpctrain.cli.cmd_sync", "send a run's new metrics to its W&B and MLflow runs (from a login node)"),
    "nodes": ("hpctrain.cli.cmd_nodes", "the nodes your runs found sick or lost (the bad-node ledger); --forget NODE"),
    "login": ("hpctrain.cli.cmd_login", "open the one SSH connection to a cluster's login node (password/OTP once)"),
    "remote": ("hpctrain.cli.cmd_remote", "prune: clean the login node's shipped project copies (~/hpctrain-submits)"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser for every command, or for ``only`` (what the command line names; cheaper)."""
    parser = argparse.ArgumentParser(
        prog="hpctrain",
        description="Distributed PyTorch training from a YAML job spec to a resumable Slurm run.",
        epilog="Start with: hpctrain validate jobs/quickstart.yaml && hpctrain submit jobs/quickstart.yaml",
    )
    parser.add_argument("--version", action="version", version=f"hpctrain {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if only is not None and name != only:
            continue
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module)
        _add_arguments(module, sub)
    return parser


def _add_arguments(module: str, parser: argparse.ArgumentParser) -> None:
    # Each command module defines add_arguments(parser) and run(args) -> int.
    # Argument definitions are cheap; importing the module is deferred to run.
    from hpctrain.cli import arguments

    getattr(arguments, module.rsplit(".", 1)[1])(parser)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace | None:
    """The parsed command line; None (after printing the help) when it names no command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    named = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(named if named in COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return None
    args._argv = argv  # what a remote cluster's login node is asked (hpctrain/remote/verbs.py)
    return args


def run(args: argparse.Namespace) -> int:
    skip_plugin_search()
    try:
        if getattr(args, "cluster", None) and args.command != "login":
            from hpctrain.remote import verbs  # a profile with login: answers from its login node

            remote = verbs.remote_cluster(args)
            if remote is not None:
                return verbs.forward(remote, args, getattr(args, "_argv", []))
        command = importlib.import_module(args._module)
        return int(command.run(args) or 0)
    except HpctrainError as exc:
        print_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("hpctrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hpctrain submit --dry-run | head`
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    return 2 if args is None else run(args)


def only_reads(args: argparse.Namespace) -> bool:
    """Commands that read and print, and start, write and register nothing."""
    return args.command in ("validate", "schema") or (args.command == "submit" and args.dry_run)


def command_line() -> NoReturn:
    """The ``hpctrain`` command (its console script and ``python -m hpctrain``).

    A command that only reads and prints runs without the cyclic garbage
    collector and leaves with ``os._exit`` once its output is flushed: tearing
    the interpreter down, which frees the objects of some 300 modules one by
    one, is about 50 ms, a fifth of ``hpctrain validate`` on a login node.
    Every other command, and any run with a thread still going, exits the
    usual way (atexit handlers, finalizers, joins).
    """
    args = parse()
    quick = args is not None and only_reads(args)
    if quick:
        gc.disable()  # a short read: no cycles worth collecting; the collector costs ~8 % of the imports
    code = 2 if args is None else run(args)
    if quick and threading.active_count() == 1:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (BrokenPipeError, ValueError):  # `| head` closed it; nothing is lost that was wanted
                pass
        os._exit(code)
    sys.exit(code)


def warn(warnings: Sequence[str]) -> None:
    """Things a verb's library call found allowed but likely to hurt: to stderr, never fatal."""
    for warning in warnings:
        print(f"warning: {printable(warning, keep=chr(10))}", file=sys.stderr)


def print_error(exc: HpctrainError) -> None:
    """Cause and hint; they quote user text (keys, values, paths, names), so no control character reaches
    the terminal raw (a message's own line breaks are kept: each quoted part was escaped where it was made)."""
    print(f"error: {printable(exc.message, keep=chr(10))}", file=sys.stderr)
    if exc.hint:
        print(f"hint: {printable(exc.hint)}", file=sys.stderr)


if __name__ == "__main__":
    command_line()

"""Command-line arguments of every subcommand, kept apart from the commands so
building ``--help`` imports nothing heavy. One function per command module."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

# The largest job: 4096 nodes x 256 tasks (the spec's resources bounds).
MAX_RANK = 4096 * 256 - 1
DAY_S = 24 * 3600.0


def _whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]; anything else is one line and exit 2."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number; give one from {low:,} to {high:,}"
            ) from None
        if not low <= value <= high:
            what = "negative" if value < 0 <= low else "out of range"
            raise argparse.ArgumentTypeError(f"{text} is {what}; give a whole number from {low:,} to {high:,}")
        return value

    return whole


def _finite(low: float, high: float, *, above: bool = False, unit: str = "") -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] ((low, high] when ``above``); nan and inf refused."""
    span = f"a number above {low:g} and at most {high:g}{unit}" if above else f"{low:g} to {high:g}{unit}"

    def finite(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {span}") from None
        inside = low < value <= high if above else low <= value <= high
        if not math.isfinite(value) or not inside:
            raise argparse.ArgumentTypeError(f"{text} is out of range; give {span}")
        return value

    return finite


def _seconds(low: float, high: float) -> Callable[[str], float]:
    return _finite(low, high, unit=" seconds")


def _slurm_time(text: str) -> str:
    """An argparse type: a Slurm time limit (``04:00:00``, ``1-00:00:00``, minutes), checked as the spec's."""
    from hpctrain.jobspec.slurm_time import parse_time_limit

    try:
        parse_time_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="job spec YAML file, e.g. jobs/quickstart.yaml")
    _set_argument(parser, "override a spec key, e.g. --set trainer.epochs=5 (repeatable; VALUE is read as YAML)")


def _set_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help_text)


def _run_argument(parser: argparse.ArgumentParser, nargs: str | None = None) -> None:
    parser.add_argument("run", nargs=nargs, help="run directory (OUTPUT_DIR/NAME/RUN_ID) or Slurm job id")


def cmd_validate(parser: argparse.ArgumentParser) -> None:
    _spec_arguments(parser)
    parser.add_argument("--cluster", help="use this cluster profile instead of the spec's")


def cmd_submit(parser: argparse.ArgumentParser) -> None:
    _spec_arguments(parser)
    parser.add_argument("--cluster", help="use this cluster profile instead of the spec's")
    parser.add_argument("--dry-run", action="store_true", help="print the sbatch script and rank table; submit nothing")
    parser.add_argument("--local", action="store_true", help="run on this machine through submitit's local executor")
    parser.add_argument("--wait", action="store_true", help="block until the job ends; exit non-zero if it failed")
    parser.add_argument("--json", action="store_true", help='print {"job_id", "run_dir", "cluster", "backend"} as JSON')
    parser.add_argument(
        "--no-snapshot",
        action="store_true",
        help="do not copy the entrypoint's code into the run directory; every attempt runs the live tree",
    )
    parser.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the checks before queueing (data.root exists, partition and its MaxTime)",
    )
    parser.add_argument(
        "--time-min",
        type=_slurm_time,
        metavar="TIME",
        help="the shortest time limit to accept (resources.time_min): backfill may start a shorter chunk sooner",
    )
    parser.add_argument(
        "--no-exclude",
        action="store_true",
        help="do not add the bad-node ledger's live nodes to --exclude ('hpctrain nodes' lists them)",
    )
    parser.add_argument(
        "--after",
        metavar="RUN",
        help="start once the run RUN (its run directory or job id) has completed (after.when: ended, failed); "
        "its results as {after.run_dir} {after.checkpoint}... (docs/chains.md)",
    )


def cmd_plan(parser: argparse.ArgumentParser) -> None:
    _spec_arguments(parser)
    parser.add_argument("--cluster", help="use this cluster profile instead of the spec's")
    parser.add_argument(
        "--nodes",
        metavar="N,N,...",
        help="node counts to compare (default: 1,2,4,8 the partition holds, and the spec's)",
    )
    parser.add_argument(
        "--step-time",
        type=_finite(0, DAY_S, above=True, unit=" seconds"),
        metavar="S",
        help="seconds per optimizer step, if no earlier run of this spec measured it (at --step-time-nodes)",
    )
    parser.add_argument(
        "--step-time-nodes",
        type=_whole(1, 4096),
        metavar="N",
        help="the node count --step-time was seen at (default: the spec's)",
    )
    parser.add_argument(
        "--steps", type=_whole(1, 10**12), metavar="N", help="the run's optimizer steps (a script's own loop)"
    )
    parser.add_argument(
        "--samples-per-epoch",
        type=_whole(1, 10**12),
        metavar="N",
        help="training samples in an epoch (images), if no earlier run says",
    )
    parser.add_argument(
        "--margin",
        type=_finite(0, 10),
        default=0.10,
        metavar="F",
        help="recommend the cheapest shape finishing within this fraction of the earliest (default 0.10)",
    )
    parser.add_argument(
        "--restart",
        type=_seconds(0, DAY_S),
        default=None,
        metavar="S",
        help="seconds each chunk spends starting (imports, data, checkpoint load) before it trains (default: the "
        "median measured by this spec's earlier runs' starts, else 120)",
    )
    parser.add_argument(
        "--measure",
        nargs="?",
        const=40,
        type=_whole(3, 10_000),
        metavar="STEPS",
        help="first run the spec at 1 node for STEPS optimizer steps (default 40) and wait, so the plan has a "
        "measured step time (the built-in trainer's spec)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def cmd_nodes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--forget", metavar="NODE", help="remove NODE from your bad-node ledger")
    parser.add_argument("--cluster", help="only this cluster profile's entries (with --forget: only there)")
    parser.add_argument("--all", action="store_true", help="also the expired entries")
    parser.add_argument("--json", action="store_true", help="print the entries as a JSON list")


def cmd_status(parser: argparse.ArgumentParser) -> None:
    _run_argument(parser, nargs="?")
    parser.add_argument(
        "--output-dir",
        help="list the runs under this directory (default: the runs this account submitted from here or below)",
    )
    parser.add_argument("--all", action="store_true", help="list every run this account submitted, from anywhere")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="RUN: live view until the job ends (exit 0 completed, 1 failed, 10 stopped)",
    )
    parser.add_argument(
        "--interval",
        type=_seconds(2, 3600),
        default=5.0,
        metavar="S",
        help="--watch: seconds between looks (default 5; 2 to 3600)",
    )
    parser.add_argument("--ranks", action="store_true", help="RUN: every rank's last heartbeat (--watch: each change)")
    parser.add_argument(
        "--sync",
        action="store_true",
        help="--watch: send the run's new steps to its W&B/MLflow runs as it goes, and the rest at its end "
        "(as 'hpctrain sync RUN'; a tracker that is down never holds the watch)",
    )
    parser.add_argument("--cluster", help="ask this cluster's login node (a profile with login:, docs/remote.md)")


def cmd_logs(parser: argparse.ArgumentParser) -> None:
    _run_argument(parser)
    parser.add_argument("--rank", type=_whole(0, MAX_RANK), default=0, help="which task's log (default 0)")
    parser.add_argument("--err", action="store_true", help="show stderr instead of stdout")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends")
    parser.add_argument(
        "-n", "--lines", type=_whole(0, 1_000_000), default=50, help="lines from the end (default 50; 0 = all)"
    )
    parser.add_argument("--cluster", help="ask this cluster's login node (a profile with login:, docs/remote.md)")


def cmd_cancel(parser: argparse.ArgumentParser) -> None:
    _run_argument(parser)
    parser.add_argument(
        "--timeout", type=_seconds(0, DAY_S), default=60.0, help="seconds to wait for the job to end (0 to 86400)"
    )
    parser.add_argument("--json", action="store_true", help="print where each run stands as JSON")
    parser.add_argument("--cluster", help="ask this cluster's login node (a profile with login:, docs/remote.md)")


def cmd_sync(parser: argparse.ArgumentParser) -> None:
    _run_argument(parser)
    parser.add_argument(
        "-f", "--follow", action="store_true", help="sync again every --interval seconds until the runs ended"
    )
    parser.add_argument(
        "--interval", type=_seconds(1, DAY_S), default=30.0, help="seconds between syncs with --follow (default 30)"
    )
    parser.add_argument(
        "--ended",
        action="store_true",
        help="the run will not go on (killed for good): send its steps after the last checkpoint too",
    )
    parser.add_argument("--json", action="store_true", help="print each run's state in each tracker as JSON")
    parser.add_argument("--cluster", help="ask this cluster's login node (a profile with login:, docs/remote.md)")


def cmd_resume(parser: argparse.ArgumentParser) -> None:
    _run_argument(parser)
    parser.add_argument("--local", action="store_true", help="resume on this machine")
    _set_argument(
        parser,
        "resume on other resources, e.g. --set resources.nodes=2 (resources.* keys only; the global batch "
        "stays the run's)",
    )
    parser.add_argument("--wait", action="store_true", help="block until the job ends")
    parser.add_argument("--json", action="store_true", help="print the submission as JSON")
    parser.add_argument("--cluster", help="ask this cluster's login node (a profile with login:, docs/remote.md)")


def cmd_rehearse(parser: argparse.ArgumentParser) -> None:
    _spec_arguments(parser)
    parser.add_argument(
        "--timeout", type=_seconds(1, 7 * DAY_S), default=900.0, help="give up after this many seconds (up to 7 days)"
    )


def cmd_init(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="job name; writes jobs/NAME.yaml")
    # Their bounds are the spec's (resources.*): init validates the spec it writes.
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument(
        "--gpus-per-node", type=int, help="default: on 'local' this machine's GPUs, else the cluster profile's"
    )
    parser.add_argument("--tasks-per-node", type=int, help="processes per node (default: one per GPU; one on CPUs)")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument(
        "--cluster",
        help="a cluster profile; default: $HPCTRAIN_CLUSTER, else Slurm's ClusterName if a profile has it, "
        "'slurm' where Slurm is, 'local' where it is not",
    )
    parser.add_argument("--dir", default="jobs", help="directory to write into (default jobs/)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    parser.add_argument(
        "--script",
        metavar="PATH",
        help="run your own training script (its style is read from its text) instead of the trainer",
    )


def cmd_schema(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--indent", type=_whole(0, 16), default=2)


def cmd_make_dataset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="directory to create (must not exist, or be empty)")
    # The bounds belong to dataset/generate.py (checked there, all at once, before anything is written).
    parser.add_argument("--classes", type=int, default=10, help="2 to 100,000 (default 10)")
    parser.add_argument("--per-class", type=int, default=100, help="training images per class (1 to 100,000)")
    parser.add_argument("--val-per-class", type=int, default=None, help="1 to 100,000 (default max(10, per-class / 5))")
    parser.add_argument("--image-size", type=int, default=64, help="pixels a side, 8 to 2048 (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="any whole number (default 0)")


def cmd_pack(parser: argparse.ArgumentParser) -> None:
    from hpctrain.dataset.pack import MAX_PROCESSORS

    parser.add_argument("data_root", metavar="DATA_ROOT", help="the ImageFolder root (holds train/ and val/)")
    parser.add_argument("out", metavar="OUT.sqsh", help="the image file to write")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists (only once the new one is good)")
    parser.add_argument("--strict", action="store_true", help="fail on what cannot go in instead of leaving it out")
    threads = f"mksquashfs threads, 1 to {MAX_PROCESSORS} (default: all cores)"
    parser.add_argument("--processors", type=_whole(1, MAX_PROCESSORS), default=None, help=threads)


def cmd_bench_data(parser: argparse.ArgumentParser) -> None:
    _spec_arguments(parser)
    parser.add_argument("--cluster", help="use this cluster profile instead of the spec's")
    parser.add_argument("--slurm", action="store_true", help="measure on a compute node: a short one-task Slurm job")
    parser.add_argument(
        "--stage-dir", help="also measure the node-local disk here (default with data.stage: node: data.stage_dir)"
    )
    parser.add_argument("--gpu", help="GPU model for the demand table (h100, a100, v100); default: from the profile")
    parser.add_argument(
        "--demand",
        type=_finite(0, 1_000_000, above=True),
        help="images/s one GPU trains at, if you know it (up to 1,000,000)",
    )
    parser.add_argument(
        "--measure-gpu", action="store_true", help="measure the demand with synthetic training steps on this GPU"
    )
    parser.add_argument(
        "--max-files", type=_whole(1, 1_000_000), default=2000, help="read at most this many files (default 2000)"
    )
    parser.add_argument(
        "--seconds", type=_seconds(1, 3600), default=10.0, help="time budget per measurement (default 10; 1 to 3600)"
    )
    parser.add_argument(
        "--timeout", type=_seconds(60, DAY_S), default=900.0, help="--slurm: give up after this many seconds"
    )
    parser.add_argument("--json", action="store_true", help="print the measurements and the verdict as JSON")


def cmd_doctor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="job spec to check against the cluster (optional)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cluster", help="use this cluster profile instead of the spec's")
    parser.add_argument("--probe", action="store_true", help="also run a 2-minute job on a compute node and report")
    parser.add_argument(
        "--probe-timeout", type=_seconds(1, DAY_S), default=300.0, help="seconds to wait for the probe job"
    )
    parser.add_argument(
        "--measure-files",
        type=_whole(10, 100_000),
        default=2000,
        help="files of data.root the file-rate measurement touches at most (10 to 100,000; default 2000)",
    )
    parser.add_argument(
        "--measure-seconds",
        type=_seconds(1, 60),
        default=10.0,
        help="time box of the file-rate measurement (1 to 60; default 10)",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def cmd_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_OR_STUDY", help="run, sweep or study directories (or a job id)")
    parser.add_argument("--out", help="directory for report.md, report.html and PNGs (default: RUN_OR_STUDY/report)")
    parser.add_argument("--baseline", choices=["hal"], help="draw published reference numbers (hal: NCSA HAL V100)")
    parser.add_argument("--json", action="store_true", help="print the numbers (series summaries, table) as JSON")
    parser.add_argument("--cluster", help="ask this cluster's login node (a profile with login:, docs/remote.md)")


def cmd_remote(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["prune"], help="prune: clean ~/hpctrain-submits (docs/remote.md)")
    parser.add_argument("--older-than", metavar="AGE", help="age before a stage goes: 7d (default), 12h, 30m, 0")
    parser.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    parser.add_argument("--cluster", help="on this cluster's login node (a profile with login:, docs/remote.md)")


def cmd_login(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cluster", help="a cluster profile with login: (docs/remote.md)")
    parser.add_argument("--check", action="store_true", help="only say whether the connection is open (exit 0 if so)")
    parser.add_argument("--close", action="store_true", help="close the connection")

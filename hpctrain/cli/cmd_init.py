"""``hpctrain init NAME``: write ``jobs/NAME.yaml`` from ``templates/job.yaml``."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from hpctrain.contract.file_writes import user_file_mode, write_atomic, write_temporary
from hpctrain.errors import SpecError, UsageError, printable
from hpctrain.jobscript.templates import fill_yaml, read_template
from hpctrain.jobspec.fields import NAME_PATTERN
from hpctrain.jobspec.load import LoadedJob, load_job
from hpctrain.jobspec.profiles import ClusterProfile, load_profile
from hpctrain.launch import init_defaults

# Per-GPU batch that fits: HAL's V100s (16 GB) hold 208 ResNet-50 images in fp16, not 256.
GPU_BATCH = {"hal": 208}
DEFAULT_GPU_BATCH = 256


def checked_profile(nodes: int, gpus_per_node: int, cluster: str) -> ClusterProfile:
    """The cluster's profile, once the GPUs asked for fit its nodes."""
    try:
        profile = load_profile(cluster)
    except KeyError:
        raise UsageError(f"--cluster {cluster}: unknown cluster profile", hint="use hal, local, or your own") from None
    if profile.max_gpus_per_node is not None and gpus_per_node > profile.max_gpus_per_node:
        most = profile.max_gpus_per_node
        nodes_needed = -(-nodes * gpus_per_node // most)
        raise UsageError(
            f"--gpus-per-node {gpus_per_node}: '{cluster}' nodes have {most} GPUs",
            hint=f"use --gpus-per-node {most} --nodes {nodes_needed} for {nodes * gpus_per_node} GPUs",
        )
    return profile


def render_spec(
    name: str, path: Path, *, nodes: int, gpus_per_node: int, arch: str, cluster: str, tasks_per_node: int | None = None
) -> str:
    profile = checked_profile(nodes, gpus_per_node, cluster)
    on_gpu = gpus_per_node > 0
    return fill_yaml(
        read_template("job.yaml"),
        {
            "name": name,
            "path": str(path),
            "cluster": cluster,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "tasks_per_node": tasks_per_node,
            "time": "24:00:00" if on_gpu else "01:00:00",
            "arch": arch,
            "strategy": "ddp",
            "precision": "fp16" if on_gpu else "fp32",
            "epochs": 90 if on_gpu else 10,
            "batch_size": GPU_BATCH.get(cluster, DEFAULT_GPU_BATCH) if on_gpu else 32,
            "data_root": profile.data_root or "./data/imagenet-mini",
        },
    )


def render_script_spec(args: argparse.Namespace, path: Path) -> str:
    """A spec running ``--script`` in the style its text shows (launch/script_template.py)."""
    from hpctrain.launch import script_template

    checked_profile(args.nodes, args.gpus_per_node, args.cluster)
    style = script_template.style_of(script_template.read_script(Path(args.script)))
    return script_template.render(
        args.name,
        path,
        args.script,
        style,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cluster=args.cluster,
        tasks_per_node=args.tasks_per_node,
    )


def write_spec(path: Path, text: str, *, force: bool) -> LoadedJob:
    """Write the spec only if it validates; created exclusively (``force``: replaced atomically), never
    through a symlink planted under its name (contract/file_writes.py)."""
    try:
        draft = write_temporary(path, text, suffix=".draft.yaml")
    except OSError as exc:
        hint = "pick a directory you can write with --dir"
        raise UsageError(f"cannot write {printable(path)}: {exc.strerror}", hint=hint) from None
    try:
        job = load_job(draft)  # what we write must validate; a spec that does not is never left behind
    except SpecError as exc:  # said of the file it would have been, not of the draft
        raise SpecError(str(path), exc.problems, hint=f"nothing was written; {exc.hint}") from None
    finally:
        draft.unlink(missing_ok=True)
    try:
        write_atomic(path, text, exclusive=not force, mode=user_file_mode())
    except FileExistsError:
        raise UsageError(
            f"{printable(path)} already exists (a file or a link)", hint="pick another name, or pass --force"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"cannot write {printable(path)}: {exc.strerror}", hint="pick a directory you can write with --dir"
        ) from None
    return job


def run(args: argparse.Namespace) -> int:
    if not re.match(NAME_PATTERN, args.name):
        raise UsageError(f"{args.name!r} is not a job name", hint="use letters, digits, '_', '.', '-'")
    given = (
        ("--nodes", args.nodes, 1),
        ("--gpus-per-node", args.gpus_per_node, 0),
        ("--tasks-per-node", args.tasks_per_node, 1),
    )
    for flag, value, least in given:
        if value is not None and value < least:
            raise UsageError(f"{flag} must be {'positive' if least else 'zero or more'}")
    # what is not given follows where you are: the cluster here, its GPUs (launch/init_defaults.py)
    chosen = init_defaults.choose(
        init_defaults.look_around(),
        os.environ,
        cluster=args.cluster,
        gpus_per_node=args.gpus_per_node,
        tasks_per_node=args.tasks_per_node,
    )
    args.cluster, args.gpus_per_node = chosen.cluster, chosen.gpus_per_node
    directory = Path(args.dir)
    if directory.exists() and not directory.is_dir():
        raise UsageError(
            f"--dir {printable(args.dir)} is a file, not a directory", hint="pass a directory, e.g. --dir jobs"
        )
    path = directory / f"{args.name}.yaml"
    if (path.exists() or path.is_symlink()) and not args.force:
        raise UsageError(f"{printable(path)} already exists", hint="pick another name, or pass --force to overwrite it")
    if getattr(args, "script", None):
        text = render_script_spec(args, path)
    else:
        text = render_spec(
            args.name,
            path,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            arch=args.arch,
            cluster=args.cluster,
            tasks_per_node=args.tasks_per_node,
        )
    job = write_spec(path, text, force=args.force)
    script = job.spec.script
    what = job.spec.trainer.arch if script is None else f"{printable(args.script)}, one process per {script.per}"
    resources = job.spec.resources
    shape = f"{resources.nodes} node(s) x {resources.gpus_per_node} GPUs"
    if resources.tasks_per_node is not None:
        shape += f", {resources.tasks_per_node} task(s) per node"
    shown = printable(path)
    print(f"wrote {shown}: cluster {job.spec.cluster}, {shape}, {what}; next: hpctrain validate {shown}")
    if chosen.why:
        print(f"  defaults from where you are: {chosen.why} (flags --cluster, --gpus-per-node, --tasks-per-node)")
    return 0

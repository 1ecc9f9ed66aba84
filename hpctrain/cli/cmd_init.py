"""``hpctrain init NAME``: write ``jobs/NAME.yaml`` from ``templates/job.yaml``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from hpctrain.errors import UsageError
from hpctrain.jobspec.fields import NAME_PATTERN
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.profiles import ClusterProfile, load_profile
from hpctrain.launch.templates import fill, read_template

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


def render_spec(name: str, path: Path, *, nodes: int, gpus_per_node: int, arch: str, cluster: str) -> str:
    profile = checked_profile(nodes, gpus_per_node, cluster)
    on_gpu = gpus_per_node > 0
    return fill(
        read_template("job.yaml"),
        {
            "name": name,
            "path": str(path),
            "cluster": cluster,
            "nodes": str(nodes),
            "gpus_per_node": str(gpus_per_node),
            "time": "24:00:00" if on_gpu else "01:00:00",
            "arch": arch,
            "strategy": "ddp",
            "precision": "fp16" if on_gpu else "fp32",
            "epochs": "90" if on_gpu else "10",
            "batch_size": str(GPU_BATCH.get(cluster, DEFAULT_GPU_BATCH)) if on_gpu else "32",
            "data_root": profile.data_root or "./data/imagenet-mini",
        },
    )


def render_script_spec(args: argparse.Namespace, path: Path) -> str:
    """A spec running ``--script`` in the style its text shows (launch/script_template.py)."""
    from hpctrain.launch import script_template

    render_spec(
        args.name, path, nodes=args.nodes, gpus_per_node=args.gpus_per_node, arch=args.arch, cluster=args.cluster
    )
    style = script_template.style_of(script_template.read_script(Path(args.script)))
    return script_template.render(
        args.name, path, args.script, style, nodes=args.nodes, gpus_per_node=args.gpus_per_node, cluster=args.cluster
    )


def run(args: argparse.Namespace) -> int:
    if not re.match(NAME_PATTERN, args.name):
        raise UsageError(f"{args.name!r} is not a job name", hint="use letters, digits, '_', '.', '-'")
    for flag, value in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node + 1)):
        if value < 1:
            raise UsageError(f"{flag} must be positive")
    directory = Path(args.dir)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--dir {args.dir} is a file, not a directory", hint="pass a directory, e.g. --dir jobs")
    path = directory / f"{args.name}.yaml"
    if path.exists() and not args.force:
        raise UsageError(f"{path} already exists", hint="pick another name, or pass --force to overwrite it")
    if getattr(args, "script", None):
        text = render_script_spec(args, path)
    else:
        text = render_spec(
            args.name, path, nodes=args.nodes, gpus_per_node=args.gpus_per_node, arch=args.arch, cluster=args.cluster
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.draft.yaml")
        draft.write_text(text)
    except OSError as exc:
        hint = "pick a directory you can write with --dir"
        raise UsageError(f"cannot write {path}: {exc.strerror}", hint=hint) from None
    try:
        job = load_job(draft)  # what we write must validate; a spec that does not is never left behind
    except BaseException:
        draft.unlink(missing_ok=True)
        raise
    draft.replace(path)
    what = job.spec.trainer.arch if job.spec.script is None else f"{args.script}, one process per {job.spec.script.per}"
    print(
        f"wrote {path}: {job.spec.resources.nodes} node(s) x {job.spec.resources.gpus_per_node} GPUs, "
        f"{what}; next: hpctrain validate {path}"
    )
    return 0

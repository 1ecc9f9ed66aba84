"""Cluster profiles: what a cluster's nodes have and how to ask for them.

Built in: ``hal`` (NCSA HAL: Slurm partition ``gpu``, 4 V100 per node as GRES),
``slurm`` (any Slurm cluster, nothing assumed) and ``local`` (this machine, no
Slurm). Users add their own as YAML files named ``NAME.yaml`` in ``$HPCTRAIN_CONFIG_DIR/clusters/`` (default
``~/.config/hpctrain/clusters/``); a user file with a built-in's name replaces it.

Every profile :func:`load_profile` returns is the caller's own: a built-in is
copied deeply on each load, and ``BUILTIN_PROFILES`` is a read-only mapping,
so editing one loaded job's ``job.profile`` (its ``slurm_extra``, ``setup``,
``env``) never reaches another job loaded later in the same process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator

from hpctrain.errors import SpecError
from hpctrain.jobspec.fields import (
    NAME_PATTERN,
    EnvMap,
    SetupLines,
    SlurmExtraMap,
    check_mem_gb,
    check_slurm_word,
    safe_path,
)
from hpctrain.jobspec.login import LoginHost
from hpctrain.jobspec.models import JobSpec, Section
from hpctrain.jobspec.problems import problems_from_validation
from hpctrain.jobspec.slurm_time import parse_time_limit
from hpctrain.jobspec.yaml_source import read_spec_file

# What a GRES request looks like once {gpus} is filled in: gpu:4, gpu:v100:4, gpu:a100_3g.20gb:1.
GRES_PATTERN = r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?:[0-9]+$"


class ClusterProfile(Section):
    """Defaults and limits of one cluster. Spec values override profile values."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str = ""
    scheduler: Literal["slurm", "local"] = "slurm"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gpus_per_node: Annotated[int, Field(ge=0, description="Default GPUs per node a job asks for.")] = 0
    max_gpus_per_node: Annotated[int | None, Field(ge=0, description="GPUs the nodes have.")] = None
    gpu_gres: Annotated[
        str | None,
        Field(description="GRES template, e.g. 'gpu:v100:{gpus}'; unset: use --gpus-per-node."),
    ] = None
    cpus_per_task: Annotated[int | None, Field(ge=1, description="CPUs per GPU task (or per CPU task).")] = None
    mem_gb: Annotated[float | None, Field(gt=0)] = None
    max_time: Annotated[str | None, Field(description="Longest time limit the partition accepts.")] = None
    data_root: str | None = None
    setup: SetupLines = []
    env: EnvMap = {}
    slurm_extra: SlurmExtraMap = {}
    login: Annotated[
        LoginHost | None, Field(description="the login node, to run every verb from a laptop (docs/remote.md)")
    ] = None

    @field_validator("mem_gb")
    @classmethod
    def _mem_not_zero(cls, value: float | None) -> float | None:
        return check_mem_gb(value)

    # A site-wide profile directory is shared by many users: its values reach
    # every sbatch script, so they pass the same checks as a spec's.
    @field_validator("partition", "account", "qos", "constraint")
    @classmethod
    def _slurm_word(cls, value: str | None) -> str | None:
        return check_slurm_word(value)

    @field_validator("max_time")
    @classmethod
    def _max_time(cls, value: str | None) -> str | None:
        if value is not None:
            parse_time_limit(value)
        return value

    @field_validator("gpu_gres")
    @classmethod
    def _gres_template(cls, value: str | None) -> str | None:
        if value is None:
            return value
        rendered = value.replace("{gpus}", "4")
        if "{gpus}" not in value or not re.match(GRES_PATTERN, rendered):
            raise ValueError(f"{value!r} must look like 'gpu:{{gpus}}' or 'gpu:v100:{{gpus}}' ({{gpus}} is the count)")
        return value

    @field_validator("data_root")
    @classmethod
    def _data_root(cls, value: str | None) -> str | None:
        return safe_path(value)


_BUILTINS: dict[str, ClusterProfile] = {
    "hal": ClusterProfile(
        name="hal",
        description="NCSA HAL: IBM AC922 nodes with 4 NVIDIA V100 each, shared read-only ImageNet",
        scheduler="slurm",
        partition="gpu",
        gpus_per_node=4,
        max_gpus_per_node=4,
        gpu_gres="gpu:v100:{gpus}",
        cpus_per_task=40,
        max_time="24:00:00",
        data_root="/home/shared/imagenet/raw",
        setup=["module load opence"],
    ),
    "slurm": ClusterProfile(
        name="slurm",
        description="Any Slurm cluster: the default partition, no GPUs unless the spec asks for them",
        scheduler="slurm",
        gpus_per_node=0,
    ),
    "local": ClusterProfile(
        name="local",
        description="This machine, through submitit's local executor; no Slurm needed",
        scheduler="local",
        gpus_per_node=0,
    ),
}


BUILTIN_PROFILES: Mapping[str, ClusterProfile] = MappingProxyType(_BUILTINS)  # read-only; load_profile copies


def config_dir(environ: dict[str, str] | None = None) -> Path:
    environ = dict(os.environ) if environ is None else environ
    if environ.get("HPCTRAIN_CONFIG_DIR"):
        return Path(environ["HPCTRAIN_CONFIG_DIR"]).expanduser()
    return Path("~/.config/hpctrain").expanduser()


def user_profile_paths(environ: dict[str, str] | None = None) -> dict[str, Path]:
    directory = config_dir(environ) / "clusters"
    if not directory.is_dir():
        return {}
    return {path.stem: path for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))}


def available_profiles(environ: dict[str, str] | None = None) -> list[str]:
    return sorted(set(BUILTIN_PROFILES) | set(user_profile_paths(environ)))


def load_profile(name: str, environ: dict[str, str] | None = None) -> ClusterProfile:
    """Return the named profile; SpecError naming the file when a user profile is bad."""
    user = user_profile_paths(environ)
    if name in user:
        path = user[name]
        data, positions = read_spec_file(path)
        data.setdefault("name", name)
        try:
            return ClusterProfile.model_validate(data)
        except ValidationError as exc:
            raise SpecError(
                str(path),
                problems_from_validation(exc, positions, ClusterProfile),
                hint=f"fix the cluster profile; every job with 'cluster: {name}' uses it",
            ) from None
    if name in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[name].model_copy(deep=True)  # the caller's own (the module docstring)
    raise KeyError(name)


def apply_profile(spec: JobSpec, profile: ClusterProfile) -> JobSpec:
    """Fill the spec's unset values from the profile (spec values win)."""
    resources = spec.resources.model_copy()
    for key in ("partition", "account", "qos", "constraint", "cpus_per_task", "mem_gb"):
        if getattr(resources, key) is None and getattr(profile, key) is not None:
            setattr(resources, key, getattr(profile, key))
    if resources.gpus_per_node is None:
        resources.gpus_per_node = profile.gpus_per_node
    resources.slurm_extra = {**profile.slurm_extra, **resources.slurm_extra}
    data = spec.data.model_copy()
    if data.root is None and profile.data_root is not None:
        data.root = profile.data_root
    return spec.model_copy(
        update={
            "resources": resources,
            "data": data,
            "setup": [*profile.setup, *(line for line in spec.setup if line not in profile.setup)],
            "env": {**profile.env, **spec.env},
        }
    )

"""Load a job spec file into a resolved, validated job: YAML -> ``--set``
overrides -> pydantic models -> cluster profile -> cross-field checks -> sweep
(and, for a ``study:``, the same again for every point's resources).

Every problem is collected and reported at once in one SpecError.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hpctrain.errors import SpecError, SpecProblem
from hpctrain.jobspec.archs import ARCH_PARAMS_M, unknown_arch_message
from hpctrain.jobspec.horovod import horovod_refusal
from hpctrain.jobspec.layer_split import check_layer_split
from hpctrain.jobspec.models import APEX_LEVELS, JobSpec
from hpctrain.jobspec.node_health import node_health_problems
from hpctrain.jobspec.node_loss import node_loss_problems
from hpctrain.jobspec.problems import position_of, problems_from_validation
from hpctrain.jobspec.profiles import ClusterProfile, apply_profile, available_profiles, config_dir, load_profile
from hpctrain.jobspec.slurm_time import parse_time_limit
from hpctrain.jobspec.strategy_traits import traits
from hpctrain.jobspec.study_axes import StudyPoint, check_axes, combinations, point_label
from hpctrain.jobspec.yaml_source import _SpecLoader, read_spec_file


@dataclass(frozen=True)
class LoadedJob:
    """A spec with its profile applied, plus one spec per sweep combination."""

    spec: JobSpec
    profile: ClusterProfile
    source: Path
    trials: tuple[JobSpec, ...]
    trial_params: tuple[dict[str, Any], ...]
    points: tuple[StudyPoint, ...] = ()  # a study's points, each its own job

    @property
    def is_sweep(self) -> bool:
        return bool(self.spec.sweep)

    @property
    def is_study(self) -> bool:
        return bool(self.points)


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=value`` -> ("a.b", parsed value); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise SpecError(
            "--set", [SpecProblem(key, f"{text!r} is not KEY=VALUE")], hint="write it like --set trainer.epochs=5"
        )
    try:
        value = yaml.load(raw, Loader=_SpecLoader) if raw.strip() else ""  # noqa: S506 - safe loader
    except yaml.YAMLError:
        value = raw
    return key, value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if parts[0] in ("sweep", "study") and len(parts) > 1:  # their keys are dotted themselves
        parts = [parts[0], ".".join(parts[1:])]
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise SpecError("--set", [SpecProblem(key, f"'{part}' is not a section, cannot set a key inside it")])
        node = child
    node[parts[-1]] = value


def load_job(
    path: str | Path,
    overrides: Iterable[str] = (),
    *,
    cluster: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> LoadedJob:
    source = Path(path)
    data, positions = read_spec_file(source)
    overridden: set[str] = set()
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(data, key, value)
        overridden.add(key)
    if cluster is not None:
        data["cluster"] = cluster
        overridden.add("cluster")

    problems: list[SpecProblem] = []
    job = _resolve(data, positions, overridden, environ, source, problems)
    points: tuple[StudyPoint, ...] = ()
    axis_problems = [_positioned(p, positions) for p in check_axes(data.get("study"))]
    # An axis check says more than the model's "input should be a valid list" about the same key.
    answered = {p.key for p in axis_problems}
    problems[:] = [p for p in problems if p.key not in answered] + axis_problems
    if job is not None and job.spec.study and not axis_problems:
        points = _expand_study(data, job, positions, environ, problems)
    if problems:
        problems.sort(key=lambda p: (p.line is None, p.line or 0, p.column or 0))  # file order
        raise SpecError(str(source), problems, hint="fix the keys above; 'hpctrain schema' lists every key")
    assert job is not None
    return dataclasses.replace(job, points=points)


def _resolve(
    data: dict[str, Any],
    positions: dict,
    overridden: set[str],
    environ: Mapping[str, str] | None,
    source: Path,
    problems: list[SpecProblem],
) -> LoadedJob | None:
    """Model, profile, cross-field checks and sweep of one spec's data; None if it does not resolve."""
    spec: JobSpec | None = None
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        problems += problems_from_validation(exc, positions, JobSpec, overridden)

    profile = _profile_for(data.get("cluster", "local"), environ, positions, problems)
    resolved = None
    if spec is not None and profile is not None:
        resolved = absolute_paths(apply_profile(spec, profile), Path.cwd())
        resolved_problems = check_resolved(resolved, profile)
        if resolved.study:  # every point sets these itself and is checked with its own values
            resolved_problems = [p for p in resolved_problems if p.key not in resolved.study]
        problems += [_positioned(p, positions) for p in resolved_problems]
    trials: list[JobSpec] = []
    params: list[dict[str, Any]] = []
    if resolved is not None and resolved.sweep and not _sweep_fits(resolved, profile, positions, problems):
        pass  # too many trials to expand, let alone submit
    elif resolved is not None and resolved.sweep:
        trials, params = _expand_sweep(data, resolved, profile, positions, problems)  # type: ignore[arg-type]
    if resolved is None or profile is None:
        return None
    if not resolved.sweep:
        trials, params = [resolved], [{}]
    return LoadedJob(resolved, profile, source, tuple(trials), tuple(params))


def _expand_study(
    data: dict[str, Any], base: LoadedJob, positions: dict, environ: Mapping[str, str] | None, problems: list
) -> tuple[StudyPoint, ...]:
    """Resolve each point as a spec of its own (its resources, world size, global batch and LR)."""
    points = []
    seen = {(p.key, p.message) for p in problems}
    for values in combinations(base.spec.study):
        label = point_label(values)
        point_data = copy.deepcopy(data)
        point_data.pop("study", None)
        for key, value in values.items():
            set_dotted(point_data, key, value)
        found: list[SpecProblem] = []
        job = _resolve(point_data, positions, set(), environ, base.source, found)
        for problem in found:
            if (problem.key, problem.message) in seen:
                continue
            seen.add((problem.key, problem.message))
            key = f"study.{problem.key}" if problem.key in values else problem.key
            problems.append(_positioned(SpecProblem(key, f"{problem.message} (study point {label})"), positions))
        if job is not None:
            points.append(StudyPoint(label, values, job))
    return tuple(points)


def absolute_paths(spec: JobSpec, base: Path) -> JobSpec:
    """Paths in a spec are relative to where ``hpctrain`` runs; tasks start
    elsewhere, so the resolved spec carries absolute paths."""

    def absolute(path: str | None) -> str | None:
        if path is None:
            return None
        expanded = Path(path).expanduser()
        return str(expanded if expanded.is_absolute() else (base / expanded).resolve())

    return spec.model_copy(
        update={
            "output_dir": absolute(spec.output_dir),
            "data": spec.data.model_copy(update={"root": absolute(spec.data.root)}),
            "trainer": spec.trainer.model_copy(update={"weights": absolute(spec.trainer.weights)}),
        }
    )


def _profile_for(
    name: Any, environ: Mapping[str, str] | None, positions: dict, problems: list
) -> ClusterProfile | None:
    if not isinstance(name, str):
        return None  # already reported by the model
    env = dict(environ) if environ is not None else None
    try:
        return load_profile(name, env)
    except KeyError:
        where = config_dir(env) / "clusters" / f"{name}.yaml"
        problems.append(
            _positioned(
                SpecProblem(
                    "cluster",
                    f"unknown cluster profile {name!r}; available: {', '.join(available_profiles(env))} "
                    f"(or add your own as {where})",
                ),
                positions,
            )
        )
        return None


def _positioned(problem: SpecProblem, positions: dict[str, tuple[int, int]]) -> SpecProblem:
    return SpecProblem(problem.key, problem.message, *position_of(problem.key, positions))


def check_resolved(spec: JobSpec, profile: ClusterProfile) -> list[SpecProblem]:
    """Cross-field checks that need the profile applied. Pure: spec in, problems out."""
    problems: list[SpecProblem] = []
    res, trainer = spec.resources, spec.trainer
    gpus = res.gpus_per_node or 0
    if profile.max_gpus_per_node is not None and gpus > profile.max_gpus_per_node:
        problems.append(
            SpecProblem(
                "resources.gpus_per_node",
                (
                    f"{gpus} GPUs per node, but '{profile.name}' nodes have {profile.max_gpus_per_node}; "
                    f"use at most {profile.max_gpus_per_node} and add nodes instead"
                ),
            )
        )
    if profile.max_time is not None and res.time_s > parse_time_limit(profile.max_time):
        problems.append(
            SpecProblem(
                "resources.time",
                (
                    f"{res.time} exceeds the '{profile.name}' limit of {profile.max_time}; "
                    "Slurm would reject the job (resume handles longer runs: see docs/preemption.md)"
                ),
            )
        )
    if spec.signals.signal_delay_s >= res.time_s:
        problems.append(
            SpecProblem(
                "signals.signal_delay_s",
                (f"{spec.signals.signal_delay_s} s warning is not shorter than the time limit {res.time}"),
            )
        )
    problems += node_loss_problems(spec)
    problems += node_health_problems(spec)
    if spec.entrypoint is None:
        problems += _check_trainer(spec, gpus)
        if spec.data.root is None:
            problems.append(
                SpecProblem(
                    "data.root",
                    (
                        f"required: cluster profile '{profile.name}' has no default data root; "
                        "point it at an ImageFolder (make a small one with 'hpctrain make-dataset DIR')"
                    ),
                )
            )
    if spec.data.val_resize < spec.data.image_size:
        problems.append(
            SpecProblem(
                "data.val_resize",
                (
                    f"{spec.data.val_resize} is smaller than data.image_size {spec.data.image_size}: validation "
                    f"crops would not fit; set it to at least {spec.data.image_size} (the reference uses 256 for 224, "
                    f"i.e. {round(spec.data.image_size * 256 / 224)})"
                ),
            )
        )
    per_gpu = traits(trainer.strategy)
    per_gpu_fixed = per_gpu.tasks_per_node == "per-gpu" and per_gpu.tasks_per_node_fixed
    if gpus and per_gpu_fixed and spec.entrypoint is None and res.tasks_per_node not in (None, gpus):
        problems.append(
            SpecProblem(
                "resources.tasks_per_node",
                (f"{trainer.strategy} runs one task per GPU: set it to gpus_per_node ({gpus}) or remove it"),
            )
        )
    if spec.data.root is not None:
        data_root = Path(spec.data.root).expanduser().resolve()
        output = Path(spec.output_dir).expanduser().resolve()
        if output == data_root or data_root in output.parents:
            problems.append(
                SpecProblem(
                    "output_dir",
                    (
                        f"{spec.output_dir} is inside data.root {spec.data.root}; the dataset is shared and "
                        "read-only to us: write runs elsewhere, e.g. ~/hpctrain-runs"
                    ),
                )
            )
    return problems


def _check_trainer(spec: JobSpec, gpus: int) -> list[SpecProblem]:
    problems = []
    trainer, nodes = spec.trainer, spec.resources.nodes
    if trainer.arch not in ARCH_PARAMS_M:
        problems.append(SpecProblem("trainer.arch", unknown_arch_message(trainer.arch)))
    if trainer.desired_acc is not None and trainer.desired_acc <= 1:
        percent = f"{trainer.desired_acc * 100:g}"
        problems.append(
            SpecProblem(
                "trainer.desired_acc",
                (
                    f"is a percentage, and {trainer.desired_acc:g} % would stop after the first validation; "
                    f"for a top-1 of {percent} % write desired_acc: {percent}"
                ),
            )
        )
    found = traits(trainer.strategy)
    if found.tasks_per_node == "one" and found.tasks_per_node_fixed and spec.tasks_per_node != 1:
        problems.append(
            SpecProblem(
                "resources.tasks_per_node",
                (
                    f"{trainer.strategy} runs one task per node that drives all its GPUs, not {spec.tasks_per_node}; "
                    "remove tasks_per_node, or use strategy: ddp for one task per GPU"
                ),
            )
        )
    if found.refused:
        problems.append(SpecProblem("trainer.strategy", f"'{trainer.strategy}': {horovod_refusal()}"))
    if trainer.dp_parallel_loss and not found.parallel_loss:
        problems.append(
            SpecProblem(
                "trainer.dp_parallel_loss",
                (
                    f"computes the loss per GPU inside DataParallel, which strategy '{trainer.strategy}' does not "
                    "use; set trainer.strategy: dp, or remove dp_parallel_loss"
                ),
            )
        )
    if found.one_process and spec.world_size > 1:
        problems.append(
            SpecProblem(
                "trainer.strategy",
                (
                    f"'{trainer.strategy}' runs one process, but the resources give {spec.world_size} tasks; "
                    "use 'ddp', or nodes: 1 with one task"
                ),
            )
        )
    if spec.launcher == "torchrun" and not found.torchrun:
        problems.append(
            SpecProblem(
                "launcher",
                (
                    f"strategy {trainer.strategy} runs one process per node, which srun starts directly; "
                    "torchrun is for several processes per node: use launcher: srun, or strategy: ddp"
                ),
            )
        )
    named = f"'{trainer.strategy}'"
    if found.cpu_only and gpus:
        problems.append(SpecProblem("trainer.strategy", f"{named} {found.cpu_only}; set resources.gpus_per_node: 0"))
    if found.one_node and nodes > 1:
        problems.append(SpecProblem("trainer.strategy", f"{named} shares memory on one node; use nodes: 1"))
    if trainer.strategy == "ps":
        problems.extend(_check_ps(spec, gpus))
    if not gpus and spec.data.decode in ("gpu", "dali"):
        problems.append(
            SpecProblem(
                "data.decode",
                (
                    f"'{spec.data.decode}' decodes on the GPU but this job has none (resources.gpus_per_node: 0); "
                    "use 'cpu' or 'auto', or ask for GPUs"
                ),
            )
        )
    if trainer.compile and (not found.compiles or trainer.precision in APEX_LEVELS):
        what = f"strategy {trainer.strategy}" if not found.compiles else "Apex precision"
        problems.append(
            SpecProblem(
                "trainer.compile",
                (
                    f"torch.compile does not work with {what} (hogwild forks workers, dp replicates the model, "
                    "Apex patches it); set trainer.compile: false, or use ddp/single with fp32, bf16 or fp16"
                ),
            )
        )
    problems += check_layer_split(spec)
    if not gpus and (trainer.precision == "fp16" or trainer.precision in APEX_LEVELS):
        problems.append(
            SpecProblem(
                "trainer.precision",
                (f"{trainer.precision} needs CUDA GPUs but this job has none; use bf16 (or fp32) on CPU"),
            )
        )
    return problems


def _check_ps(spec: JobSpec, gpus: int) -> list[SpecProblem]:
    """A parameter-server job needs a worker besides its servers; it runs on CPU in fp32 or bf16."""
    problems = []
    servers, world = spec.trainer.ps.servers, spec.world_size
    if world <= servers:
        problems.append(
            SpecProblem(
                "trainer.ps.servers",
                (
                    f"{servers} server(s) but the job has {world} task(s), so no task is left to be a worker; "
                    f"give it at least {servers + 1} tasks (resources.nodes x resources.tasks_per_node) "
                    "or fewer servers"
                ),
            )
        )
    if spec.trainer.precision == "fp16" or spec.trainer.precision in APEX_LEVELS:
        problems.append(SpecProblem("trainer.precision", "'ps' trains in fp32 or bf16 (the servers apply plain SGD)"))
    if spec.trainer.ps.mode == "sync" and spec.trainer.ps.max_staleness is not None:
        problems.append(
            SpecProblem(
                "trainer.ps.max_staleness",
                "only applies to trainer.ps.mode: async (sync workers always push fresh gradients); remove it",
            )
        )
    return problems


def sweep_size(sweep: Mapping[str, list[Any]]) -> int:
    return math.prod(len(values) for values in sweep.values())


def _sweep_fits(spec: JobSpec, profile: ClusterProfile, positions: dict, problems: list[SpecProblem]) -> bool:
    """A sweep is one Slurm array: refuse it before expanding when Slurm would refuse the array."""
    count = sweep_size(spec.sweep)
    if count <= 1:
        return True
    from hpctrain.contract import slurm  # only sweeps need it (and only sweeps on Slurm ask the cluster)

    limit = slurm.max_array_size() if profile.scheduler == "slurm" else slurm.DEFAULT_MAX_ARRAY_SIZE
    if count <= limit:
        return True
    sizes = " x ".join(str(len(values)) for values in spec.sweep.values())
    where = "Slurm's MaxArraySize here" if profile.scheduler == "slurm" else "Slurm's default MaxArraySize"
    problems.append(
        _positioned(
            SpecProblem(
                "sweep",
                f"{sizes} = {count:,} combinations, but {where} allows {limit:,} array tasks; "
                "sweep fewer values, or split the grid into several specs",
            ),
            positions,
        )
    )
    return False


def _expand_sweep(
    data: dict[str, Any], base: JobSpec, profile: ClusterProfile, positions: dict, problems: list[SpecProblem]
) -> tuple[list[JobSpec], list[dict[str, Any]]]:
    keys = list(base.sweep)
    trials, params = [], []
    seen = set(check_resolved(base, profile))  # already reported for the base spec
    for values in itertools.product(*(base.sweep[k] for k in keys)):
        combo = dict(zip(keys, values))
        trial_data = copy.deepcopy(data)
        trial_data.pop("sweep", None)
        for key, value in combo.items():
            try:
                set_dotted(trial_data, key, value)
            except SpecError:
                problems.append(_positioned(SpecProblem(f"sweep.{key}", "does not name a spec key"), positions))
                return [], []
        try:
            trial = absolute_paths(apply_profile(JobSpec.model_validate(trial_data), profile), Path.cwd())
        except ValidationError as exc:
            for problem in problems_from_validation(exc, {}, JobSpec):
                problems.append(
                    _positioned(SpecProblem(f"sweep.{problem.key}", f"{problem.message} (value {combo})"), positions)
                )
            return [], []
        # The cross-field checks, per trial: a swept value can break one the base spec passes.
        for problem in check_resolved(trial, profile):
            if problem not in seen:
                seen.add(problem)
                problems.append(
                    _positioned(SpecProblem(problem.key, f"{problem.message} (sweep trial {combo})"), positions)
                )
        trials.append(trial)
        params.append(combo)
    return trials, params

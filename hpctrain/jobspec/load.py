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
from pydantic import BaseModel, ValidationError

from hpctrain.contract.runfiles import real_path
from hpctrain.errors import SpecError, SpecProblem, UsageError
from hpctrain.jobspec.cross_checks import check_resolved
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.problems import position_of, problems_from_validation
from hpctrain.jobspec.profiles import ClusterProfile, apply_profile, available_profiles, config_dir, load_profile
from hpctrain.jobspec.script_args import fill_sweep
from hpctrain.jobspec.script_checks import is_spec_key
from hpctrain.jobspec.study_axes import check_axes, combinations, point_label
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


@dataclass(frozen=True)
class StudyPoint:
    """One point of a study: its label (and run folder name), its axis values and its resolved job."""

    label: str
    values: dict[str, Any]
    job: LoadedJob


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


def revalidated(job: object) -> LoadedJob:
    """``job`` as ``load_job`` returned it, checked again before it is used: every spec of it (its sweep's
    trials, its study's points) must still pass the model's checks and the cross-field checks.

    A ``LoadedJob`` is a plain object a Python user may change after ``load_job`` -- a dict edited in place
    (``job.spec.env["X"] = ...``), ``model_copy(update=...)``, another object put in its place -- and none of
    that is validated when it happens. ``SpecError`` lists every problem; anything that is not a
    ``LoadedJob`` is a ``UsageError``.
    """
    if not isinstance(job, LoadedJob):
        raise UsageError(
            f"expected a job from hpctrain.load_job(...), got {type(job).__name__}",
            hint="hpctrain.submit(hpctrain.load_job('jobs/x.yaml')) or hpctrain.submit('jobs/x.yaml')",
        )
    problems: list[SpecProblem] = []
    if not isinstance(job.profile, ClusterProfile):
        problems.append(SpecProblem("cluster", f"the job's profile is a {type(job.profile).__name__}"))
    else:
        _recheck(job.profile, ClusterProfile, "cluster profile", problems)
    named = [
        ("", job.spec),
        *((f"sweep trial {i}", trial) for i, trial in enumerate(job.trials) if trial is not job.spec),
    ]
    for point in job.points:
        named += [
            (f"study point {point.label}", spec)
            for spec in {id(s): s for s in (point.job.spec, *point.job.trials)}.values()
        ]
    for where, spec in named:
        checked = _recheck(spec, JobSpec, where, problems)
        if checked is not None and isinstance(job.profile, ClusterProfile):
            problems += [_where(problem, where) for problem in check_resolved(checked, job.profile)]
    if problems:
        unique = list(dict.fromkeys(problems))
        raise SpecError(
            str(job.source), unique, hint="the job was changed after load_job; load the spec again, or fix it"
        )
    return job


def _recheck(value: object, model: type[BaseModel], where: str, problems: list[SpecProblem]) -> Any:
    """``value`` validated afresh as ``model`` (from its own fields), or None with the problems added."""
    if not isinstance(value, model):
        problems.append(SpecProblem("", f"{where or 'the spec'} is a {type(value).__name__}, not a {model.__name__}"))
        return None
    try:
        return model.model_validate(value.model_dump())
    except ValidationError as exc:
        problems += [_where(problem, where) for problem in problems_from_validation(exc, {}, model)]
        return None


def _where(problem: SpecProblem, where: str) -> SpecProblem:
    return problem if not where else SpecProblem(problem.key, f"{problem.message} ({where})")


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
        return str(expanded if expanded.is_absolute() else real_path(base / expanded))

    update: dict[str, Any] = {
        "output_dir": absolute(spec.output_dir),
        "data": spec.data.model_copy(update={"root": absolute(spec.data.root)}),
        "trainer": spec.trainer.model_copy(update={"weights": absolute(spec.trainer.weights)}),
    }
    if spec.script is not None:
        workdir = spec.script.workdir
        if workdir and not workdir.startswith("{"):  # '{run_dir}/x' is absolute once filled; '' is refused
            workdir = absolute(workdir)
        update["script"] = spec.script.model_copy(update={"path": absolute(spec.script.path), "workdir": workdir})
    return spec.model_copy(update=update)


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


def sweep_size(sweep: Mapping[str, list[Any]]) -> int:
    return math.prod(len(values) for values in sweep.values())


def _sweep_fits(spec: JobSpec, profile: ClusterProfile, positions: dict, problems: list[SpecProblem]) -> bool:
    """A sweep is one Slurm array: refuse it before expanding when Slurm would refuse the array."""
    count = sweep_size(spec.sweep)
    if count <= 1:
        return True
    from hpctrain.contract.slurm import DEFAULT_MAX_ARRAY_SIZE, Slurm  # only sweeps need it (and only on Slurm ask)

    limit = Slurm().max_array_size() if profile.scheduler == "slurm" else DEFAULT_MAX_ARRAY_SIZE
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
            if base.script is not None and not is_spec_key(key):
                continue  # a parameter of the script: it fills {sweep.KEY}, not the spec
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
        if trial.script is not None:  # {sweep.KEY} becomes the trial's value: its spec.yaml shows its arguments
            script = trial.script
            workdir = fill_sweep(script.workdir, combo) if script.workdir is not None else None
            filled = {"args": [fill_sweep(arg, combo) for arg in script.args], "workdir": workdir}
            trial = trial.model_copy(update={"script": script.model_copy(update=filled)})
        # The cross-field checks, per trial: a swept value can break one the base spec passes.
        for problem in check_resolved(trial, profile):
            if problem.key.startswith("script.") and "{sweep." in problem.message:
                continue  # a {sweep.KEY} the sweep does not fill: reported once, for the base spec
            if problem not in seen:
                seen.add(problem)
                problems.append(
                    _positioned(SpecProblem(problem.key, f"{problem.message} (sweep trial {combo})"), positions)
                )
        trials.append(trial)
        params.append(combo)
    return trials, params

"""The checks a spec passes once its cluster profile is applied: one small rule each, in two tables.

Each rule is a pure function ``(spec, profile) -> problems`` that says one
thing, with the key to change and what to write there. :data:`RESOLVED_CHECKS`
holds what every job must pass (its time, GPUs, node loss, data, output);
:data:`TRAINER_CHECKS` what a job of the built-in trainer must pass on top
(strategy, precision, decode, compile, layer split, parameter servers), run
by :func:`trainer_rules` in its place in the first table. :func:`check_resolved`
runs them in table order, which is the order a user reads the problems in.
``load.py`` calls it for the spec, each sweep trial and each study point;
``revalidated`` calls it again for a job changed after ``load_job``. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from hpctrain.contract.runfiles import real_path
from hpctrain.errors import SpecProblem
from hpctrain.jobspec.archs import ARCH_PARAMS_M, unknown_arch_message
from hpctrain.jobspec.chain_checks import chain_problems
from hpctrain.jobspec.horovod import horovod_refusal
from hpctrain.jobspec.layer_split import check_layer_split
from hpctrain.jobspec.models import APEX_LEVELS, JobSpec
from hpctrain.jobspec.node_health import node_health_problems
from hpctrain.jobspec.node_loss import node_loss_problems
from hpctrain.jobspec.profiles import ClusterProfile
from hpctrain.jobspec.script_checks import script_problems
from hpctrain.jobspec.slurm_time import parse_time_limit
from hpctrain.jobspec.strategy_traits import traits
from hpctrain.jobspec.tracking_checks import tracking_problems

Check = Callable[[JobSpec, ClusterProfile], Iterable[SpecProblem]]


def check_resolved(spec: JobSpec, profile: ClusterProfile) -> list[SpecProblem]:
    """Every cross-field problem of ``spec`` under ``profile``. Pure: spec in, problems out."""
    return [problem for check in RESOLVED_CHECKS for problem in check(spec, profile)]


def _gpus(spec: JobSpec) -> int:
    return spec.resources.gpus_per_node or 0


# ------------------------------------------------------------------ every job


def chains_fit(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    return chain_problems(spec)


def gpus_fit_a_node(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    limit, gpus = profile.max_gpus_per_node, _gpus(spec)
    if limit is not None and gpus > limit:
        yield SpecProblem(
            "resources.gpus_per_node",
            f"{gpus} GPUs per node, but '{profile.name}' nodes have {limit}; use at most {limit} and add nodes instead",
        )


def time_fits_the_cluster(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if profile.max_time is not None and spec.resources.time_s > parse_time_limit(profile.max_time):
        yield SpecProblem(
            "resources.time",
            f"{spec.resources.time} exceeds the '{profile.name}' limit of {profile.max_time}; "
            "Slurm would reject the job (resume handles longer runs: see docs/preemption.md)",
        )


def warning_comes_before_the_limit(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if spec.signals.signal_delay_s >= spec.resources.time_s:
        yield SpecProblem(
            "signals.signal_delay_s",
            f"{spec.signals.signal_delay_s} s warning is not shorter than the time limit {spec.resources.time}",
        )


def time_min_fits_the_time(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    res = spec.resources
    if res.time_min is None:
        return
    shortest = parse_time_limit(res.time_min)
    if shortest > res.time_s:
        yield SpecProblem("resources.time_min", f"{res.time_min} is longer than resources.time {res.time}; lower it")
    elif shortest <= spec.signals.signal_delay_s:
        yield SpecProblem(
            "resources.time_min",
            f"{res.time_min} is not longer than the {spec.signals.signal_delay_s} s warning before the limit: "
            "such a start could not save a checkpoint; raise it",
        )


def node_loss_fits(spec: JobSpec, profile: ClusterProfile) -> list[SpecProblem]:
    return node_loss_problems(spec)


def node_health_fits(spec: JobSpec, profile: ClusterProfile) -> list[SpecProblem]:
    return node_health_problems(spec)


def script_fits(spec: JobSpec, profile: ClusterProfile) -> list[SpecProblem]:
    return script_problems(spec)


def trackers_are_installed(spec: JobSpec, profile: ClusterProfile) -> list[SpecProblem]:
    return tracking_problems(spec)


def data_root_is_given(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if spec.runs_trainer and spec.data.root is None:
        yield SpecProblem(
            "data.root",
            f"required: cluster profile '{profile.name}' has no default data root; "
            "point it at an ImageFolder (make a small one with 'hpctrain make-dataset DIR')",
        )


def validation_crops_fit(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    data = spec.data
    if data.val_resize < data.image_size:
        yield SpecProblem(
            "data.val_resize",
            f"{data.val_resize} is smaller than data.image_size {data.image_size}: validation crops would not "
            f"fit; set it to at least {data.image_size} (the reference uses 256 for 224, i.e. "
            f"{round(data.image_size * 256 / 224)})",
        )


def one_task_per_gpu(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    found, gpus, tasks = traits(spec.trainer.strategy), _gpus(spec), spec.resources.tasks_per_node
    per_gpu_fixed = found.tasks_per_node == "per-gpu" and found.tasks_per_node_fixed
    if gpus and per_gpu_fixed and spec.runs_trainer and tasks not in (None, gpus):
        yield SpecProblem(
            "resources.tasks_per_node",
            f"{spec.trainer.strategy} runs one task per GPU: set it to gpus_per_node ({gpus}) or remove it",
        )


def output_lies_outside_the_data(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if spec.data.root is None:
        return
    data_root = real_path(Path(spec.data.root).expanduser())
    output = real_path(Path(spec.output_dir).expanduser())
    if output == data_root or data_root in output.parents:
        yield SpecProblem(
            "output_dir",
            f"{spec.output_dir} is inside data.root {spec.data.root}; the dataset is shared and read-only to us: "
            "write runs elsewhere, e.g. ~/hpctrain-runs",
        )


# ------------------------------------------------------------------ the built-in trainer


def trainer_rules(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    """The built-in trainer's own rules (:data:`TRAINER_CHECKS`); none for an entry point or a script."""
    if spec.runs_trainer:
        for check in TRAINER_CHECKS:
            yield from check(spec, profile)


def arch_is_known(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if spec.trainer.arch not in ARCH_PARAMS_M:
        yield SpecProblem("trainer.arch", unknown_arch_message(spec.trainer.arch))


def desired_acc_is_a_percentage(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    acc = spec.trainer.desired_acc
    if acc is not None and acc <= 1:
        percent = f"{acc * 100:g}"
        yield SpecProblem(
            "trainer.desired_acc",
            f"is a percentage, and {acc:g} % would stop after the first validation; "
            f"for a top-1 of {percent} % write desired_acc: {percent}",
        )


def one_task_per_node(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    found = traits(spec.trainer.strategy)
    if found.tasks_per_node == "one" and found.tasks_per_node_fixed and spec.tasks_per_node != 1:
        yield SpecProblem(
            "resources.tasks_per_node",
            f"{spec.trainer.strategy} runs one task per node that drives all its GPUs, not {spec.tasks_per_node}; "
            "remove tasks_per_node, or use strategy: ddp for one task per GPU",
        )


def strategy_is_offered(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if traits(spec.trainer.strategy).refused:
        yield SpecProblem("trainer.strategy", f"'{spec.trainer.strategy}': {horovod_refusal()}")


def parallel_loss_needs_dp(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if spec.trainer.dp_parallel_loss and not traits(spec.trainer.strategy).parallel_loss:
        yield SpecProblem(
            "trainer.dp_parallel_loss",
            f"computes the loss per GPU inside DataParallel, which strategy '{spec.trainer.strategy}' does not "
            "use; set trainer.strategy: dp, or remove dp_parallel_loss",
        )


def one_process_strategies_run_alone(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if traits(spec.trainer.strategy).one_process and spec.world_size > 1:
        yield SpecProblem(
            "trainer.strategy",
            f"'{spec.trainer.strategy}' runs one process, but the resources give {spec.world_size} tasks; "
            "use 'ddp', or nodes: 1 with one task",
        )


def torchrun_needs_processes_per_node(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if spec.launcher == "torchrun" and not traits(spec.trainer.strategy).torchrun:
        yield SpecProblem(
            "launcher",
            f"strategy {spec.trainer.strategy} runs one process per node, which srun starts directly; "
            "torchrun is for several processes per node: use launcher: srun, or strategy: ddp",
        )


def cpu_only_strategies_get_no_gpus(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    found = traits(spec.trainer.strategy)
    if found.cpu_only and _gpus(spec):
        yield SpecProblem(
            "trainer.strategy", f"'{spec.trainer.strategy}' {found.cpu_only}; set resources.gpus_per_node: 0"
        )


def one_node_strategies_get_one_node(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if traits(spec.trainer.strategy).one_node and spec.resources.nodes > 1:
        yield SpecProblem("trainer.strategy", f"'{spec.trainer.strategy}' shares memory on one node; use nodes: 1")


def parameter_servers_fit(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    """A parameter-server job needs a worker besides its servers; it runs on CPU in fp32 or bf16."""
    if spec.trainer.strategy != "ps":
        return
    ps, world = spec.trainer.ps, spec.world_size
    if world <= ps.servers:
        yield SpecProblem(
            "trainer.ps.servers",
            f"{ps.servers} server(s) but the job has {world} task(s), so no task is left to be a worker; "
            f"give it at least {ps.servers + 1} tasks (resources.nodes x resources.tasks_per_node) or fewer servers",
        )
    if spec.trainer.precision == "fp16" or spec.trainer.precision in APEX_LEVELS:
        yield SpecProblem("trainer.precision", "'ps' trains in fp32 or bf16 (the servers apply plain SGD)")
    if ps.mode == "sync" and ps.max_staleness is not None:
        yield SpecProblem(
            "trainer.ps.max_staleness",
            "only applies to trainer.ps.mode: async (sync workers always push fresh gradients); remove it",
        )


def gpu_decoding_needs_gpus(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    if not _gpus(spec) and spec.data.decode in ("gpu", "dali"):
        yield SpecProblem(
            "data.decode",
            f"'{spec.data.decode}' decodes on the GPU but this job has none (resources.gpus_per_node: 0); "
            "use 'cpu' or 'auto', or ask for GPUs",
        )


def compile_fits_the_strategy(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    trainer = spec.trainer
    compiles = traits(trainer.strategy).compiles
    if trainer.compile and (not compiles or trainer.precision in APEX_LEVELS):
        what = f"strategy {trainer.strategy}" if not compiles else "Apex precision"
        yield SpecProblem(
            "trainer.compile",
            f"torch.compile does not work with {what} (hogwild forks workers, dp replicates the model, "
            "Apex patches it); set trainer.compile: false, or use ddp/single with fp32, bf16 or fp16",
        )


def layers_split_as_asked(spec: JobSpec, profile: ClusterProfile) -> list[SpecProblem]:
    return check_layer_split(spec)


def gpu_precision_needs_gpus(spec: JobSpec, profile: ClusterProfile) -> Iterator[SpecProblem]:
    precision = spec.trainer.precision
    if not _gpus(spec) and (precision == "fp16" or precision in APEX_LEVELS):
        yield SpecProblem(
            "trainer.precision", f"{precision} needs CUDA GPUs but this job has none; use bf16 (or fp32) on CPU"
        )


# ------------------------------------------------------------------ the tables, in the order a user reads them

RESOLVED_CHECKS: tuple[Check, ...] = (
    gpus_fit_a_node,
    time_fits_the_cluster,
    warning_comes_before_the_limit,
    time_min_fits_the_time,
    node_loss_fits,
    node_health_fits,
    script_fits,
    trainer_rules,
    data_root_is_given,
    validation_crops_fit,
    one_task_per_gpu,
    output_lies_outside_the_data,
    trackers_are_installed,
    chains_fit,
)
TRAINER_CHECKS: tuple[Check, ...] = (
    arch_is_known,
    desired_acc_is_a_percentage,
    one_task_per_node,
    strategy_is_offered,
    parallel_loss_needs_dp,
    one_process_strategies_run_alone,
    torchrun_needs_processes_per_node,
    cpu_only_strategies_get_no_gpus,
    one_node_strategies_get_one_node,
    parameter_servers_fit,
    gpu_decoding_needs_gpus,
    compile_fits_the_strategy,
    layers_split_as_asked,
    gpu_precision_needs_gpus,
)

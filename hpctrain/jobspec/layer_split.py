"""Which torchvision archs can be cut into consecutive stages, and the spec checks for pipeline and model_parallel.

Torch-free, so ``hpctrain validate`` can refuse a bad split on a login node.
A model is cut along its *sequential form*: the top-level children in forward
order (:data:`RECIPES`), with ``nn.Sequential`` children (``layer1``,
``features``, ``classifier``...) expanded into their own children, so a
ResNet-50 has 23 blocks (``conv1 ... layer1.0 ... layer4.2, avgpool, fc``).
Entries in angle brackets are the functional steps of the model's
``forward`` that are no module (``torch.flatten(x, 1)``). The trainer builds
the blocks from this table (``hpctrain.trainer.strategies.splitting``); a unit
test checks every supported arch's sequential form gives the model's output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.errors import SpecProblem
from hpctrain.jobspec.strategy_traits import traits

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec

FLATTEN, RELU, POOL = "<flatten>", "<relu>", "<pool>"  # torch.flatten(x, 1); F.relu; adaptive_avg_pool2d(x, 1)

RECIPES: dict[str, tuple[str, ...]] = {
    "resnet": ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", FLATTEN, "fc"),
    "regnet": ("stem", "trunk_output", "avgpool", FLATTEN, "fc"),
    "vgg": ("features", "avgpool", FLATTEN, "classifier"),
    "alexnet": ("features", "avgpool", FLATTEN, "classifier"),
    "mobilenet_v2": ("features", POOL, FLATTEN, "classifier"),
    "mobilenet_v3": ("features", "avgpool", FLATTEN, "classifier"),
    "efficientnet": ("features", "avgpool", FLATTEN, "classifier"),
    "convnext": ("features", "avgpool", "classifier"),
    "densenet": ("features", RELU, POOL, FLATTEN, "classifier"),
}

# Blocks in each supported arch's sequential form (torchvision 0.29; a unit test checks the cheap ones).
BLOCKS: dict[str, int] = {
    "alexnet": 22, "convnext_base": 12, "convnext_large": 12, "convnext_small": 12, "convnext_tiny": 12,
    "densenet121": 16, "densenet161": 16, "densenet169": 16, "densenet201": 16, "efficientnet_b0": 13,
    "efficientnet_b1": 13, "efficientnet_b2": 13, "efficientnet_b3": 13, "efficientnet_b4": 13,
    "efficientnet_b5": 13, "efficientnet_b6": 13, "efficientnet_b7": 13, "efficientnet_v2_l": 13,
    "efficientnet_v2_m": 13, "efficientnet_v2_s": 12, "mobilenet_v2": 23, "mobilenet_v3_large": 23,
    "mobilenet_v3_small": 19, "regnet_x_16gf": 10, "regnet_x_1_6gf": 10, "regnet_x_32gf": 10, "regnet_x_3_2gf":
    10, "regnet_x_400mf": 10, "regnet_x_800mf": 10, "regnet_x_8gf": 10, "regnet_y_128gf": 10, "regnet_y_16gf":
    10, "regnet_y_1_6gf": 10, "regnet_y_32gf": 10, "regnet_y_3_2gf": 10, "regnet_y_400mf": 10, "regnet_y_800mf":
    10, "regnet_y_8gf": 10, "resnet101": 40, "resnet152": 57, "resnet18": 15, "resnet34": 23, "resnet50": 23,
    "resnext101_32x8d": 40, "resnext101_64x4d": 40, "resnext50_32x4d": 23, "vgg11": 30, "vgg11_bn": 38, "vgg13":
    34, "vgg13_bn": 44, "vgg16": 40, "vgg16_bn": 53, "vgg19": 46, "vgg19_bn": 62, "wide_resnet101_2": 40,
    "wide_resnet50_2": 23,
}  # fmt: skip

# arch-name prefix -> recipe
_FAMILIES = (
    ("resnet", "resnet"),
    ("resnext", "resnet"),
    ("wide_resnet", "resnet"),
    ("regnet_", "regnet"),
    ("vgg", "vgg"),
    ("alexnet", "alexnet"),
    ("mobilenet_v2", "mobilenet_v2"),
    ("mobilenet_v3_", "mobilenet_v3"),
    ("efficientnet_", "efficientnet"),
    ("convnext_", "convnext"),
    ("densenet", "densenet"),
)

SUPPORTED = (
    "resnet*, resnext*, wide_resnet*, regnet_*, vgg*, alexnet, mobilenet_v2/v3, efficientnet_*, convnext_*, densenet*"
)


def family_of(arch: str) -> str | None:
    """The recipe name for ``arch``, or None when hpctrain cannot cut it into stages."""
    for prefix, family in _FAMILIES:
        if arch.startswith(prefix):
            return family
    return None


def unsplittable_message(arch: str, strategy: str) -> str:
    return (
        f"{arch!r} cannot be cut into stages for strategy {strategy} (its forward is not a plain sequence of "
        f"children); supported: {SUPPORTED}"
    )


def check_layer_split(spec: JobSpec) -> list[SpecProblem]:
    """Problems of a pipeline or model_parallel spec (none for other strategies). Pure: spec in, problems out."""
    trainer = spec.trainer
    if trainer.strategy == "pipeline":
        return _check_pipeline(spec)
    if trainer.strategy == "model_parallel":
        return _check_model_parallel(spec)
    return []


def _common(spec: JobSpec, parts: int, split_points: list[str], key: str) -> list[SpecProblem]:
    trainer = spec.trainer
    problems = []
    family = family_of(trainer.arch)
    if family is None:
        problems.append(SpecProblem("trainer.arch", unsplittable_message(trainer.arch, trainer.strategy)))
    elif split_points:
        if len(split_points) != parts - 1:
            problems.append(
                SpecProblem(
                    f"{key}.split_points",
                    f"{len(split_points)} names for {parts} parts; give {parts - 1} (where parts 2..{parts} begin) "
                    "or remove split_points to balance automatically",
                )
            )
        tops = [name for name in RECIPES[family] if not name.startswith("<")]
        unknown = [name for name in split_points if name.split(".")[0] not in tops]
        if unknown:
            problems.append(
                SpecProblem(
                    f"{key}.split_points",
                    f"{', '.join(unknown)} not in {trainer.arch}'s blocks; use {', '.join(tops)} "
                    "(or a child of a sequential one, e.g. layer3.1)",
                )
            )
    blocks = BLOCKS.get(trainer.arch)
    if blocks is not None and parts > blocks:
        problems.append(
            SpecProblem(
                f"{key}.stages" if key.endswith("pipeline") else f"{key}.devices",
                f"{parts} parts, but {trainer.arch} has only {blocks} blocks to cut between; use at most {blocks}",
            )
        )
    if trainer.compile:
        problems.append(
            SpecProblem("trainer.compile", f"not supported with strategy {trainer.strategy}; set it to false")
        )
    if trainer.precision not in ("fp32", "bf16"):
        problems.append(
            SpecProblem(
                "trainer.precision",
                f"{trainer.precision} is not supported with strategy {trainer.strategy} (no loss scaling across "
                "stages); use fp32 or bf16",
            )
        )
    return problems


def _check_pipeline(spec: JobSpec) -> list[SpecProblem]:
    pipeline = spec.trainer.pipeline
    stages, world = pipeline.stages, spec.world_size
    problems = _common(spec, stages, pipeline.split_points, "trainer.pipeline")
    if world % stages:
        problems.append(
            SpecProblem(
                "trainer.pipeline.stages",
                f"{world} tasks (resources.nodes x tasks_per_node) is not a multiple of {stages} stages; use "
                f"{world + stages - world % stages} tasks (stages x data-parallel replicas), or change stages",
            )
        )
    if pipeline.schedule == "1f1b" and pipeline.microbatches < stages:
        problems.append(
            SpecProblem(
                "trainer.pipeline.microbatches",
                f"schedule 1f1b needs at least as many micro-batches as stages ({stages}), not "
                f"{pipeline.microbatches}; raise it, or use schedule: gpipe",
            )
        )
    if spec.trainer.batch_size % pipeline.microbatches:
        problems.append(
            SpecProblem(
                "trainer.pipeline.microbatches",
                f"{pipeline.microbatches} does not divide trainer.batch_size {spec.trainer.batch_size} "
                "(each pipeline splits its batch into equal micro-batches)",
            )
        )
    return problems


def _check_model_parallel(spec: JobSpec) -> list[SpecProblem]:
    mp = spec.trainer.model_parallel
    gpus = spec.resources.gpus_per_node or 0
    devices = mp.devices or gpus
    problems = _common(spec, max(2, devices), mp.split_points, "trainer.model_parallel")
    needs = traits("model_parallel").needs_gpus
    if gpus < needs:
        problems.append(
            SpecProblem(
                "trainer.strategy",
                f"'model_parallel' spreads the layers over at least {needs} GPUs of one task, but "
                f"resources.gpus_per_node is {gpus}; ask for 2 or more, or use strategy: pipeline on CPUs",
            )
        )
    elif mp.devices is not None and mp.devices > gpus:
        problems.append(
            SpecProblem("trainer.model_parallel.devices", f"{mp.devices} GPUs, but the job has {gpus} per node")
        )
    if spec.world_size > 1:
        problems.append(
            SpecProblem(
                "trainer.strategy",
                f"'model_parallel' runs in one task, but the resources give {spec.world_size}; use nodes: 1 "
                "(and no tasks_per_node), or strategy: pipeline for several tasks",
            )
        )
    if mp.split_size is not None and mp.split_size > spec.trainer.batch_size:
        problems.append(
            SpecProblem(
                "trainer.model_parallel.split_size",
                f"{mp.split_size} is larger than trainer.batch_size {spec.trainer.batch_size}",
            )
        )
    return problems

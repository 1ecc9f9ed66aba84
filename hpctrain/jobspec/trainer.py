"""``trainer:``: the built-in ImageNet trainer, with its strategies' own settings (ps, pipeline, model_parallel).

What a strategy is (tasks per node, batch factor, what it refuses) is
``strategy_traits.py``'s; checks across sections (a split that fits the model,
Apex levels, horovod) are ``cross_checks.py``'s, ``layer_split.py``'s and
``horovod.py``'s. Torch-free: login-node commands read it.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from hpctrain.jobspec.fields import BlockNames, safe_path
from hpctrain.jobspec.section import Section

Strategy = Literal["single", "dp", "ddp", "hogwild", "ps", "pipeline", "model_parallel", "horovod"]
Precision = Literal["fp32", "fp16", "bf16", "O0", "O1", "O2", "O3"]
APEX_LEVELS = ("O0", "O1", "O2", "O3")


class Pipeline(Section):
    """``trainer.strategy: pipeline``: consecutive stages of the model in different tasks (see docs/strategies/)."""

    stages: Annotated[
        int,
        Field(
            ge=2,
            le=64,
            description="Stages per pipeline; the job's tasks must be a multiple (tasks / stages = data-parallel "
            "replicas, each pipeline trains on its own shard).",
        ),
    ] = 2
    microbatches: Annotated[
        int, Field(ge=1, le=4096, description="Micro-batches per step; must divide trainer.batch_size.")
    ] = 4
    schedule: Annotated[
        Literal["gpipe", "1f1b"],
        Field(description="gpipe: all forwards, then all backwards; 1f1b: interleaved (less activation memory)."),
    ] = "1f1b"
    balance: Annotated[
        Literal["params", "time"],
        Field(description="How split points are chosen: equal parameter counts, or equal forward+backward time."),
    ] = "params"
    split_points: Annotated[
        BlockNames,
        Field(
            description="Explicit split: the blocks where stages 2, 3, ... begin, e.g. [layer2, layer4] "
            "(stages - 1 names, in forward order); overrides balance."
        ),
    ] = []


class ModelParallel(Section):
    """``trainer.strategy: model_parallel``: one task spreads consecutive layers over its GPUs."""

    devices: Annotated[
        int | None, Field(ge=2, le=64, description="GPUs to spread the layers over. Default: all the task sees.")
    ] = None
    split_size: Annotated[
        int | None,
        Field(
            ge=1,
            description="Micro-batch size for in-process pipelining (the GPUs work on different micro-batches at "
            "once). Default: none, each batch goes through the devices whole.",
        ),
    ] = None
    balance: Annotated[
        Literal["params", "time"],
        Field(description="How split points are chosen: equal parameter counts, or equal forward+backward time."),
    ] = "params"
    split_points: Annotated[
        BlockNames, Field(description="Explicit split: the blocks where devices 2, 3, ... begin; overrides balance.")
    ] = []


class ParameterServer(Section):
    """``trainer.strategy: ps``: the first ``servers`` tasks hold the parameters, the others compute gradients."""

    servers: Annotated[
        int, Field(ge=1, le=1024, description="Server tasks (the first ranks); every other task is a worker.")
    ] = 1
    mode: Annotated[
        Literal["sync", "async"],
        Field(
            description="sync: each server applies the average of all workers' gradients once per step (trains "
            "like ddp); async: each worker's push is applied on arrival."
        ),
    ] = "sync"
    max_staleness: Annotated[
        int | None,
        Field(
            ge=0,
            description="async: a push computed on parameters more than this many updates old is rejected "
            "(not applied; the reply carries fresh parameters). Default: no limit.",
        ),
    ] = None


class Trainer(Section):
    """The built-in ImageNet trainer (ignored when ``entrypoint`` is set)."""

    arch: Annotated[str, Field(description="Any torchvision classification model name.")] = "resnet50"
    weights: Annotated[str | None, Field(description="Local file of initial weights (no downloads).")] = None
    num_classes: Annotated[int | None, Field(ge=2, description="Default: the number of train classes.")] = None
    strategy: Annotated[
        Strategy,
        Field(
            description="single: one device; dp: DataParallel over a node's GPUs; ddp: one process per GPU; "
            "hogwild: CPU processes sharing one model; ps: parameter servers and workers (trainer.ps); "
            "pipeline: consecutive stages in different tasks (trainer.pipeline); model_parallel: one task spreads "
            "the layers over its GPUs (trainer.model_parallel); horovod: refused (does not build here, see "
            "docs/strategies.md)."
        ),
    ] = "ddp"
    hogwild_processes: Annotated[int, Field(ge=1, le=256, description="Worker processes for hogwild.")] = 2
    ps: Annotated[ParameterServer, Field(description="Parameter-server settings (trainer.strategy: ps).")] = (
        ParameterServer()
    )
    pipeline: Pipeline = Pipeline()
    model_parallel: ModelParallel = ModelParallel()
    dp_parallel_loss: Annotated[
        bool,
        Field(
            description="dp only: keep each GPU's outputs on it and compute the loss per GPU (less memory on "
            "GPU 0 for large outputs); same loss and gradients as plain dp. See docs/strategies.md."
        ),
    ] = False
    precision: Annotated[
        Precision,
        Field(
            description="fp32; fp16 (autocast + GradScaler, GPU only); bf16 (autocast); O0-O3: Apex AMP when installed."
        ),
    ] = "fp32"
    channels_last: Annotated[
        bool, Field(description="Use channels-last memory format (faster convolutions on tensor cores).")
    ] = False
    compile: Annotated[
        bool,
        Field(description="torch.compile the model (compiles at the first step; not with hogwild, dp or Apex O0-O3)."),
    ] = False
    epochs: Annotated[int, Field(ge=1, description="Training epochs.")] = 90
    batch_size: Annotated[
        int,
        Field(
            ge=1,
            le=1_048_576,
            description="Per GPU (or per CPU process, per hogwild worker); a dp task loads it x its GPUs.",
        ),
    ] = 256
    lr: Annotated[float, Field(gt=0, description="Base learning rate for a global batch of 256.")] = 0.1
    lr_scaling: Annotated[
        Literal["linear", "none"],
        Field(description="linear: lr x global batch / 256 (Goyal et al.); none: use lr as given."),
    ] = "linear"
    momentum: Annotated[float, Field(ge=0, lt=1, description="SGD momentum.")] = 0.9
    weight_decay: Annotated[float, Field(ge=0, description="SGD weight decay.")] = 1e-4
    no_weight_decay_on_norm: Annotated[
        bool, Field(description="Exempt normalisation layers and biases from weight decay.")
    ] = False
    warmup_epochs: Annotated[
        float, Field(ge=0, description="Linear LR warmup from ~0 over this many epochs (fractions allowed).")
    ] = 0.0
    schedule: Annotated[
        Literal["step", "cosine", "constant"],
        Field(description="step: x step_gamma at each of step_epochs; cosine: to 0 at the last epoch; constant."),
    ] = "step"
    step_epochs: Annotated[
        list[Annotated[int, Field(ge=1)]],
        Field(description="Epochs at which the step schedule multiplies the LR by step_gamma."),
    ] = [30, 60, 80]
    step_gamma: Annotated[float, Field(gt=0, le=1, description="Factor of the step schedule.")] = 0.1
    label_smoothing: Annotated[float, Field(ge=0, lt=1, description="Cross-entropy label smoothing.")] = 0.0
    desired_acc: Annotated[
        float | None, Field(gt=0, le=100, description="Stop once val top-1 (percent) reaches this.")
    ] = None
    evaluate_only: Annotated[
        bool, Field(description="Only validate (the latest checkpoint, or trainer.weights); no training.")
    ] = False
    seed: Annotated[int, Field(description="Seed for model init, data order and augmentation.")] = 0
    deterministic: Annotated[
        bool, Field(description="Deterministic algorithms: a resumed run ends bit-identical to an uninterrupted one.")
    ] = False
    max_steps_per_epoch: Annotated[int | None, Field(ge=1, description="Cap steps per epoch (smoke runs).")] = None
    log_every_steps: Annotated[int, Field(ge=1, description="Log a progress line and metrics every N steps.")] = 10

    @field_validator("weights")
    @classmethod
    def _weights_path(cls, value: str | None) -> str | None:
        return safe_path(value)

    @field_validator("arch")
    @classmethod
    def _arch_is_identifier(cls, value: str) -> str:
        if not re.match(r"^[a-z][a-z0-9_]*$", value):
            raise ValueError("arch must be a torchvision model name such as 'resnet50'")
        return value

    @model_validator(mode="after")
    def _steps_are_increasing(self) -> Trainer:
        if self.step_epochs != sorted(set(self.step_epochs)):
            raise ValueError("trainer.step_epochs must be strictly increasing, e.g. [30, 60, 80]")
        return self

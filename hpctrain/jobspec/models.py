"""The job spec: one typed, validated pydantic model per YAML section.

Field names are part of the user interface (docs, examples and tests rely on
them). Units live in the names (``mem_gb``, ``timeout_s``). Every model
forbids unknown keys so a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hpctrain.jobspec.batch import BatchLayout
from hpctrain.jobspec.fields import (
    CONTAINER_IMAGE_PATTERN,
    CONTAINER_MOUNT_PATTERN,
    CONTAINER_OPTION_PATTERN,
    CONTAINER_PYTHON_PATTERN,
    ENTRYPOINT_PATTERN,
    MODULE_PATTERN,
    NAME_PATTERN,
    BlockNames,
    EnvMap,
    NcclEnvMap,
    ScriptArg,
    SetupLines,
    SlurmExtraMap,
    SweepKey,
    SweepValues,
    check_mem_gb,
    check_script_text,
    check_slurm_word,
    safe_path,
)
from hpctrain.jobspec.slurm_time import ALLOWED_FORMS, parse_time_limit
from hpctrain.jobspec.strategy_traits import traits

Strategy = Literal["single", "dp", "ddp", "hogwild", "ps", "pipeline", "model_parallel", "horovod"]
Precision = Literal["fp32", "fp16", "bf16", "O0", "O1", "O2", "O3"]
Decode = Literal["cpu", "gpu", "dali", "auto"]
APEX_LEVELS = ("O0", "O1", "O2", "O3")


class Section(BaseModel):
    """Shared config: unknown keys are errors; assignments are re-validated."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        str_strip_whitespace=True,
        strict=True,
        allow_inf_nan=False,
        defer_build=True,
    )


class Resources(Section):
    """What to ask Slurm for. ``None`` means "take the cluster profile's value"."""

    nodes: Annotated[int, Field(ge=1, le=4096, description="Number of nodes.")] = 1
    min_nodes: Annotated[
        int | None,
        Field(
            ge=1,
            le=4096,
            description="Fewest nodes to keep training on after a node is lost inside the allocation "
            "(docs/preemption.md). Default: nodes (a lost node needs a spare or a requeue).",
        ),
    ] = None
    spare_nodes: Annotated[
        int,
        Field(
            ge=0,
            le=4096,
            description="Extra nodes held in the allocation to replace a lost node without waiting in the queue "
            "(at most nodes: one spare per training node). The job asks Slurm for nodes + spare_nodes; "
            "validate and --dry-run say both.",
        ),
    ] = 0
    gpus_per_node: Annotated[
        int | None, Field(ge=0, le=64, description="GPUs per node (0 = CPU job). Default: the profile's.")
    ] = None
    tasks_per_node: Annotated[
        int | None,
        Field(
            ge=1,
            le=256,
            description="Slurm tasks per node. Default: one per GPU for ddp, one per node for single/dp/hogwild, "
            "1 on CPU-only nodes.",
        ),
    ] = None
    cpus_per_task: Annotated[int | None, Field(ge=1, le=1024, description="CPUs per task.")] = None
    mem_gb: Annotated[float | None, Field(gt=0, description="Memory per node in GiB (--mem).")] = None
    time: Annotated[str, Field(description=f"Time limit: {ALLOWED_FORMS}.")] = "01:00:00"
    time_min: Annotated[
        str | None, Field(description="Shortest limit to accept (--time-min): backfill may start the job sooner.")
    ] = None
    partition: Annotated[str | None, Field(description="Slurm partition (--partition). Default: the profile's.")] = None
    account: Annotated[str | None, Field(description="Slurm account to charge (--account).")] = None
    qos: Annotated[str | None, Field(description="Slurm quality of service (--qos).")] = None
    constraint: Annotated[str | None, Field(description="Slurm node features (--constraint), e.g. 'v100&ib'.")] = None
    exclusive: Annotated[bool, Field(description="Ask for whole nodes (--exclusive).")] = False
    array_parallelism: Annotated[int, Field(ge=1, description="Max array tasks running at once (sweeps).")] = 64
    slurm_extra: Annotated[
        SlurmExtraMap,
        Field(description="Extra '#SBATCH --KEY=VALUE' lines, e.g. {reservation: myres}."),
    ] = {}

    @field_validator("time", mode="before")
    @classmethod
    def _time_is_slurm_time(cls, value: object) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f"time must be a string such as '24:00:00' ({ALLOWED_FORMS})")
        parse_time_limit(value)
        return str(value)

    @field_validator("time_min", mode="before")
    @classmethod
    def _time_min_is_slurm_time(cls, value: object) -> str | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f"time_min must be a string such as '04:00:00' ({ALLOWED_FORMS})")
        parse_time_limit(value)
        return str(value)

    @field_validator("mem_gb")
    @classmethod
    def _mem_not_zero(cls, value: float | None) -> float | None:
        return check_mem_gb(value)

    @field_validator("partition", "account", "qos", "constraint")
    @classmethod
    def _slurm_word(cls, value: str | None) -> str | None:
        return check_slurm_word(value)

    @property
    def time_s(self) -> int:
        return parse_time_limit(self.time)

    @property
    def fewest_nodes(self) -> int:
        """``min_nodes``, or ``nodes`` when unset."""
        return self.nodes if self.min_nodes is None else self.min_nodes

    @property
    def heals(self) -> bool:
        """The batch step supervises its training steps and survives a lost node (healing/supervisor.py)."""
        return self.fewest_nodes < self.nodes or self.spare_nodes > 0

    @property
    def allocated_nodes(self) -> int:
        """Nodes asked of Slurm: the training nodes plus the spares."""
        return self.nodes + self.spare_nodes


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


MAX_IMAGE_PIXELS = 2**27  # data.max_image_pixels' default: 2.8x ImageNet's largest image (about 48 MP)


class Data(Section):
    """An ImageFolder dataset: ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``."""

    root: Annotated[
        str | None,
        Field(
            description="Dataset root: a folder, or a SquashFS image of it written by `hpctrain pack` (each node "
            "mounts it once; docs/data.md). Default: the profile's data root."
        ),
    ] = None
    train_dir: Annotated[str, Field(description="Training split folder under data.root.")] = "train"
    val_dir: Annotated[str, Field(description="Validation split folder under data.root.")] = "val"
    workers: Annotated[int, Field(ge=0, le=128, description="Data-loader workers per task.")] = 4
    pin_memory: Annotated[bool, Field(description="Pin host memory for faster host-to-GPU copies (GPU jobs only).")] = (
        True
    )
    persistent_workers: Annotated[bool, Field(description="Keep data-loader workers alive between epochs.")] = True
    prefetch_factor: Annotated[int, Field(ge=1, description="Batches each worker loads ahead.")] = 2
    image_size: Annotated[int, Field(ge=8, description="Crop size fed to the model.")] = 224
    val_resize: Annotated[
        int, Field(ge=8, description="Validation images are resized to this, then center-cropped to image_size.")
    ] = 256
    index_cache_dir: Annotated[
        str | None,
        Field(
            description="Folder for the dataset index cache (file list + labels, keyed by the split's path and "
            "folder mtimes), so a requeued job does not walk the tree again. Default: no cache file; rank 0 "
            "still scans once per job and shares the list with every rank."
        ),
    ] = None
    stage: Annotated[
        Literal["none", "node"],
        Field(
            description="node: one task per node copies the dataset to node-local disk (data.stage_dir) with "
            "parallel readers before training (a packed image: as one file, then mounted from there), the "
            "node's other tasks wait, and all read the copy; a complete copy is reused after a requeue. none: "
            "read data.root directly."
        ),
    ] = "none"
    stage_dir: Annotated[
        str | None,
        Field(
            description="Node-local folder for data.stage: node and a packed image's mount; may contain {node} "
            "(the node's name) and $VARS; must exist (never created). Default: the first existing of "
            "$SLURM_TMPDIR, $TMPDIR and /tmp."
        ),
    ] = None
    stage_readers: Annotated[int, Field(ge=1, le=256, description="Parallel file copies while staging.")] = 16
    decode: Annotated[
        Decode,
        Field(
            description="Where JPEGs are decoded and augmented. cpu: the data-loader workers; gpu: workers read "
            "bytes, the task's GPU decodes with nvJPEG (torchvision) and crops/resizes there; dali: an NVIDIA DALI "
            "pipeline on the GPU (pip extra 'dali'), fed by hpctrain's sampler; auto: cpu on CPU jobs, else dali "
            "when installed, else gpu. Crops are the same pure function of (seed, epoch, index) in every mode.",
        ),
    ] = "auto"

    max_image_pixels: Annotated[
        int,
        Field(
            ge=1,
            le=2**34,
            description="Largest image (width x height) a loader decodes; larger ones, and progressive JPEGs "
            "whose coefficients (W x H x components x 2 bytes) exceed 3 bytes x this, are skipped, counted and "
            "named in the log, so one file cannot exhaust a worker's memory. Default 2**27 (134 MP, 16384 x 8192).",
        ),
    ] = MAX_IMAGE_PIXELS

    @field_validator("root", "train_dir", "val_dir")
    @classmethod
    def _paths(cls, value: str | None) -> str | None:
        return safe_path(value)


class Distributed(Section):
    """Process-group settings."""

    backend: Annotated[
        Literal["auto", "nccl", "gloo"], Field(description="auto: NCCL when CUDA is available, gloo otherwise.")
    ] = "auto"
    timeout_s: Annotated[int, Field(ge=10, le=7200, description="Collective timeout.")] = 300
    master_port: Annotated[int | None, Field(ge=1024, le=65535, description="Default: derived from job id.")] = None
    nccl_env: Annotated[NcclEnvMap, Field(description="Extra NCCL_* variables (override defaults).")] = {}
    heartbeat_interval_s: Annotated[
        float, Field(gt=0, le=600, description="How often each rank writes heartbeats/rank-N.json (docs/hangs.md).")
    ] = 10.0
    hang_timeout_s: Annotated[
        int | Literal["auto"] | None,
        Field(
            description="End the job with stack dumps when a rank makes no progress this long; "
            "below timeout_s; auto: 80% of timeout_s; null or 0: off (docs/hangs.md)."
        ),
    ] = "auto"

    @field_validator("hang_timeout_s", mode="before")
    @classmethod
    def _hang_timeout_form(cls, value: object) -> object:
        if value is None or value == "auto" or (type(value) is int and value >= 0):
            return value
        raise ValueError(f"must be whole seconds (>= 0), 'auto', or null/0 to turn the watchdog off (got {value!r})")

    @model_validator(mode="after")
    def _hang_before_timeout(self) -> Distributed:
        hang = self.hang_timeout_s
        if isinstance(hang, int) and hang > 0 and hang >= self.timeout_s:
            raise ValueError(
                f"distributed.hang_timeout_s ({hang}) must be shorter than distributed.timeout_s "
                f"({self.timeout_s}): the collective timeout would end a hung job before the watchdog "
                "could report it; lower hang_timeout_s or raise timeout_s"
            )
        return self

    @property
    def hang_timeout(self) -> float | None:
        """The watchdog's limit in seconds, or None when it is off ("auto": 80% of timeout_s)."""
        if self.hang_timeout_s == "auto":
            return 0.8 * self.timeout_s
        return float(self.hang_timeout_s) if self.hang_timeout_s else None


class Checkpoint(Section):
    """When and how to checkpoint."""

    every_epochs: Annotated[int, Field(ge=1, description="Save a checkpoint every N epochs.")] = 1
    every_steps: Annotated[int | None, Field(ge=1, description="Also save every N optimizer steps.")] = None
    keep_last: Annotated[int, Field(ge=1, description="Keep the newest N checkpoints (plus the best).")] = 2
    keep_best: Annotated[bool, Field(description="Also keep the checkpoint with the best val top-1.")] = True
    async_save: Annotated[bool, Field(description="Snapshot to CPU, then write in the background.")] = True


class Signals(Section):
    """Time-limit and preemption handling."""

    timeout_signal: Annotated[
        Literal["USR1", "USR2"], Field(description="Signal Slurm sends signal_delay_s before the time limit.")
    ] = "USR2"
    signal_delay_s: Annotated[
        int, Field(ge=10, le=3600, description="Seconds before the time limit that Slurm warns the job.")
    ] = 120
    requeue_on_timeout: Annotated[
        bool, Field(description="On the time-limit signal: checkpoint and requeue the job.")
    ] = True
    requeue_on_preemption: Annotated[
        bool, Field(description="On preemption (SIGTERM): checkpoint; Slurm requeues the job.")
    ] = True
    max_requeues: Annotated[int, Field(ge=0, description="Stop requeueing after this many restarts.")] = 100
    crash_loop_attempts: Annotated[
        int,
        Field(
            ge=1,
            le=1000,
            description="A run healing from lost nodes stops as failed after this many consecutive attempts "
            "that end without a newer complete checkpoint.",
        ),
    ] = 3


class Script(Section):
    """Your own training script, run by hpctrain on every rank (or node) instead of the trainer (docs/scripts.md)."""

    model_config = ConfigDict(**{**Section.model_config, "str_strip_whitespace": False})  # arguments stay verbatim

    path: Annotated[
        str | None,
        Field(description="The script file, run as 'python PATH ARGS...' (relative to where you run hpctrain)."),
    ] = None
    module: Annotated[
        str | None,
        Field(pattern=MODULE_PATTERN, description="A module run as 'python -m MODULE ARGS...' instead of a path."),
    ] = None
    args: Annotated[
        list[ScriptArg],
        Field(
            description="The script's arguments, strings, filled per process: {master_addr} {master_port} "
            "{world_size} {rank} {local_rank} {node_rank} {nnodes} {nproc_per_node} {run_dir} {checkpoint_dir} "
            "{restart} {script_dir} and {sweep.KEY}; {{ and }} are literal braces."
        ),
    ] = []
    per: Annotated[
        Literal["rank", "node"],
        Field(
            description="rank: one process per rank (resources.tasks_per_node per node), with the torchrun "
            "environment; node: one process per node that starts its own workers (mp.spawn)."
        ),
    ] = "rank"
    stop_signal: Annotated[
        Literal["TERM", "INT", "USR1"],
        Field(
            description="Sent to the script's process group on a time limit, preemption or cancel; the script "
            "saves and exits (INT raises KeyboardInterrupt in Python)."
        ),
    ] = "TERM"
    stop_timeout_s: Annotated[
        int | None,
        Field(
            ge=1,
            le=86400,
            description="Seconds the script has to exit after the stop signal before its processes are killed. "
            "Default: signal_delay_s - 15 on the time-limit warning; on preemption the partition's GraceTime - 5 "
            "(read at submit), else until Slurm ends the job.",
        ),
    ] = None
    workdir: Annotated[
        str | None,
        Field(
            description="The script's working directory (created if missing; placeholders allowed). Default: the "
            "run directory, so a relative checkpoint path survives requeues."
        ),
    ] = None
    silence_timeout_s: Annotated[
        int | None,
        Field(
            ge=0,
            le=604800,
            description="End the job as hung when a process's script writes no output (and no hpctrain heartbeat) "
            "for this long; null or 0: off. For scripts that use neither hpctrain.task nor heartbeats.",
        ),
    ] = None

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return safe_path(value)

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None) -> str | None:
        return check_script_text(safe_path(value)) if value is not None else None

    @model_validator(mode="after")
    def _one_program(self) -> Script:
        if (self.path is None) == (self.module is None):
            raise ValueError(
                "script needs exactly one of path (a file: python PATH) or module (python -m MODULE)"
                + ("; remove one" if self.path else "")
            )
        return self

    @property
    def program(self) -> str:
        """What the spec runs, as a person would name it."""
        return self.path if self.path is not None else f"-m {self.module}"


class BurnIn(Section):
    """Probes at the start of every multi-node training step; a node worse than the others is taken out."""

    enabled: Annotated[
        bool,
        Field(
            description="Run the burn-in at the start of every training step on more than one node (first start, "
            "each requeue, each relaunch after a lost node; a script: before the script starts; not under "
            "launcher: torchrun); false: off (docs/node-health.md)."
        ),
    ] = True
    budget_s: Annotated[
        float,
        Field(ge=2, le=300, description="Upper bound on the probes' time, seconds (start-up not counted)."),
    ] = 20.0
    margin: Annotated[
        float,
        Field(
            ge=1.1,
            le=100,
            description="A node is flagged when its compute or read score is worse than the median of the other "
            "nodes' by this factor (and by mad_k robust deviations).",
        ),
    ] = 1.5
    network_margin: Annotated[
        float,
        Field(
            ge=1.1,
            le=100,
            description="The same factor for the pairwise all-reduce: link bandwidth varies more between healthy "
            "nodes than compute does (traffic of other jobs on shared switches), a degraded link is 2x or worse.",
        ),
    ] = 2.0
    mad_k: Annotated[
        float,
        Field(
            ge=1,
            le=1000,
            description="How many median absolute deviations (x 1.4826) of the other nodes a flagged score must "
            "also lie beyond.",
        ),
    ] = 6.0


class Eviction(Section):
    """A node that stays slower than the others during training is taken out, as a lost node is."""

    enabled: Annotated[
        bool | Literal["auto"],
        Field(
            description="auto: on when the job can go on without a node (resources.spare_nodes, or min_nodes < "
            "nodes); true asks for it (a spec error without either); false: off."
        ),
    ] = "auto"
    margin: Annotated[
        float,
        Field(
            ge=1.1,
            le=100,
            description="Slow: the node's median forward time is more than this factor of the other nodes' median.",
        ),
    ] = 1.5
    window_s: Annotated[
        float,
        Field(ge=5, le=86400, description="How long a node must stay the slowest by the margin before it is evicted."),
    ] = 120.0
    min_steps: Annotated[
        int,
        Field(ge=1, le=100000, description="Steps each rank of a training step must have timed before any verdict."),
    ] = 10


class Health(Section):
    """Sick nodes, not only dead ones: burn-in, slow-node eviction, the bad-node ledger (docs/node-health.md)."""

    burn_in: Annotated[BurnIn, Field(description="Probes before training on every multi-node step.")] = BurnIn()
    eviction: Annotated[Eviction, Field(description="Slow-node eviction during training.")] = Eviction()
    ledger_days: Annotated[
        float,
        Field(
            ge=0,
            le=365,
            description="How long a node this run flags or loses stays in your bad-node ledger (submit excludes it; "
            "'hpctrain nodes'); 0: the run adds nothing to the ledger.",
        ),
    ] = 7.0


# Flags hpctrain writes itself, per runtime -> the spec key that sets them.
OWNED_CONTAINER_FLAGS: dict[str, dict[str, str]] = {
    "apptainer": {"--bind": "container.mounts", "-B": "container.mounts", "--pwd": "the submit directory"},
    "pyxis": {
        "--container-image": "container.image",
        "--container-mounts": "container.mounts",
        "--container-workdir": "the submit directory",
    },
}


class Container(Section):
    """Run every task inside a container image; requeue decisions stay outside it."""

    runtime: Annotated[
        Literal["pyxis", "apptainer"],
        Field(description="pyxis/enroot ('srun --container-image') or Apptainer/Singularity ('apptainer exec')."),
    ]
    image: Annotated[
        str,
        Field(
            pattern=CONTAINER_IMAGE_PATTERN,
            description="pyxis: an image reference (nvcr.io#nvidia/pytorch:24.05-py3) or a .sqsh file; "
            "apptainer: a .sif file or a docker:// reference.",
        ),
    ]
    mounts: Annotated[
        list[Annotated[str, Field(pattern=CONTAINER_MOUNT_PATTERN)]],
        Field(
            description="Extra bind mounts SRC[:DST[:ro]]; output_dir, data.root and the submit directory "
            "are mounted at their own paths always."
        ),
    ] = []
    python: Annotated[
        str,
        Field(
            pattern=CONTAINER_PYTHON_PATTERN,
            description="The interpreter inside the image (hpctrain and torch must be installed there).",
        ),
    ] = "python3"
    options: Annotated[
        list[Annotated[str, Field(pattern=CONTAINER_OPTION_PATTERN)]],
        Field(
            description="Extra runtime flags, one per entry, a value joined with '=': apptainer exec's "
            "(--nv, --no-privs, --writable-tmpfs, --drop-caps=CAP_SYS_RESOURCE) or pyxis's srun "
            "--container-* flags (--container-remap-root, --no-container-mount-home)."
        ),
    ] = []

    @model_validator(mode="after")
    def _options_fit_the_runtime(self) -> Container:
        problems = []
        for flag in (option.split("=", 1)[0] for option in self.options):
            owner = OWNED_CONTAINER_FLAGS[self.runtime].get(flag)
            if owner:
                problems.append(f"{flag} is set by hpctrain from {owner}; set that instead")
            elif self.runtime == "pyxis" and not flag.startswith(("--container-", "--no-container-")):
                problems.append(f"{flag} is not a pyxis flag: pyxis options are srun's --container-* flags")
        if problems:
            raise ValueError("container.options: " + "; ".join(problems))
        return self


class JobSpec(Section):
    """A whole job: what to run, where, and with what resources."""

    name: Annotated[str, Field(pattern=NAME_PATTERN, description="Job name: letters, digits, _ . -")]
    cluster: Annotated[str, Field(description="Cluster profile; 'local' runs on this machine.")] = "local"
    output_dir: Annotated[str, Field(description="Runs go to OUTPUT_DIR/NAME/RUN_ID/.")] = "~/hpctrain-runs"
    entrypoint: Annotated[
        str | None, Field(description="'package.module:function' to call on every rank instead of the trainer.")
    ] = None
    entrypoint_args: Annotated[
        dict[str, object], Field(description="Keyword arguments for the entrypoint function.")
    ] = {}
    script: Annotated[
        Script | None,
        Field(description="Run your own training script on every rank or node (docs/scripts.md); not with entrypoint."),
    ] = None
    setup: Annotated[
        SetupLines, Field(description="Shell lines run before the tasks start, e.g. 'module load cuda'.")
    ] = []
    env: Annotated[EnvMap, Field(description="Environment variables for every task.")] = {}
    launcher: Annotated[
        Literal["srun", "torchrun"],
        Field(
            description="srun: one Slurm task per process; torchrun: one Slurm task per node that starts "
            "torchrun, which starts resources.tasks_per_node processes (docs/launchers.md)."
        ),
    ] = "srun"
    sweep: Annotated[
        dict[SweepKey, SweepValues],
        Field(description="Dotted key -> values; the grid becomes a Slurm array, one task per combination."),
    ] = {}
    study: Annotated[
        dict[str, list[object]],
        Field(
            description="Resource key -> values, e.g. {resources.nodes: [1, 2, 4]}; one Slurm job per combination "
            "(docs/studies-and-reports.md)."
        ),
    ] = {}
    resources: Resources = Resources()
    trainer: Trainer = Trainer()
    data: Data = Data()
    distributed: Distributed = Distributed()
    checkpoint: Checkpoint = Checkpoint()
    signals: Signals = Signals()
    health: Annotated[
        Health, Field(description="Burn-in, slow-node eviction and the bad-node ledger (docs/node-health.md).")
    ] = Health()
    container: Annotated[
        Container | None, Field(description="Run the tasks inside a container image (pyxis or Apptainer).")
    ] = None

    @field_validator("output_dir")
    @classmethod
    def _output_path(cls, value: str) -> str:
        return safe_path(value) or value

    @field_validator("cluster")
    @classmethod
    def _cluster_word(cls, value: str) -> str:
        if not re.match(NAME_PATTERN, value):
            raise ValueError("cluster must be a profile name: letters, digits, _ . -")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, value: str | None) -> str | None:
        if value is not None and not re.match(ENTRYPOINT_PATTERN, value):
            raise ValueError("entrypoint must look like 'package.module:function'")
        return value

    # Derived values used by submission, the runtime and the docs.
    @property
    def tasks_per_node(self) -> int:
        if self.resources.tasks_per_node is not None:
            return self.resources.tasks_per_node
        gpus = self.resources.gpus_per_node or 0
        if self.runs_trainer and traits(self.trainer.strategy).tasks_per_node == "one":
            return 1
        return max(1, gpus)

    @property
    def runs_trainer(self) -> bool:
        """Whether the built-in trainer runs (no entrypoint, no script)."""
        return self.entrypoint is None and self.script is None

    @property
    def one_task_per_node(self) -> bool:
        """One Slurm task per node, which starts the node's processes itself (torchrun, or a script per node)."""
        return self.launcher == "torchrun" or (self.script is not None and self.script.per == "node")

    @property
    def slurm_tasks_per_node(self) -> int:
        """Slurm tasks per node: one per process, or one per node (``one_task_per_node``)."""
        return 1 if self.one_task_per_node else self.tasks_per_node

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.tasks_per_node

    @property
    def batch_layout(self) -> BatchLayout:
        gpus_per_task = (self.resources.gpus_per_node or 0) // self.tasks_per_node
        return BatchLayout.of(self.trainer, tasks=self.world_size, gpus_per_task=gpus_per_task)

    @property
    def global_batch_size(self) -> int:
        return self.batch_layout.global_batch

    @property
    def uses_gpus(self) -> bool:
        return bool(self.resources.gpus_per_node)

    @property
    def evicts(self) -> bool:
        """Slow nodes are evicted during training (``health.eviction``; auto: when the job can lose a node).
        Never from a script: it reports no forward times."""
        enabled = self.health.eviction.enabled
        if self.script is not None:
            return False
        return self.resources.heals if enabled == "auto" else bool(enabled)

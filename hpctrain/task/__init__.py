"""hpctrain.task: what your own training loop needs to resume exactly under hpctrain (docs/your-own-loop.md).

The public face of the task side, for a function entry point
(``entrypoint: pkg.mod:main``), a script hpctrain runs (``script:``), or plain
Python outside hpctrain (where it does the obvious local thing)::

    from hpctrain import task

    task.init_process_group()                 # every rank in one group (formed from torchrun's variables)
    info = task.context()                     # rank, world_size, local_rank, device, run_dir, checkpoint_dir, ...
    model = task.ddp(model)                   # DDP that resumes bit for bit
    loader = task.ElasticLoader(dataset, batch_size=64, num_workers=4)
    ckpt = task.Checkpointer(model=model, optimizer=optimizer, scheduler=scheduler, data=loader, every_steps=200)
    start = ckpt.load()                       # the step to continue from; 0 on a fresh run
    for step, batches in loader.steps(start, total_steps):
        if task.should_stop():                # agreed by every rank at this step
            ckpt.save(step)
            return task.stopped()
        for x, y in task.accumulate(model, batches):
            loss = loss_fn(model(x), y) / len(batches)
            loss.backward()
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
        task.step(step + 1)                   # heartbeat: hang watchdog, status --watch --ranks
        task.log(step + 1, loss=loss.item())  # metrics.jsonl: status --watch, hpctrain report
        ckpt.maybe_save(step + 1)

What it owns, by module:

* ``session``: who this process is (:func:`context`), from the launcher's
  registered context, a script's environment (``contract/script_env.py``) or
  the local defaults; starts a script's heartbeat thread and stop signal;
* ``process_group``: :func:`init_process_group`, one group of every rank the
  launcher started; the collective parts form it first, so a rank never
  trains alone under ``torchrun`` without it;
* ``stop``: the agreed stop flag (:func:`should_stop`, :func:`stopped`);
* ``reporting``: :func:`log` into metrics.jsonl, :func:`set_summary`, and the
  heartbeat calls :func:`step`, :func:`phase`, :func:`beat`;
* ``checkpointer`` (with ``parts``, ``checkpoint_check``, ``dcp_io``,
  ``group``): :class:`Checkpointer`, torch.distributed.checkpoint folders that
  are complete or ignored, resharded on load, never unpickled blindly;
* ``data`` (with ``samplers``): :class:`ElasticLoader`, the built-in trainer's
  exact order whose global batches do not depend on the number of ranks,
  :func:`accumulate`, :func:`worker_init`;
* ``parallel``: :func:`ddp`, DistributedDataParallel that sums as it did
  before a resume;
* ``rng``, ``weights``: generator states, :func:`weights_sha256`;
* ``step_timer``: :class:`StepTimer`, where each step's time goes (docs/scaling.md).

The built-in trainer builds on the same pieces (samplers, RNG, weights digest,
and the checkpoint folder life of ``contract/step_folders.py``). The task side
only: ``import hpctrain`` and login-side modules never import this package
(``tests/unit/test_layering.py``), and importing it imports nothing until a
name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpctrain.task.checkpointer import Checkpointer
    from hpctrain.task.data import ElasticLoader, accumulate, worker_init
    from hpctrain.task.parallel import ddp
    from hpctrain.task.process_group import init_process_group
    from hpctrain.task.reporting import beat, log, phase, set_summary, step
    from hpctrain.task.samplers import ExactEvalSampler
    from hpctrain.task.session import TaskInfo, context
    from hpctrain.task.step_timer import StepTimer
    from hpctrain.task.stop import should_stop, stop_reason, stopped
    from hpctrain.task.weights import weights_sha256

_PUBLIC = {
    "context": "session",
    "TaskInfo": "session",
    "should_stop": "stop",
    "stop_reason": "stop",
    "stopped": "stop",
    "log": "reporting",
    "set_summary": "reporting",
    "step": "reporting",
    "phase": "reporting",
    "beat": "reporting",
    "Checkpointer": "checkpointer",
    "ElasticLoader": "data",
    "accumulate": "data",
    "worker_init": "data",
    "ExactEvalSampler": "samplers",
    "ddp": "parallel",
    "init_process_group": "process_group",
    "weights_sha256": "weights",
    "StepTimer": "step_timer",
}
__all__ = [
    "Checkpointer",
    "ElasticLoader",
    "ExactEvalSampler",
    "StepTimer",
    "TaskInfo",
    "accumulate",
    "beat",
    "context",
    "ddp",
    "init_process_group",
    "log",
    "phase",
    "set_summary",
    "should_stop",
    "step",
    "stop_reason",
    "stopped",
    "weights_sha256",
    "worker_init",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'hpctrain.task' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hpctrain.task.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})

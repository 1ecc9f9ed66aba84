"""The trainer's side of checkpoints: which one to continue, restoring it, and saving one.

A part of ``Trainer`` (``trainer.py``, whose ``__init__`` sets every attribute
used here). A resume reads the newest checkpoint twice: first without its
tensors (the meta device), before the data exist, because the run's global
batch is the checkpoint's (``elastic.py``); then, once the model and optimizer
exist, with its tensors checked against them before one is allocated
(``state.py``'s ``check_fields`` and ``state_budget``). Each rank must agree a
checkpoint is usable, or every rank falls back to the previous one. Saving is
collective (RNG states and epoch sums are gathered); only rank 0 writes, in the
background (``checkpoint.py``'s ``CheckpointManager``).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from hpctrain.contract.rundir import RUN_FILE, read_json_object, run_home
from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.node_loss import RUN_MICRO_BATCHES_VAR
from hpctrain.runtime import heartbeat
from hpctrain.runtime.stop import all_reduce_max
from hpctrain.trainer.checkpoint_archive import tensor_bytes
from hpctrain.trainer.elastic import run_micro_batches
from hpctrain.trainer.state import (
    RunShape,
    Stateful,
    check_fields,
    checkpoint_payload,
    recorded_micro_batches,
    restore_parts,
    state_budget,
)

log = logging.getLogger("hpctrain.trainer.trainer")  # the trainer's log lines keep their logger's name


class Checkpointing:
    """``Trainer``'s checkpoints (mixed into it)."""

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The newest checkpoint whose fields fit this run, if a resume is due, read without its tensors (the
        meta device: nothing is allocated before the model exists, see :meth:`resume`); fixes the run's
        micro-batches per step. A checkpoint whose fields do not fit is skipped for the previous one."""
        if self.cfg.evaluate_only and self.cfg.weights:
            return None  # evaluate exactly the weights asked for (build_model loads them)
        shape = self._run_shape(micro_batches=self._micro_batches_on_record())
        state = self.checkpoints.load(
            map_location="meta", check=lambda state, meta: check_fields(state, meta, shape), agree=_all_agree
        )
        if state is not None and not self.cfg.evaluate_only:
            self.micro_batches = run_micro_batches(
                state,
                processes=self.layout.processes,
                world_size=self.env.world_size,
                strategy=self.strategy.name,
                source=self.checkpoints.last_loaded,
            )
            self.reporter.static["global_batch_size"] = self.global_batch
        return state

    def resume(self) -> None:
        """Continue from the newest complete checkpoint in the run directory, if there is one."""
        if self.cfg.evaluate_only and self.cfg.weights:
            return  # evaluate exactly the weights asked for (build_model loaded them)
        found, self._checkpoint = self._checkpoint, None
        if found is None:
            if self.cfg.evaluate_only and not self.cfg.weights:
                raise TrainingConfigError(
                    f"trainer.evaluate_only: no trainer.weights and no checkpoint under {self.ctx.checkpoint_dir}",
                    hint="set trainer.weights to a local weights file, or evaluate a run directory with checkpoints",
                )
            return
        # now that the data and the model exist: every field against them, and the tensors against what the
        # model and optimizer hold, both before a tensor is allocated; a failing one falls back to the previous
        shape = self._run_shape(micro_batches=self.micro_batches, data=True)
        state = self.checkpoints.load(
            map_location=self.device,
            check=lambda state, meta: check_fields(state, meta, shape),
            max_bytes=self._state_budget(),
            newest=self.checkpoints.last_loaded,
            agree=_all_agree,
        )
        assert state is not None  # a search that skipped every checkpoint raises
        parts = self.checkpoint_parts()
        if self.cfg.evaluate_only:
            parts = {"model": self.module, "progress": self.progress}
        missing = restore_parts(state, parts, source=self.checkpoints.last_loaded)
        if set(missing) - {"rng", "epoch_sums"}:
            log.warning(
                "the checkpoint was written by another strategy than %s: weights and position are restored, "
                "optimizer state starts fresh and a partial epoch restarts from its beginning",
                self.cfg.strategy,
            )
        self._saved_step = self.progress.global_step
        log.info(
            "resumed from %s (epoch %d, step %d)",
            self.checkpoints.last_loaded,
            self.progress.epoch + 1,
            self.progress.step_in_epoch,
        )
        heartbeat.recorder().position(self.progress.global_step, self.progress.epoch)
        if not self.cfg.evaluate_only:
            self.resumed_from, self._partial_epoch = self.checkpoints.last_loaded, True

    def save_checkpoint(self, *, tag: str, metric: float | None = None) -> None:
        """Collective (RNG states and epoch sums are gathered); only rank 0 writes."""
        heartbeat.set_phase("checkpoint")  # a paused phase for the hang watchdog (docs/hangs.md)
        self.strategy.sync_model(self.module)
        state = checkpoint_payload(
            self.checkpoint_parts(),
            world_size=self.env.world_size,
            batch_size=self.layout.per_process,
            micro_batches=self.micro_batches,
            spec=json.dumps(self.ctx.spec.model_dump(mode="json"), sort_keys=True),
        )
        if self.ctx.is_main:
            self.checkpoints.save(
                state, step=self.progress.global_step, epoch=self.progress.epoch, metric=metric, tag=tag
            )
            log.info(
                "checkpoint %s at step %d (blocked %.3f s)",
                tag,
                self.progress.global_step,
                self.checkpoints.last_stall_s,
            )
        self._saved_step = self.progress.global_step

    def checkpoint_parts(self) -> dict[str, Stateful | None]:
        """What a checkpoint holds, part by part, in format version 1's keys and order.

        A strategy that trains in worker processes (hogwild) keeps the optimizers, schedules and data
        positions itself, in its own part; the trainer's are then not saved.
        """
        own = self.workers is None
        parts: dict[str, Stateful | None] = {
            "model": self.module,
            "optimizer": self.optimizer if own else None,
            "scheduler": self.scheduler if own else None,
            "precision": self.precision,
            "sampler": self.sampler_position if own else None,
            "hogwild": None,
        }
        parts.update(self.strategy.state_parts())
        return {**parts, "progress": self.progress, "epoch_sums": self.epoch_sums, "rng": self.rng}

    def _run_shape(self, *, micro_batches: int | None, data: bool = False) -> RunShape:
        """What a checkpoint must fit: the spec and this job's layout, and with ``data`` its steps per epoch."""
        trains = data and self.workers is None and self.strategy.loads_data and not self.cfg.evaluate_only
        return RunShape(
            epochs=None if self.cfg.evaluate_only else self.cfg.epochs,
            per_process=self.layout.per_process,
            processes=self.layout.processes,
            strategy=self.strategy.name,
            micro_batches=micro_batches,
            steps_per_epoch=self.steps_per_epoch if trains and self.steps_per_epoch > 0 else None,
            trains_itself=self.workers is None,
            evaluates_only=self.cfg.evaluate_only,
        )

    def _micro_batches_on_record(self) -> int | None:
        run_info = read_json_object(self.ctx.run_dir / RUN_FILE, within=run_home(self.ctx.run_dir))
        return recorded_micro_batches(os.environ.get(RUN_MICRO_BATCHES_VAR), run_info, self.layout.per_process)

    def _state_budget(self) -> int:
        """The most a checkpoint of this run may hold: the model, its optimizer state (per hogwild worker),
        every rank's RNG states (``trainer/state.py``)."""
        copies = self.cfg.hogwild_processes if self.workers is not None else 1
        return state_budget(
            tensor_bytes(self.module.state_dict())[0], optimizer_copies=copies, world_size=self.env.world_size
        )

    def _reserve_checkpoint_buffers(self) -> None:
        """Allocate the async staging buffers now, so the first checkpoint in the loop only copies."""
        own_optimizer = self.checkpoint_parts()["optimizer"] is not None  # not: hogwild, pipeline
        if not (self.ctx.is_main and self.ctx.spec.checkpoint.async_save and own_optimizer):
            return
        optimizer = self.optimizer.state_dict()
        if not optimizer["state"] and self.cfg.momentum > 0:  # SGD creates its momentum at the first step
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            optimizer["state"] = {i: {"momentum_buffer": p.detach()} for i, p in enumerate(params)}
        self.checkpoints.reserve({"model": self.module.state_dict(), "optimizer": optimizer})


def _all_agree(usable: bool) -> bool:
    """Whether every rank could use a checkpoint (collective when distributed: every rank asks)."""
    return all_reduce_max(0 if usable else 1) == 0

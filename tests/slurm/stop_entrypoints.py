"""Entry points for the stop, clean-up and failure tests (``entrypoint: tests.slurm.stop_entrypoints:NAME``).

The launcher imports them by name on the compute nodes, so they live in a
module, not in a test file (see ``entrypoints.py``).

* ``escape_and_wait``: what leaks under ``proctrack/linuxproc``: a ``setsid -f``
  child re-parented to init and data-loader workers; then it waits for a stop.
* ``train_with_escapee``: the built-in trainer, after the same escape.
* ``train_holding_checkpoint``: the built-in trainer whose rank 0 holds one
  checkpoint write open (temp directory written, not yet renamed), so a test
  can kill it mid-write.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

ENTRYPOINT_MODULE = "tests.slurm.stop_entrypoints"
ESCAPEE_ARGV = ("sleep", "1000")


def spawn_escapee() -> None:
    """Start ``sleep 1000`` in its own session, re-parented to init: Slurm's linuxproc loses track of it."""
    # setsid -f forks and its parent exits at once: the sleep is no descendant of the task.
    subprocess.run(
        ["setsid", "-f", *ESCAPEE_ARGV],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=30,
    )


def escape_and_wait(ctx: Any, workers: int = 2, max_s: float = 600.0) -> dict[str, Any]:
    """Leak an escapee, keep ``workers`` data-loader workers busy, and stop when the ranks agree to."""
    from torch.utils.data import DataLoader

    spawn_escapee()
    loader = DataLoader(list(range(100_000)), batch_size=1, num_workers=workers, persistent_workers=workers > 0)
    deadline = time.monotonic() + max_s
    for _ in loader:
        reason = ctx.stop.agreed()
        if reason is not None:
            return {"status": "stopped", "stop_reason": reason}
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {"status": "completed"}


def train_with_escapee(ctx: Any) -> dict[str, Any]:
    """The built-in trainer on a rank that leaked an escapee first."""
    from hpctrain.trainer.trainer import run_training

    spawn_escapee()
    return run_training(ctx)


def train_holding_checkpoint(ctx: Any, hold_step: int, hold_s: float = 120.0) -> dict[str, Any]:
    """The built-in trainer; on a fresh run, rank 0 holds the write of step ``hold_step`` for ``hold_s``.

    The hold sits just before the temp directory is renamed into place
    (``StepFolders.install``: ``state.pt`` and ``meta.json`` are written),
    the last moment a crash can leave a ``.tmp-step-*`` directory behind. A
    resumed run (a checkpoint exists) saves normally.
    """
    from hpctrain.trainer.checkpoint import step_dir_name
    from hpctrain.trainer.trainer import Trainer

    trainer = Trainer(ctx)
    folders = trainer.checkpoints.folders
    if ctx.is_main and folders.latest() is None:
        install = folders.install

        def held_install(tmp: Any, final: Any) -> None:
            if final.name == step_dir_name(hold_step):
                time.sleep(hold_s)
            install(tmp, final)

        folders.install = held_install  # type: ignore[method-assign]
    return trainer.fit()

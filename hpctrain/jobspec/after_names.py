"""The names of the ``{after.NAME}`` placeholders (docs/chains.md): a leaf, so that the spec's text checks
(``script_args.py``, which ``fields.py`` calls) can know them without importing the ``after:`` section."""

from __future__ import annotations

AFTER_PREFIX = "after."
# What each {after.NAME} is, in the words messages and the docs use.
AFTER_PLACEHOLDERS: dict[str, str] = {
    "run_dir": "the upstream's run directory",
    "checkpoint": "the upstream's final complete checkpoint folder (RUN/checkpoints/step-N)",
    "checkpoint_dir": "the upstream's RUN/checkpoints folder (a script's own checkpoint files)",
    "job_id": "the upstream's last Slurm job id",
    "status": "the upstream's status when this run started (completed, failed, stopped)",
    "global_step": "the upstream summary's global_step",
    "epochs_completed": "the upstream summary's epochs_completed",
    "val_top1": "the upstream summary's val_top1",
    "best_val_top1": "the upstream summary's best_val_top1",
    "val_loss": "the upstream summary's val_loss",
    "train_loss": "the upstream summary's train_loss",
}


def is_after_name(name: str) -> bool:
    """``after.NAME`` of a known NAME."""
    return name.startswith(AFTER_PREFIX) and name[len(AFTER_PREFIX) :] in AFTER_PLACEHOLDERS


def after_known_list() -> str:
    return " ".join(f"{{{AFTER_PREFIX}{name}}}" for name in AFTER_PLACEHOLDERS)

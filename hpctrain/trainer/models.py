"""Build any torchvision classification model by name, optionally from a local weights file.

Nothing is ever downloaded: models are built with ``weights=None`` and initial
weights come only from ``trainer.weights``, read with ``weights_only=True`` so
a weights file cannot run code.

When the weights file's classifier has a different number of classes than the
run (fine-tuning), the classifier keeps its fresh initialisation and every
other layer is loaded; any other shape mismatch is an error.
"""

from __future__ import annotations

import difflib
import logging
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import Trainer
from hpctrain.trainer.checkpoint_archive import ArchiveError, check_archive

log = logging.getLogger(__name__)

# Archs with auxiliary heads: build them without, so the model returns plain logits.
_NO_AUX = {"googlenet", "inception_v3"}
_AUX_PREFIXES = ("aux1.", "aux2.", "AuxLogits.")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / DataParallel, torch.compile


def available_archs() -> list[str]:
    return sorted(torchvision.models.list_models(module=torchvision.models))


def resolve_num_classes(trainer_spec: Trainer, dataset_classes: int) -> int:
    """``trainer.num_classes`` if set (it must cover every label), else the dataset's count."""
    if trainer_spec.num_classes is None:
        return dataset_classes
    if trainer_spec.num_classes < dataset_classes:
        raise TrainingConfigError(
            f"trainer.num_classes: {trainer_spec.num_classes} is fewer than the {dataset_classes} class folders "
            "in the dataset",
            hint=f"remove trainer.num_classes, or set it to at least {dataset_classes}",
        )
    return trainer_spec.num_classes


def build_model(trainer_spec: Trainer, num_classes: int, *, image_size: int | None = None) -> nn.Module:
    """The ``trainer.arch`` model with a ``num_classes`` head, loaded from ``trainer.weights`` if set.

    ``image_size`` is needed only by archs with a fixed input size (vit_*, maxvit_t);
    pass ``data.image_size``.
    """
    arch = trainer_spec.arch
    archs = available_archs()
    if arch not in archs:
        close = difflib.get_close_matches(arch, archs, n=5, cutoff=0.5)
        suggestion = f"did you mean {', '.join(close)}?" if close else f"choose one of: {', '.join(archs)}"
        raise TrainingConfigError(f"trainer.arch: {arch!r} is not a torchvision classification model", suggestion)

    kwargs: dict[str, Any] = {"weights": None, "num_classes": num_classes}
    if arch in _NO_AUX:
        kwargs.update(aux_logits=False, init_weights=True)
    if image_size is not None and arch.startswith("vit_"):
        kwargs["image_size"] = image_size
    if image_size is not None and arch == "maxvit_t":
        kwargs["input_size"] = (image_size, image_size)
    try:
        model = torchvision.models.get_model(arch, **kwargs)
    except (ValueError, AssertionError, RuntimeError) as exc:  # e.g. vit image_size not divisible by patch
        raise TrainingConfigError(
            f"trainer.arch: cannot build {arch} for {num_classes} classes at image size {image_size}: {exc}",
            hint="pick an image size the architecture supports (data.image_size)",
        ) from exc

    if trainer_spec.weights:
        load_weights(model, Path(trainer_spec.weights).expanduser(), num_classes)
    return model


def load_weights(model: nn.Module, path: Path, num_classes: int) -> None:
    """Load a local state_dict (raw, or under "model"/"state_dict") into ``model`` in place."""
    state = _read_state_dict(path)
    own = model.state_dict()
    state = {k: v for k, v in state.items() if not (k not in own and k.startswith(_AUX_PREFIXES))}

    mismatched = [k for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    head = [k for k in mismatched if own[k].ndim >= 1 and own[k].shape[0] == num_classes]
    if mismatched and head == mismatched and len(head) <= 2:
        log.warning(
            "trainer.weights: %s has a %d-class classifier; re-initialising %s for %d classes",
            path,
            state[head[0]].shape[0],
            ", ".join(head),
            num_classes,
        )
        for key in head:
            del state[key]
    elif mismatched:
        details = "; ".join(f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}" for k in mismatched[:4])
        raise TrainingConfigError(
            f"trainer.weights: {path} does not fit this trainer.arch ({len(mismatched)} shape mismatches: {details})",
            hint="use weights saved from the same trainer.arch",
        )

    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if k not in mismatched]
    if missing or result.unexpected_keys:
        raise TrainingConfigError(
            f"trainer.weights: {path} does not match this trainer.arch "
            f"(missing: {missing[:4]}{'...' if len(missing) > 4 else ''}, "
            f"unexpected: {result.unexpected_keys[:4]}{'...' if len(result.unexpected_keys) > 4 else ''})",
            hint="use weights saved from the same trainer.arch (a state_dict, or a checkpoint with a 'model' key)",
        )


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise TrainingConfigError(
            f"trainer.weights: {path} does not exist", hint="give a local file; hpctrain never downloads weights"
        )
    if zipfile.is_zipfile(path):  # a legacy (non-zip) torch file has no records to inflate
        try:
            check_archive(path)  # a deflated record would be inflated whole, whatever it claims
        except ArchiveError as exc:
            raise TrainingConfigError(
                f"trainer.weights: {exc}", hint="use a file torch.save wrote (its records are never compressed)"
            ) from exc
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise TrainingConfigError(
            f"trainer.weights: {path} contains Python objects other than tensors; refusing to load it "
            "(weights are read with weights_only=True so a file cannot run code)",
            hint="re-save it as a plain state_dict: torch.save(model.state_dict(), path)",
        ) from exc
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise TrainingConfigError(
            f"trainer.weights: cannot read {path}: {exc}", hint="is it a file written by torch.save?"
        ) from exc

    if isinstance(obj, Mapping):
        for key in ("model", "state_dict"):
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise TrainingConfigError(
            f"trainer.weights: {path} is not a state_dict (expected a dict of tensors, or one under 'model' "
            "or 'state_dict')",
            hint="save it with torch.save(model.state_dict(), path)",
        )
    return {_strip_prefixes(str(k)): v for k, v in obj.items()}


def _strip_prefixes(key: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                stripped = True
    return key

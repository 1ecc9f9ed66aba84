"""Mixed precision: torch.amp for fp32/fp16/bf16, NVIDIA Apex for the O0-O3 levels.

One ``Precision`` object hides the difference from the training loop:

    model, optimizer = precision.prepare(model, optimizer)
    with precision.autocast():
        loss = criterion(model(images), targets)
    precision.backward(loss, optimizer)
    precision.step(optimizer)   # fp16 skips the update when it found inf/nan grads
    scheduler.step()            # every step, skipped or not: no host sync to find out

With fp16 the loss scaler finds inf/nan gradients on the device. Asking
whether it skipped (``get_scale()``, ``found_inf.item()``) would stall the
host on the GPU every step, so the LR schedule counts attempted steps, as in
torch's AMP examples; the fused SGD step (see :mod:`hpctrain.trainer.optim`)
takes the scaler's found-inf flag on the device, so the step itself does not
sync either.

Apex levels refuse to run without Apex rather than silently changing numerics;
the error names the torch.amp setting that does the same job.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, TypeVar

import torch
from torch import nn

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import APEX_LEVELS

_APEX_EQUIVALENT = {
    "O0": "fp32",
    "O1": "fp16 (torch.autocast with float16 and a GradScaler, the same as Apex O1)",
    "O2": "fp16 (autocast keeps fp32 master weights like O2), or bf16 on Ampere or newer",
    "O3": "fp16 or bf16 (pure half-precision training has no torch.amp equivalent)",
}

T = TypeVar("T", nn.Module, torch.Tensor)


class Precision:
    """Autocast, loss scaling and (for Apex) model/optimizer patching for one precision setting."""

    def __init__(self, precision: str, device: torch.device) -> None:
        self.name = precision
        self.device = torch.device(device)
        self.apex_amp: Any = None
        self.dtype: torch.dtype | None = None
        if precision in APEX_LEVELS:
            self.apex_amp = _import_apex_amp(precision, self.device)
        elif precision == "fp16":
            if self.device.type != "cuda":
                raise TrainingConfigError("trainer.precision: fp16 needs a CUDA GPU", hint="use bf16 on CPU, or fp32")
            self.dtype = torch.float16
        elif precision == "bf16":
            if self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
                raise TrainingConfigError(
                    f"trainer.precision: bf16 needs an Ampere or newer GPU ({torch.cuda.get_device_name(self.device)})",
                    hint="use fp16 on this GPU",
                )
            self.dtype = torch.bfloat16
        elif precision != "fp32":
            raise TrainingConfigError(
                f"trainer.precision: unknown precision {precision!r}", hint="use fp32, fp16, bf16 or O0-O3"
            )
        # bf16 has fp32's exponent range: no loss scaling needed.
        scaler_device = self.device.type if self.device.type in ("cuda", "cpu") else "cpu"
        self.scaler = torch.amp.GradScaler(scaler_device, enabled=self.dtype == torch.float16)

    @property
    def is_apex(self) -> bool:
        return self.apex_amp is not None

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Apex patches the model and optimizer (before DDP wrapping); torch.amp needs nothing."""
        if self.is_apex:
            return self.apex_amp.initialize(model, optimizer, opt_level=self.name, verbosity=0)
        return model, optimizer

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:  # fp32, or Apex (which patches functions itself)
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        if self.is_apex:
            with self.apex_amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
        else:
            self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step the optimizer (fp16: unless the gradients hold inf/nan, decided on the device)."""
        if self.is_apex or not self.scaler.is_enabled():
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"precision": self.name, "scaler": self.scaler.state_dict()}
        if self.is_apex:
            state["amp"] = self.apex_amp.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore loss-scaler state; a checkpoint from another precision leaves the fresh state."""
        if state.get("precision") != self.name:
            return
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.is_apex and "amp" in state:
            self.apex_amp.load_state_dict(state["amp"])


def to_memory_format(obj: T, channels_last: bool) -> T:
    """``obj`` in channels_last when asked (models, and 4-D tensors); anything else unchanged."""
    if not channels_last:
        return obj
    if isinstance(obj, nn.Module):
        return obj.to(memory_format=torch.channels_last)
    if obj.dim() == 4:
        return obj.contiguous(memory_format=torch.channels_last)
    return obj


def _import_apex_amp(level: str, device: torch.device) -> Any:
    hint = f"use trainer.precision: {_APEX_EQUIVALENT[level]}"
    try:
        amp = importlib.import_module("apex.amp")
    except ImportError as exc:
        raise TrainingConfigError(
            f"trainer.precision: {level} is an NVIDIA Apex opt level, and Apex is not installed", hint=hint
        ) from exc
    if device.type != "cuda":
        raise TrainingConfigError(f"trainer.precision: Apex {level} needs a CUDA GPU", hint=hint)
    return amp

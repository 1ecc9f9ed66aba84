"""Cut a torchvision model into consecutive parts: shared by ``pipeline`` (one task per stage) and
``model_parallel`` (one GPU per part).

The model's *sequential form* (:mod:`hpctrain.jobspec.layer_split`) is a list of
named blocks whose composition is the model's forward. A part is an
``nn.Sequential`` of blocks that are the model's own submodules, so the whole
model keeps its torchvision state-dict keys: checkpoints of a cut model load
into ``strategy: single``. The split is a pure function of block weights
(parameter counts, or measured times) and the number of parts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.layer_split import FLATTEN, POOL, RECIPES, RELU, family_of, unsplittable_message


class Flatten(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(x, 1)


class Relu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.relu(x)


class Pool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.adaptive_avg_pool2d(x, (1, 1))


_FUNCTIONAL = {FLATTEN: Flatten, RELU: Relu, POOL: Pool}
_EXPANDED = (nn.Sequential, nn.ModuleList)


@dataclass(frozen=True)
class Block:
    """One step of the forward: ``name`` is its module path in the model (``layer3.1``), or ``<flatten>``."""

    name: str
    module: nn.Module

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())


def sequential_blocks(model: nn.Module, arch: str, strategy: str) -> list[Block]:
    """The model's forward as named blocks; refuses an arch whose forward is no plain sequence."""
    family = family_of(arch)
    if family is None:
        raise TrainingConfigError(
            f"trainer.arch: {unsplittable_message(arch, strategy)}", hint="pick a supported trainer.arch"
        )
    blocks = []
    for step in RECIPES[family]:
        if step in _FUNCTIONAL:
            blocks.append(Block(step, _FUNCTIONAL[step]()))
            continue
        child = getattr(model, step)
        if isinstance(child, _EXPANDED) and len(child) > 1:
            blocks += [Block(f"{step}.{name}", grandchild) for name, grandchild in child.named_children()]
        else:
            blocks.append(Block(step, child))
    return blocks


def balanced_starts(weights: Sequence[float], parts: int) -> list[int]:
    """Start indices of ``parts`` contiguous non-empty groups of ``weights`` minimising the heaviest group.

    Linear partition by dynamic programming (blocks: tens to a few hundred; parts: a few): exact,
    and ties go to the earliest cut so the result is the same on every rank.
    """
    n = len(weights)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} blocks into {parts} non-empty parts")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))
    inf = float("inf")
    # best[k][i]: the smallest heaviest group cutting the first i blocks into k groups; cut[k][i]: last group's start
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    starts, i = [], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def named_starts(blocks: Sequence[Block], split_points: Sequence[str], key: str) -> list[int]:
    """Start indices from explicit names: a name starts its part at the block of that name, or its first child."""
    names = [block.name for block in blocks]
    starts = [0]
    for point in split_points:
        matches = [i for i, name in enumerate(names) if name == point or name.startswith(point + ".")]
        if not matches:
            raise TrainingConfigError(
                f"{key}.split_points: {point!r} is not a block of this model",
                hint=f"use block names in forward order, from: {', '.join(names)}",
            )
        starts.append(matches[0])
    if any(b <= a for a, b in zip(starts, starts[1:])):
        raise TrainingConfigError(
            f"{key}.split_points: {list(split_points)} are not in forward order, or one part would be empty",
            hint=f"the blocks in forward order: {', '.join(names)}",
        )
    return starts


def measured_weights(blocks: Sequence[Block], sample: torch.Tensor, repeats: int = 2) -> list[float]:
    """Forward+backward seconds of each block on ``sample`` (the best of ``repeats``), in train mode.

    The blocks' buffers (BatchNorm statistics) are put back afterwards: measuring trains nothing.
    """
    weights = []
    x = sample
    for block in blocks:
        saved = [buffer.clone() for buffer in block.module.buffers()]
        best = float("inf")
        for _ in range(repeats):
            inp = x.detach().requires_grad_(x.is_floating_point())
            started = time.perf_counter()
            out = block.module(inp.clone())  # not the leaf itself: blocks may work in place (ReLU)
            out.float().sum().backward()
            if out.is_cuda:
                torch.cuda.synchronize(out.device)
            best = min(best, time.perf_counter() - started)
        block.module.zero_grad(set_to_none=True)
        with torch.no_grad():
            for buffer, value in zip(block.module.buffers(), saved, strict=True):
                buffer.copy_(value)
        weights.append(best)
        x = out.detach()
    return weights


def choose_starts(
    blocks: Sequence[Block],
    parts: int,
    *,
    balance: str,
    split_points: Sequence[str],
    key: str,
    sample: torch.Tensor | None = None,
) -> list[int]:
    """Where each of ``parts`` parts begins: the named split points, else balanced by params or time."""
    if parts > len(blocks):
        raise TrainingConfigError(
            f"{key}: {parts} parts, but this model has only {len(blocks)} blocks to cut between",
            hint=f"use at most {len(blocks)} (blocks: {', '.join(b.name for b in blocks)})",
        )
    if split_points:
        if len(split_points) != parts - 1:
            raise TrainingConfigError(
                f"{key}.split_points: {len(split_points)} names for {parts} parts",
                hint=f"give {parts - 1} names, or remove split_points",
            )
        return named_starts(blocks, split_points, key)
    if balance == "time":
        if sample is None:
            raise ValueError("balance by time needs a sample batch")
        return balanced_starts(measured_weights(blocks, sample), parts)
    return balanced_starts([block.params for block in blocks], parts)


def parts_of(blocks: Sequence[Block], starts: Sequence[int]) -> list[nn.Sequential]:
    """One ``nn.Sequential`` per part, holding the model's own block modules (shared, not copied)."""
    ends = [*starts[1:], len(blocks)]
    return [nn.Sequential(*(block.module for block in blocks[a:b])) for a, b in zip(starts, ends)]


def describe(blocks: Sequence[Block], starts: Sequence[int]) -> list[str]:
    """``['conv1..layer2.1 (0.7M params)', ...]`` for logs and summaries."""
    ends = [*starts[1:], len(blocks)]
    out = []
    for a, b in zip(starts, ends):
        params = sum(block.params for block in blocks[a:b])
        out.append(f"{blocks[a].name}..{blocks[b - 1].name} ({params / 1e6:.2f}M params)")
    return out

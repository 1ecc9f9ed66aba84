"""BatchNorm over a micro-batch computed in pieces by several gloo ranks equals BatchNorm over the whole batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from trainer_harness import run_ranks

from hpctrain.jobspec.shares import SharePlan
from hpctrain.trainer.split_norm import SplitNorm

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.local_dist]

CASES = {  # name -> (layer, input shape, channels_last)
    "2d": (lambda: nn.BatchNorm2d(3), (7, 3, 4, 5), False),
    "2d-channels-last": (lambda: nn.BatchNorm2d(3), (7, 3, 4, 5), True),
    "1d-no-affine-cumulative": (lambda: nn.BatchNorm1d(4, affine=False, momentum=None), (7, 4), False),
    "2d-one-sample-pieces-1x1": (lambda: nn.BatchNorm2d(5), (3, 5, 1, 1), False),  # resnet's layer4 at 32 px
}


def scenario_pieces(rank: int, world_size: int) -> dict[str, dict[str, bool]]:
    """Every case on every rank: what matched the whole batch's BatchNorm."""
    torch.set_default_dtype(torch.float64)
    return {case: compare(case, rank, world_size) for case in sorted(CASES)}


def compare(case: str, rank: int, world_size: int) -> dict[str, bool]:
    """The whole batch on one rank's own layer, then each rank's piece of it with the group's statistics."""
    make, shape, channels_last = CASES[case]
    torch.manual_seed(0)
    x = torch.randn(shape) * 3 + 1
    weights = torch.randn(shape)  # an arbitrary loss, sum(y * weights), so the backward is not trivial
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    whole = make()
    ours = make()
    ours.load_state_dict(whole.state_dict())
    before = {name: value.clone() for name, value in ours.state_dict().items()}
    for norm in (whole, ours):
        norm.train()

    reference_x = x.clone().requires_grad_(True)
    reference_out = whole(reference_x)
    (reference_out * weights).sum().backward()
    whole(x)  # a second step: the running statistics keep going

    # one micro-batch left over after a whole one each, shared by every rank
    plan = SharePlan(micro_batches=world_size + 1, ranks=world_size, batch_size=shape[0])
    split = SplitNorm(ours, plan, rank)
    part = plan.parts(rank)[0]
    assert part.group == 0 and split.active
    piece = x[part.start : part.stop].clone().requires_grad_(True)
    with split.part(part):
        out = ours(piece)
        (out * weights[part.start : part.stop]).sum().backward()
        ours(x[part.start : part.stop])
    grads = {name: p.grad.clone() for name, p in ours.named_parameters()}
    for grad in grads.values():
        dist.all_reduce(grad)  # what DDP sums over the ranks
    close = {
        "output": torch.allclose(out, reference_out[part.start : part.stop], rtol=0, atol=1e-12),
        "input": torch.allclose(piece.grad, reference_x.grad[part.start : part.stop], rtol=0, atol=1e-12),
        "params": all(torch.allclose(grads[name], p.grad, rtol=0, atol=1e-12) for name, p in whole.named_parameters()),
        # a piece is never the micro-batch its rank computed in the full shape: its running statistics stay
        "buffers": all(torch.equal(ours.state_dict()[name], value) for name, value in before.items()),
        "format": out.is_contiguous(memory_format=torch.channels_last) if channels_last else out.is_contiguous(),
    }
    native = make()
    native.load_state_dict(ours.state_dict())
    with split.part(part):  # in eval mode a piece too runs the layer's own forward, on its running statistics
        same = torch.equal(ours.eval()(x), native.eval()(x))
    return {**close, "eval_unchanged": same}


def test_pieces_on_three_ranks_normalise_as_the_whole_batch(tmp_path: Path) -> None:
    # output and input gradient of each piece and summed parameter gradients (as DDP sums them) agree with the
    # whole batch's to 1e-12 in float64; running statistics are left alone; eval mode is the layer's own
    matched = dict.fromkeys(("output", "input", "params", "buffers", "format", "eval_unchanged"), True)
    assert run_ranks(scenario_pieces, 3, tmp_path / "out") == [dict.fromkeys(CASES, matched)] * 3


def test_a_model_without_batchnorm_or_a_run_that_never_changed_shape_changes_nothing() -> None:
    plain = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    assert not SplitNorm(plain, SharePlan(4, 3, 8), rank=0).active  # no BatchNorm: no group, nothing patched
    norm = nn.BatchNorm2d(3)
    assert not SplitNorm(norm, None, rank=0).active and "forward" not in vars(norm)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_only_the_full_shapes_micro_batch_of_a_rank_moves_its_running_statistics(momentum: float | None) -> None:
    # 4 micro-batches on 2 ranks: rank 1 computes micro-batches 1 and 3 whole; in the full shape it computed
    # micro-batch 1 alone, so only that one moves its running statistics (and counts a batch), and micro-batch
    # 3 is normalised exactly as the layer's own forward would (its batch's statistics)
    plan = SharePlan(micro_batches=4, ranks=2, batch_size=6)
    torch.manual_seed(0)
    batches = {1: torch.randn(6, 3, 4, 4) * 2 + 1, 3: torch.randn(6, 3, 4, 4) - 2}
    ours, full_shape = nn.BatchNorm2d(3, momentum=momentum), nn.BatchNorm2d(3, momentum=momentum)
    split = SplitNorm(ours, plan, rank=1)
    assert split.active and [part.micro_batch for part in plan.parts(1)] == [1, 3]
    outputs = {}
    for part in plan.parts(1):
        with split.part(part):
            outputs[part.micro_batch] = ours(batches[part.micro_batch])
    expected = full_shape(batches[1])
    assert torch.equal(outputs[1], expected)
    for name, value in full_shape.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name
    assert torch.equal(outputs[3], nn.BatchNorm2d(3, momentum=momentum)(batches[3]))

"""A module's and optimizer's DCP state built without DCP's per-call cost equals what DCP's helpers give."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from hpctrain.task import plain_state
from hpctrain.task.plain_state import PlainState, _same, snapshot


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    optimizer = torch.optim.SGD(
        [
            {"params": model[0].parameters(), "lr": 0.5},
            {"params": list(model[1].parameters()) + list(model[3].parameters())},
        ],
        lr=0.1,
        momentum=0.9,
    )
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_after_asking_dcp_once_the_state_is_built_alike_and_holds_the_live_tensors() -> None:
    model, optimizer = model_and_optimizer()
    module, optim = PlainState(model), PlainState(model, optimizer)
    for _ in range(2):  # the first call asks DCP and compares, the second builds it alone
        assert _same(module.state(), get_model_state_dict(model))
        assert _same(optim.state(), get_optimizer_state_dict(model, optimizer))
    assert module._trusted and optim._trusted and optim._own_given
    assert optim.state()["state"]["0.weight"]["momentum_buffer"] is optimizer.state[model[0].weight]["momentum_buffer"]


def test_a_load_that_filled_the_live_tensors_sets_only_the_hyper_parameters() -> None:
    model, optimizer = model_and_optimizer()
    optim = PlainState(model, optimizer)
    live = optim.state()
    asked = snapshot(live)
    saved = {**live, "param_groups": [dict(group, lr=group["lr"] / 10) for group in live["param_groups"]]}
    buffer = optimizer.state[model[0].weight]["momentum_buffer"]
    buffer.fill_(3.0)  # what DCP did: filled it in place
    optim.set(saved, asked)
    assert [group["lr"] for group in optimizer.param_groups] == [0.05, 0.01]
    assert optimizer.state[model[0].weight]["momentum_buffer"] is buffer  # not replaced by a copy


def test_a_value_dcp_replaced_goes_through_dcps_helper() -> None:
    model, _ = model_and_optimizer()
    module = PlainState(model)
    live = module.state()
    asked = snapshot(live)
    replaced = dict(live, **{"3.bias": torch.tensor([7.0, 8.0])})  # not the live tensor: it must be set
    module.set(replaced, asked)
    assert torch.equal(model[3].bias.detach(), torch.tensor([7.0, 8.0]))


def test_a_guess_is_our_own_dictionary_of_the_live_tensors_without_asking_dcp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, optimizer = model_and_optimizer()
    module, optim = PlainState(model), PlainState(model, optimizer)
    expected_module, expected_optim = get_model_state_dict(model), get_optimizer_state_dict(model, optimizer)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("DCP was asked")

    monkeypatch.setattr(plain_state, "get_model_state_dict", never)
    monkeypatch.setattr(plain_state, "get_optimizer_state_dict", never)
    assert _same(module.guess(), expected_module) and _same(optim.guess(), expected_optim)
    assert module._trusted is None and module._own_given  # undecided: the first save still compares with DCP's

"""dp's parallel loss on real GPUs: the same loss, counts and gradients as plain nn.DataParallel.

With one GPU DataParallel calls the model directly and both paths are the
plain one; with two or more the parallel path keeps one output per GPU, and
an odd batch makes the last GPU's chunk smaller (what the weighting is for).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn
from trainer_harness import context, job_spec, read_jsonl

from hpctrain.contract.rundir import metrics_path
from hpctrain.trainer.evaluation import batch_sums
from hpctrain.trainer.strategies.dp import dp_device_ids
from hpctrain.trainer.strategies.dp_loss import DataParallelModel, parallel_loss, parallel_sums
from hpctrain.trainer.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def step(wrapper: type[nn.DataParallel], images: torch.Tensor, targets: torch.Tensor) -> tuple:
    """Loss, sums and gradients of one forward/backward of a fixed resnet18 through ``wrapper``."""
    torch.manual_seed(0)
    module = torchvision.models.resnet18(num_classes=1000).cuda()
    device = torch.device("cuda", 0)
    model = wrapper(module, device_ids=dp_device_ids(device), output_device=device)
    model.train()  # BatchNorm normalises each GPU's chunk on both paths: only where the loss runs differs
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    output = model(images)
    loss = parallel_loss(criterion, output, targets)
    loss.backward()
    sums = parallel_sums(output, targets, loss)
    return loss.detach(), sums, [p.grad.clone() for p in module.parameters()], output


def test_parallel_loss_equals_plain_dp() -> None:
    gpus = torch.cuda.device_count()
    generator = torch.Generator().manual_seed(1)
    n = 4 * gpus + 1 if gpus > 1 else 9
    images = torch.randn(n, 3, 64, 64, generator=generator).cuda()
    targets = torch.randint(0, 1000, (n,), generator=generator).cuda()
    plain_loss, plain_sums, plain_grads, plain_out = step(nn.DataParallel, images, targets)
    loss, sums, grads, out = step(DataParallelModel, images, targets)
    assert isinstance(plain_out, torch.Tensor)
    assert isinstance(out, tuple) == (gpus > 1)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sums, plain_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain_sums, batch_sums(plain_out.float(), targets, plain_loss.float()))
    for grad, plain_grad in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(grad, plain_grad, rtol=1e-4, atol=1e-6)


def test_the_trainer_trains_the_same_model_with_and_without_it(data_root: Path, tmp_path: Path) -> None:
    """Whole runs through the trainer (fp16: the GradScaler scales the reduced loss), on every visible GPU."""
    common = {"strategy": "dp", "precision": "fp16", "max_steps_per_epoch": 2}
    runs = {}
    for name, extra in {"plain": {}, "parallel": {"dp_parallel_loss": True}}.items():
        spec = job_spec(data_root, trainer={**common, **extra})
        runs[name] = Trainer(context(tmp_path / name, spec, device="cuda:0")).fit()
    assert runs["parallel"]["status"] == "completed"
    assert runs["parallel"]["global_batch_size"] == 8 * torch.cuda.device_count()
    first = [
        next(r for r in read_jsonl(metrics_path(tmp_path / name)) if r["kind"] == "train_step")
        for name in ("plain", "parallel")
    ]
    assert first[1]["step"] == first[0]["step"]
    assert first[1]["loss"] == pytest.approx(first[0]["loss"], rel=1e-2)  # fp16, and a second step after an update
    assert first[1]["top1"] == pytest.approx(first[0]["top1"], abs=100 / 16)  # at most one of 16 images differs

"""Published reference numbers a report can draw next to a study (``--baseline hal``).

HAL (NCSA, UIUC): ResNet-50 on ImageNet with PyTorch DistributedDataParallel,
NVIDIA Apex AMP at opt level O2, NCCL, 4 V100 GPUs per node, 208 images per
GPU per step, 20 data-loader workers, 2 to 64 GPUs, 90 epochs (February 2020).

Where the numbers come from (found, not invented):

* Throughput and 90-epoch training time per GPU count: ``plot_all_feb()`` in
  ``plot.py`` of the HAL tutorial's repository, github.com/richardkxu/distributed-pytorch
  (arrays ``n_gpus``, ``throughput``, ``train_time``; throughput is images/s).
* Final validation top-1 per run: ``RESULTS.md`` of the same repository
  (2, 4, 8 and 16 GPUs; none is stated for 32 and 64 GPUs, so none is given;
  the 2-GPU run stopped at epoch 81, its 90-epoch time is the one RESULTS.md
  lists for 90 epochs).
* Setup (V100, 2 -> 64 GPUs, per-GPU batch 208, global batch 416 -> 13312, Apex
  AMP O2, DDP, NCCL): the NCSA wiki page on distributed training on HAL,
  wiki.ncsa.illinois.edu pageId=110468653.

The scaling efficiency at 64 GPUs follows from these numbers:
(33080.03 / 64) / (1582.04 / 2) = 0.653, the "about 65 %" the tutorial quotes.
Time per epoch is the 90-epoch time / 90 (validation included, as measured there).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BaselinePoint:
    gpus: int
    images_per_s: float
    train_time_s: float  # all 90 epochs
    top1: float | None  # final validation top-1 (%), where the source states it

    @property
    def epoch_s(self) -> float:
        return self.train_time_s / 90


@dataclass(frozen=True)
class Baseline:
    name: str
    title: str
    caption: str
    sources: tuple[str, ...]
    points: tuple[BaselinePoint, ...]

    def efficiency(self, point: BaselinePoint) -> float:
        smallest = min(self.points, key=lambda p: p.gpus)
        return (point.images_per_s / point.gpus) / (smallest.images_per_s / smallest.gpus)


HAL = Baseline(
    name="hal",
    title="HAL V100 ResNet-50 (PyTorch DDP + Apex AMP O2, 208 img/GPU)",
    caption=(
        "Reference: ResNet-50 / ImageNet on NCSA HAL (V100, PyTorch DDP, Apex AMP O2, batch 208 per GPU), "
        "Feb 2020; numbers from github.com/richardkxu/distributed-pytorch (plot.py plot_all_feb, RESULTS.md), "
        "setup from wiki.ncsa.illinois.edu (pageId=110468653)."
    ),
    sources=(
        "https://github.com/richardkxu/distributed-pytorch/blob/master/plot.py",
        "https://github.com/richardkxu/distributed-pytorch/blob/master/RESULTS.md",
        "https://wiki.ncsa.illinois.edu/pages/viewpage.action?pageId=110468653",
    ),
    points=(
        BaselinePoint(gpus=2, images_per_s=1582.04, train_time_s=74211.11, top1=76.060),
        BaselinePoint(gpus=4, images_per_s=3004.51, train_time_s=39536.0, top1=76.240),
        BaselinePoint(gpus=8, images_per_s=5805.14, train_time_s=20904.01, top1=76.292),
        BaselinePoint(gpus=16, images_per_s=11273.57, train_time_s=10969.42, top1=75.631),
        BaselinePoint(gpus=32, images_per_s=19496.10, train_time_s=6652.91, top1=None),
        BaselinePoint(gpus=64, images_per_s=33080.03, train_time_s=4071.31, top1=None),
    ),
)

BASELINES = {"hal": HAL}

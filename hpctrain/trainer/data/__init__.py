"""ImageFolder datasets and loaders: fast, resumable order and augmentation, exact evaluation.

The package: ``augment`` (crop boxes, pure functions), ``index`` (one scan of the
tree per job), ``decode`` (header size, DCT-scaled decode), ``datasets`` (train
and val samples as uint8, bad files replaced and counted), ``device_input``
(uint8 -> normalised float on the device), ``hpctrain.task.samplers`` (train order and eval
shards, shared with the task API's ElasticLoader), ``sources`` (data.root as folder, packed image or staged copy ->
datasets), ``loader_workers`` (worker seeds and signals) and ``loaders`` (all
of it wired to one rank's loaders); ``reference`` is torchvision's evaluation
transform, the yardstick of tests and benchmarks.
What differs from the pytorch/examples ImageNet loader, so that a requeued job
continues exactly where it stopped and evaluation is exact:

* ``TrainImages``: each sample's random crop/flip is a pure function of
  (seed, epoch, sample index), whatever the worker count or rank layout.
* ``ResumableDistributedSampler``: DistributedSampler's order, plus skipping the
  samples already consumed in the current epoch, in canonical micro-batches that
  keep each step's global batch whatever the number of ranks (docs/preemption.md).
* ``ExactEvalSampler``: every validation sample is seen exactly once over all
  ranks (DistributedSampler pads by repeating samples, which skews accuracy).

Call ``Loaders.set_epoch(epoch)`` before iterating each epoch.
"""

from hpctrain.task.samplers import ExactEvalSampler, MicroBatchSampler, ResumableDistributedSampler
from hpctrain.trainer.data.loader_workers import obey_only_parent_sigterm, seed_worker
from hpctrain.trainer.data.loaders import Loaders, build_loaders, build_val_loader, encoded_datasets
from hpctrain.trainer.data.reference import val_transform
from hpctrain.trainer.data.sources import build_datasets

__all__ = [
    "ExactEvalSampler",
    "Loaders",
    "MicroBatchSampler",
    "ResumableDistributedSampler",
    "build_datasets",
    "build_loaders",
    "build_val_loader",
    "encoded_datasets",
    "obey_only_parent_sigterm",
    "seed_worker",
    "val_transform",
]

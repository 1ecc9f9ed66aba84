"""Train and val datasets over a ``DatasetIndex``: header-sized crop boxes, scaled decode, uint8 out.

``TrainImages[i]`` in epoch ``e`` is a pure function of (seed, e, i): the box and
flip come from ``augment.train_crop``, which draws from a local generator, so
no process-wide RNG is forked or touched. Samples are uint8 CHW; the trainer
converts, normalises and lays them out on the device (``device_input``).

A file that cannot be decoded (truncated, not an image, unreadable, or refused
by ``image_guard`` because decoding it would take unbounded memory) is skipped:
each process logs one warning per bad file, naming it (escaped), and counts
every skip in shared memory. In training another sample, chosen from (seed,
epoch, index), takes its place, so batch shapes and the sampler's order are
unchanged and a resume repeats the same replacement. In validation no other
image is scored in its place (that one would count twice): the sample becomes
a blank image labelled ``SKIPPED_LABEL``, which evaluation leaves out and counts.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from hpctrain.contract.runfiles import printable
from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.data.augment import CropBox, sample_rng, train_crop, val_crop
from hpctrain.trainer.data.decode import decode_crop
from hpctrain.trainer.data.image_guard import DEFAULT_MAX_PIXELS
from hpctrain.trainer.data.index import DatasetIndex

log = logging.getLogger(__name__)
MAX_REPLACEMENTS = 16
SKIPPED_LABEL = -1  # a validation sample whose image could not be decoded: scored by no one


class SkipCounter:
    """Skips over the main process and its loader workers (shared memory + a lock)."""

    def __init__(self) -> None:
        self._count = torch.zeros((), dtype=torch.int64).share_memory_()
        self._lock = multiprocessing.Lock()
        self._warned: set[str] = set()

    def skip(self, path: str, exc: BaseException) -> None:
        with self._lock:
            self._count += 1
        if path not in self._warned:
            self._warned.add(path)
            log.warning(
                "hpctrain: skipping unreadable image %s (%s: %s)",
                repr(path),
                type(exc).__name__,
                printable(exc),
            )

    @property
    def count(self) -> int:
        return int(self._count.item())


class _IndexedImages(Dataset):
    def __init__(self, index: DatasetIndex, image_size: int, seed: int, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.index = index
        self.image_size = image_size
        self.seed = seed
        self.max_pixels = max_pixels
        self.skips = SkipCounter()
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property
    def classes(self) -> list[str]:
        return self.index.classes

    @property
    def targets(self) -> list[int]:
        return self.index.targets

    @property
    def skipped_samples(self) -> int:
        return self.skips.count

    def __len__(self) -> int:
        return len(self.index.samples)

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def box_fn(self, epoch: int, index: int) -> Callable[[int, int], CropBox]:
        raise NotImplementedError

    def load(self, path: str, box_for: Callable[[int, int], CropBox]) -> Any:
        """One sample's payload from its file (data.decode gpu/dali hand over bytes instead: device_decode)."""
        return decode_crop(
            path, box_for, self.image_size, max_pixels=self.max_pixels, follow_links=self.index.follow_links
        )

    def __getitem__(self, index: int) -> tuple[Any, int]:
        epoch = self.epoch
        candidate, rng = index, None
        for _ in range(MAX_REPLACEMENTS):
            path = self.index.path(candidate)
            try:
                return self.load(path, self.box_fn(epoch, candidate)), self.index.samples[candidate][1]
            except Exception as exc:  # noqa: BLE001 - one bad file must never end a job
                self.skips.skip(path, exc)
            rng = rng or sample_rng(self.seed ^ 0x5EED, epoch, index)
            candidate = rng.randrange(len(self))
        raise TrainingConfigError(
            f"data: {MAX_REPLACEMENTS} images in a row could not be decoded (last: {path!r})",
            hint="check that the dataset is readable; each skipped file is named in the log above",
        )


class TrainImages(_IndexedImages):
    """RandomResizedCrop(scale (0.08, 1), ratio (3/4, 4/3)) + horizontal flip, seeded by (seed, epoch, index)."""

    def box_fn(self, epoch: int, index: int) -> Callable[[int, int], CropBox]:
        return lambda width, height: train_crop(self.seed, epoch, index, width, height)


class ValImages(_IndexedImages):
    """Resize(val_resize) + CenterCrop(image_size), as one box; deterministic.

    A sample whose image cannot be decoded is not replaced (see the module docstring)."""

    def __init__(
        self, index: DatasetIndex, image_size: int, resize: int, seed: int = 0, max_pixels: int = DEFAULT_MAX_PIXELS
    ) -> None:
        super().__init__(index, image_size, seed, max_pixels)
        self.resize = resize

    def box_fn(self, epoch: int, index: int) -> Callable[[int, int], CropBox]:
        return lambda width, height: val_crop(width, height, self.image_size, self.resize)

    def load(self, path: str, box_for: Callable[[int, int], CropBox]) -> Any:
        return decode_crop(  # whole: val_crop's box is fractional
            path, box_for, self.image_size, whole=True, max_pixels=self.max_pixels, follow_links=self.index.follow_links
        )

    def blank(self) -> Any:
        """The payload of a skipped sample: any image of the right shape (it is never scored)."""
        return torch.zeros((3, self.image_size, self.image_size), dtype=torch.uint8)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path = self.index.path(index)
        try:
            return self.load(path, self.box_fn(0, index)), self.index.samples[index][1]
        except Exception as exc:  # noqa: BLE001 - one bad file must never end a job
            self.skips.skip(path, exc)
        return self.blank(), SKIPPED_LABEL

"""``hpctrain make-dataset OUT``: a small real-JPEG ImageFolder for the quickstart and tests."""

from __future__ import annotations

import argparse
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    from hpctrain.dataset.generate import make_dataset  # PIL + numpy only; checks every bound first

    with _terminate_as_interrupt():
        manifest = make_dataset(
            Path(args.out),
            classes=args.classes,
            per_class=args.per_class,
            val_per_class=args.val_per_class,
            image_size=args.image_size,
            seed=args.seed,
        )
    print(
        f"wrote {args.out}: {manifest.get('classes', args.classes)} classes, "
        f"{manifest.get('train_images', '?')} train / {manifest.get('val_images', '?')} val JPEGs"
    )
    return 0


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM or SIGHUP (a closed terminal) ends the command like Ctrl-C, so make_dataset
    removes its temporary folder instead of dying with it half-written."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

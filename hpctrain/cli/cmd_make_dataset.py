"""``hpctrain make-dataset OUT``: a small real-JPEG ImageFolder for the quickstart and tests."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpctrain.errors import UsageError


def run(args: argparse.Namespace) -> int:
    from hpctrain.trainer.dataset_gen import make_dataset  # PIL + numpy only

    for flag, value in (
        ("--classes", args.classes),
        ("--per-class", args.per_class),
        ("--image-size", args.image_size),
    ):
        if value < 1:
            raise UsageError(f"{flag} must be positive")
    if args.classes < 2:
        raise UsageError("--classes must be at least 2")
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

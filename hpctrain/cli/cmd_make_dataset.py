"""``hpctrain make-dataset OUT``: a small real-JPEG ImageFolder for the quickstart and tests."""

from __future__ import annotations

import argparse
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    from hpctrain.trainer.dataset_gen import make_dataset  # PIL + numpy only; checks every bound first

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

"""``hpctrain pack DATA_ROOT OUT.sqsh``: pack an ImageFolder tree into one SquashFS image (torch-free)."""

from __future__ import annotations

import argparse
import signal
import sys

from hpctrain.contract.runfiles import printable
from hpctrain.errors import UsageError


def run(args: argparse.Namespace) -> int:
    from hpctrain.dataset.pack import PackError, pack

    # SIGTERM (scancel of a packing job, kill) and SIGHUP (the terminal closed) unwind like Ctrl-C: mksquashfs is
    # stopped, the temporary removed, an existing OUT left as it was
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: sys.exit(128 + signum))

    try:
        result = pack(args.data_root, args.out, force=args.force, strict=args.strict, processors=args.processors)
    except PackError as exc:
        raise UsageError(f"pack: {exc.message}", hint=exc.hint) from None
    print(
        f"packed {result.files} files ({result.bytes / 2**20:.1f} MiB) into {printable(result.out)} "
        f"({result.image_bytes / 2**20:.1f} MiB) in {result.seconds:.1f} s"
        + (f"; {result.links} symlink(s) followed, their content stored" if result.links else "")
        + (f"; {len(result.skipped)} path(s) left out" if result.skipped else "")
    )
    print(f"use it with data.root: {printable(result.out)}")
    return 0

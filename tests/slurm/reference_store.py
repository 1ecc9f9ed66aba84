"""Uninterrupted reference runs, trained once per code version and read by every session that needs one.

A stop/resume test compares its interrupted run bit for bit with the same run
trained without interruption. That reference depends only on what is trained:
the spec and its ``--set`` overrides (not the run's name), the dataset's bytes,
hpctrain's code and the test entry points, torch's version. It does not depend
on the Slurm release or on which pytest session trains it, so CI's matrix
(scripts/test.sh) trains it once, in the first session that needs it (the
24.11 leg's ``-n 2`` half), and the sessions after it (that leg's alone half,
the 22.05 and 26.05 contract subsets) read it. Each of those sessions still
trains its own runs to completion and compares their weights with it, so a
Slurm release on which the same training ended differently would fail there.

The store is a folder of small JSON files named by that key
($HPCTRAIN_TEST_REFERENCES, default /tmp/hpctrain-test-references); a new key
for any code change, so nothing stale is ever read. One file is written at a
time under a lock (xdist's workers), and atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
STORE_ENV = "HPCTRAIN_TEST_REFERENCES"
DEFAULT_STORE = "/tmp/hpctrain-test-references"
# What a reference's weights depend on besides the sets and the data: the code that trains it.
CODE = ("hpctrain", "tests/slurm/stop_entrypoints.py")


def _store() -> Path:
    folder = Path(os.environ.get(STORE_ENV, DEFAULT_STORE))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _digest_files(digest: hashlib._Hash, root: Path, files: list[Path]) -> None:
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())


def _code_files() -> list[Path]:
    files: list[Path] = []
    for name in CODE:
        path = REPO_ROOT / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def reference_key(spec: str, sets: list[str], data: Path) -> str:
    """The key of the run ``hpctrain submit SPEC --set ...`` trains on ``data`` (the run's name left out)."""
    digest = hashlib.sha256()
    digest.update(metadata.version("torch").encode() + b"\0")
    _digest_files(digest, REPO_ROOT, [REPO_ROOT / spec, *_code_files()])
    # The images only: what a run may leave beside them (an index) does not change what is trained.
    images = [p for split in ("train", "val") for p in (data / split).rglob("*") if p.is_file()]
    _digest_files(digest, data, images)
    data_prefix = f"data.root={data}"
    kept = [s for s in sets if not s.startswith(("name=", "output_dir=")) and s != data_prefix]
    digest.update(json.dumps(kept).encode())
    return digest.hexdigest()[:32]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def stored_weights(key: str, train: Callable[[], str]) -> str:
    """The reference weights' sha256 of ``key``: read from the store, or trained now by ``train`` and stored."""
    store = _store()
    with _locked(store / f"{key}.lock"):
        file = store / f"{key}.json"
        with contextlib.suppress(OSError, ValueError, KeyError):
            return str(json.loads(file.read_text())["weights_sha256"])
        weights = train()
        handle, partial = tempfile.mkstemp(dir=store, prefix=f".{key}.")
        with os.fdopen(handle, "w") as out:
            json.dump({"weights_sha256": weights}, out)
        os.replace(partial, file)
        return weights

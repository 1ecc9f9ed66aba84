"""The bad-node ledger: nodes this user's runs found sick or lost, so the next submit keeps away from them.

One JSON-lines file per user, ``$XDG_STATE_HOME/hpctrain/bad-nodes.jsonl``
(default ``~/.local/state``), beside the job registry. Each line is a
:class:`BadNode`: the node, the cluster profile it belongs to, why, the
evidence (numbers an administrator can act on), the run and job, when, and
until when it counts (``expires``). Writers: burn-in, slow-node eviction and
node loss (``hpctrain/healing``); readers: ``submit`` (``--exclude``) and
``hpctrain nodes``.

The file is read like any run file: untrusted. It is opened only as a regular
file owned by this user and at most :data:`MAX_LEDGER_BYTES` long; a FIFO,
another user's file, a huge one or a line that does not parse is ignored and
said in :attr:`Ledger.warnings`, never raised: a ledger never stops a
submit. Appends are one ``O_APPEND`` write of a small line (concurrent
writers do not interleave); :func:`forget` and the compaction of expired
entries rewrite the file atomically. Torch-free.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hpctrain.contract.rundir import atomic_write_text
from hpctrain.contract.runfiles import RunFileError, load_json, open_regular, printable
from hpctrain.errors import RunDirError

LEDGER_NAME = "bad-nodes.jsonl"
MAX_LEDGER_BYTES = 1 << 20  # thousands of entries; hpctrain compacts long before this
MAX_ENTRY_BYTES = 16 << 10  # one entry: a node, a reason and a few numbers
COMPACT_ABOVE_BYTES = 256 << 10  # an append to a longer file first drops the expired entries
DEFAULT_EXPIRY_S = 7 * 86400.0


class BadNode(BaseModel):
    """One line of the ledger; the keys are a contract (docs/node-health.md)."""

    model_config = ConfigDict(extra="allow", defer_build=True, allow_inf_nan=False)

    node: str = Field(min_length=1, max_length=255)
    cluster: str = Field("", max_length=255)
    reason: str = Field("", max_length=2000)
    kind: str = Field("", max_length=32)  # burn-in, slow, lost
    evidence: dict[str, Any] = {}
    run: str = Field("", max_length=4096)  # the run directory
    job_id: str | None = Field(None, max_length=64)
    time: float = 0.0
    expires: float = 0.0

    def live(self, now: float) -> bool:
        return self.expires > now


@dataclass
class Ledger:
    """What the ledger file says: its entries, oldest first, and what was ignored (for a warning)."""

    path: Path
    entries: list[BadNode] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def live(self, cluster: str | None = None, now: float | None = None) -> list[BadNode]:
        """Entries still in force (for ``cluster``, when given); a node once, with its newest entry."""
        now = time.time() if now is None else now
        newest: dict[tuple[str, str], BadNode] = {}
        for entry in self.entries:
            if entry.live(now) and (cluster is None or entry.cluster == cluster):
                newest[(entry.cluster, entry.node)] = entry
        return sorted(newest.values(), key=lambda e: e.time)


def ledger_path() -> Path:
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(state_home) / "hpctrain" / LEDGER_NAME


def read_ledger(path: Path | None = None) -> Ledger:
    """The ledger at ``path`` (default: this user's); never raises."""
    path = ledger_path() if path is None else Path(path)
    ledger = Ledger(path)
    try:
        with open_regular(path) as handle:
            info = os.fstat(handle.fileno())
            if info.st_uid != os.geteuid():
                ledger.warnings.append(f"{path}: owned by another user (uid {info.st_uid}); ignored")
                return ledger
            data = handle.read(MAX_LEDGER_BYTES + 1)
    except FileNotFoundError:
        return ledger
    except RunFileError as exc:
        ledger.warnings.append(f"{printable(exc.message)}; the bad-node ledger is ignored")
        return ledger
    except OSError as exc:
        ledger.warnings.append(f"{path}: {printable(exc.strerror or exc)}; the bad-node ledger is ignored")
        return ledger
    if len(data) > MAX_LEDGER_BYTES:
        ledger.warnings.append(
            f"{path}: larger than {MAX_LEDGER_BYTES} bytes, far more than hpctrain writes; ignored "
            "(move it away: hpctrain starts a new one)"
        )
        return ledger
    bad = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        entry = _parse(line)
        if entry is None:
            bad += 1
        else:
            ledger.entries.append(entry)
    if bad:
        ledger.warnings.append(f"{path}: {bad} line(s) that are not ledger entries were skipped")
    return ledger


def _parse(line: bytes) -> BadNode | None:
    if len(line) > MAX_ENTRY_BYTES:
        return None
    try:
        return BadNode.model_validate(load_json(line))
    except (ValueError, ValidationError):
        return None


def entry_line(entry: BadNode) -> bytes:
    """One ledger line (a bounded entry: evidence that would not fit is dropped)."""
    text = json.dumps(entry.model_dump(mode="json"), sort_keys=True, allow_nan=False, default=str)
    if len(text) > MAX_ENTRY_BYTES - 1:
        text = json.dumps({**entry.model_dump(mode="json"), "evidence": {}}, sort_keys=True, default=str)
    return (text + "\n").encode()


def append_entries(entries: Iterable[BadNode], path: Path | None = None, now: float | None = None) -> None:
    """Add ``entries`` to the ledger; raises OSError (callers log it: a ledger is never worth a failure)."""
    path = ledger_path() if path is None else Path(path)
    lines = b"".join(entry_line(entry) for entry in entries)
    if not lines:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path} is not a regular file; the bad-node ledger was not written")
    if info is not None and info.st_uid != os.geteuid():
        raise OSError(f"{path} belongs to another user; the bad-node ledger was not written")
    if info is not None and info.st_size > COMPACT_ABOVE_BYTES:
        _compact(path, now)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, lines)
    finally:
        os.close(fd)


def _compact(path: Path, now: float | None) -> None:
    """Rewrite the ledger with its live entries only."""
    ledger = read_ledger(path)
    moment = time.time() if now is None else now
    kept = [entry for entry in ledger.entries if entry.live(moment)]
    atomic_write_text(path, b"".join(entry_line(entry) for entry in kept).decode())
    os.chmod(path, 0o600)


def forget(node: str, path: Path | None = None, cluster: str | None = None) -> int:
    """Remove every entry of ``node`` (on ``cluster``, when given); how many were removed."""
    path = ledger_path() if path is None else Path(path)
    ledger = read_ledger(path)
    if ledger.warnings and not ledger.entries:
        raise RunDirError(ledger.warnings[0], hint=f"move {path} away; hpctrain starts a new ledger")
    kept = [e for e in ledger.entries if not (e.node == node and (cluster is None or e.cluster == cluster))]
    removed = len(ledger.entries) - len(kept)
    if removed:
        atomic_write_text(path, b"".join(entry_line(entry) for entry in kept).decode())
        os.chmod(path, 0o600)
    return removed


def new_entry(
    node: str,
    *,
    cluster: str,
    reason: str,
    kind: str,
    evidence: dict[str, Any],
    run: str,
    job_id: str | None,
    expiry_s: float = DEFAULT_EXPIRY_S,
    now: float | None = None,
) -> BadNode:
    moment = time.time() if now is None else now
    return BadNode(
        node=node,
        cluster=cluster,
        reason=reason,
        kind=kind,
        evidence=evidence,
        run=run,
        job_id=job_id,
        time=round(moment, 3),
        expires=round(moment + expiry_s, 3),
    )

"""Run-directory files are untrusted input: read them bounded, print them inert. Torch-free.

A run directory can be copied, edited or crafted by anyone who can write to
it, and ``status``, ``report``, ``logs`` and ``cancel`` read it on a shared
login node. So every reader of its files goes through here:

* :func:`open_regular` opens regular files only: a FIFO, a device
  (``/dev/zero``), a socket or a directory under a file's name is refused
  with :class:`RunFileError` before a byte is read (``O_NONBLOCK``, so a
  FIFO cannot hang the open itself). A symlink to a regular file is fine
  as long as it stays inside the run: every reader names its run's home as
  ``within``, and a file whose real path (of the descriptor opened, so a
  swapped link cannot slip past) lies outside it is refused, whichever
  component led out (``RUN/submitit -> /elsewhere``, a log linked to
  ``/etc/shadow``). :func:`check_inside` says the same of a path opened
  elsewhere (a folder, ``torch.load``'s file). One rule for every reader.
* :func:`read_bounded` reads at most ``max_bytes``; :func:`iter_lines`
  streams a file line by line with a cap per line; :func:`tail_lines` and
  :func:`read_tail` read backwards from the end, so ``logs -n 2`` of a
  1.5 GB log reads a few kilobytes.
* :func:`load_json` decodes JSON whose numbers are plausible (NaN, Infinity,
  integers of more than 18 digits and floats beyond +-1e18 become None) and
  whose nesting is at most ``MAX_JSON_DEPTH`` deep: deeper input (200 KB of
  ``[``) is a ValueError before it is parsed, so neither the parser nor any
  reader that walks the result recursively (``--json`` output, the summary's
  model, rich) can raise RecursionError. Every JSON reader of hpctrain's
  untrusted files (run directory, registry, metrics, packed index, index
  cache) decodes through it.
* :func:`real_path` resolves symlinks without ever raising: a loop
  (``a -> b -> a``) stays as far as it resolved and is then simply not a
  file or folder (``Path.resolve()`` raises ``RuntimeError`` for it, which a
  message quoting the target once turned into a traceback). Every resolve
  of a user's path (spec files, scripts, packages, folders, run dirs) uses it.
* :func:`printable` (the project's one escaper, ``hpctrain.errors``) and
  :func:`for_rich` make a string that came from a file safe to print: control
  characters (terminal escapes, newlines) are shown as ``\\x1b``, and rich
  markup (``[/]``) is escaped.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from hpctrain.errors import RunDirError, printable

MAX_JSON_BYTES = 8 << 20  # run.json, summary.json, a heartbeat, study.json: kilobytes when hpctrain wrote them
MAX_LINE_BYTES = 1 << 20  # one metrics.jsonl / registry line; longer ones are cut (and then fail to parse)
MAX_TAIL_BYTES = 8 << 20  # how far back tail_lines looks for its lines
BLOCK_BYTES = 1 << 16
MAX_MAGNITUDE = 1e18  # no count, time, rate or size hpctrain writes comes near this
_MAX_INT_DIGITS = 18
MAX_JSON_DEPTH = 64  # hpctrain's records nest a few levels; deeper input only serves to recurse a reader
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENERS = bytes.maketrans(b"{}", b"[]")


class RunFileError(RunDirError):
    """A run-directory file that is not a regular file, or larger than hpctrain ever writes it."""


class OutsideRunError(RunFileError):
    """A run-directory path that a symlink leads out of the run: not the run's, and not followed."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | Path, *, within: str | Path | None = None) -> IO[bytes]:
    """``path`` opened for binary reading if it is a regular file (inside ``within``, when given: the run's
    home); raises RunFileError (or OSError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RunFileError(
                f"{path}: {_kind(mode)}, not a regular file; not read",
                hint="hpctrain writes its run files as regular files; remove or replace this one",
            )
        if within is not None:
            check_inside(path, within, real=_fd_path(fd))
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def check_inside(path: str | Path, within: str | Path, *, real: str | None = None) -> None:
    """Raise RunFileError when ``path``, symlinks resolved (or ``real``, its known real path), lies outside
    the folder ``within``: a run directory's paths are never followed out of it."""
    real = os.path.realpath(path) if real is None else real
    root = os.path.realpath(within)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise OutsideRunError(
            f"{printable(path)} leads to {printable(real)}, outside the run directory {printable(root)}; not followed",
            hint="a run's files stay inside its directory: replace the symlink with the file or folder itself "
            "(to keep runs elsewhere, set output_dir there)",
        )


def real_path(path: str | Path) -> Path:
    """``path`` absolute, symlinks resolved as far as they resolve; never raises (see the module docstring)."""
    return Path(os.path.realpath(os.fspath(path)))


def _fd_path(fd: int) -> str | None:
    """The real path of an open descriptor (Linux); None where /proc cannot say (then the path is resolved)."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return real if real.startswith(os.sep) else None


def read_bounded(path: str | Path, max_bytes: int = MAX_JSON_BYTES, *, within: str | Path | None = None) -> bytes:
    """The whole of a regular file of at most ``max_bytes``; raises RunFileError (or OSError)."""
    with open_regular(path, within=within) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RunFileError(
            f"{path}: larger than {max_bytes} bytes, far more than hpctrain writes there; not read",
            hint="the file was replaced or damaged; move it away",
        )
    return data


def _int_or_none(text: str) -> int | None:
    return int(text) if len(text.lstrip("-")) <= _MAX_INT_DIGITS else None


def _float_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) and abs(value) <= MAX_MAGNITUDE else None


def load_json(data: bytes | str, max_depth: int = MAX_JSON_DEPTH, *, raw_numbers: bool = False) -> Any:
    """JSON with implausible numbers (NaN, Infinity, > 18 digits, beyond 1e18) as None; raises ValueError.

    Nesting deeper than ``max_depth`` is a ValueError too, found before parsing (see the module docstring).
    ``raw_numbers``: numbers as ``json`` decodes them (no Python call per number), for a hot reader
    that checks its fields itself (metrics lines).
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if nesting_exceeds(raw, max_depth):
        raise ValueError(f"JSON nested more than {max_depth} levels deep")
    try:
        if raw_numbers:
            return json.loads(data)
        return json.loads(data, parse_int=_int_or_none, parse_float=_float_or_none, parse_constant=lambda _: None)
    except RecursionError:  # cannot happen below max_depth; kept so no reader ever sees it
        raise ValueError("JSON nested too deeply") from None


def nesting_exceeds(raw: bytes, max_depth: int) -> bool:
    """Whether the brackets of JSON text ``raw`` (outside its strings) nest deeper than ``max_depth``.

    C-speed passes only: strings are blanked, everything but brackets dropped, then
    innermost pairs removed once per level, ``max_depth`` times at most. Text that
    is not balanced JSON may be misjudged; the parser refuses it anyway.
    """
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    brackets = _JSON_STRING.sub(b"", raw).translate(_OPENERS, _NOT_BRACKETS)
    for level in range(max_depth):
        shorter = brackets.replace(b"[]", b"")
        if not shorter:
            return False
        if len(shorter) == len(brackets):  # unbalanced: only its leading openers still count
            return level + len(brackets) - len(brackets.lstrip(b"[")) > max_depth
        brackets = shorter
    return True


def read_json(path: str | Path, max_bytes: int = MAX_JSON_BYTES, *, within: str | Path | None = None) -> Any:
    """A bounded JSON file decoded by :func:`load_json`; raises RunFileError, OSError or ValueError."""
    return load_json(read_bounded(path, max_bytes, within=within))


def plausible(value: Any) -> bool:
    """Whether a decoded number is one hpctrain could have written (finite, within +-1e18)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE  # False for NaN; an int of any size compares exactly


def json_safe(value: Any) -> Any:
    """``value`` with non-finite or implausible numbers as None, for ``--json`` output (always valid JSON)."""
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value if plausible(value) else None
    return value


def iter_lines(
    path: str | Path, *, max_line_bytes: int = MAX_LINE_BYTES, start: int = 0, within: str | Path | None = None
) -> Iterator[bytes]:
    """The lines of a regular file from byte ``start``, streamed, each with its newline if it had one.

    A line longer than ``max_line_bytes`` is cut there (and so no longer parses
    as JSON). Raises RunFileError or OSError when the file cannot be opened.
    """
    with open_regular(path, within=within) as handle:
        handle.seek(start)
        pending = b""
        while block := handle.read(BLOCK_BYTES * 16):
            pending += block
            lines = pending.split(b"\n")
            pending = lines.pop()
            for line in lines:
                yield line[:max_line_bytes] + b"\n"
            if len(pending) > max_line_bytes:  # the rest of this line is dropped as it arrives
                yield pending[:max_line_bytes]
                pending = _skip_rest_of_line(handle)
        if pending:
            yield pending[:max_line_bytes]


def _skip_rest_of_line(handle: IO[bytes]) -> bytes:
    """Read past the rest of an over-long line; return what follows its newline in the last block."""
    while block := handle.read(BLOCK_BYTES * 16):
        cut = block.find(b"\n")
        if cut >= 0:
            return block[cut + 1 :]
    return b""


def read_tail(path: str | Path, max_bytes: int, *, within: str | Path | None = None) -> bytes:
    """The last ``max_bytes`` of a regular file (all of a smaller one)."""
    with open_regular(path, within=within) as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - max_bytes))
        return handle.read(max_bytes)


def tail_lines(
    path: str | Path, count: int, max_bytes: int = MAX_TAIL_BYTES, *, within: str | Path | None = None
) -> tuple[bytes, int]:
    """(the last ``count`` lines, the file's size when read): read backwards in blocks, never the whole file.

    Looks back at most ``max_bytes``; lines that end further back than that
    are left out (what was found is returned from its first line start).
    """
    with open_regular(path, within=within) as handle:
        size = handle.seek(0, os.SEEK_END)
        if count <= 0:
            return b"", size
        data, position = b"", size
        while position > 0 and size - position < max_bytes:
            step = min(BLOCK_BYTES, position, max_bytes - (size - position))
            position -= step
            handle.seek(position)
            data = handle.read(step) + data
            if data.count(b"\n", 0, len(data) - 1) >= count:
                break
    body = data[:-1] if data.endswith(b"\n") else data
    lines = body.split(b"\n")
    if position > 0:
        lines = lines[1:]  # the first piece may be the end of an earlier line
    return b"\n".join(lines[-count:]) + (b"\n" if data.endswith(b"\n") and lines else b""), size


def copy_out(
    path: str | Path, start: int, out: TextIO, max_bytes: int | None = None, *, within: str | Path | None = None
) -> int:
    """Write the bytes of a regular file from ``start`` (at most ``max_bytes``) to ``out``, in blocks.

    Returns the offset after the last byte written. A missing file writes nothing.
    """
    try:
        handle = open_regular(path, within=within)
    except FileNotFoundError:
        return start
    with handle:
        size = handle.seek(0, os.SEEK_END)
        if size < start:  # replaced by a shorter file: start again
            start = 0
        handle.seek(start)
        left = size - start if max_bytes is None else min(max_bytes, size - start)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character split between blocks
        while left > 0 and (block := handle.read(min(BLOCK_BYTES * 16, left))):
            out.write(decoder.decode(block))
            start += len(block)
            left -= len(block)
        out.write(decoder.decode(b"", final=True))
    out.flush()
    return start


def for_rich(value: object) -> str:
    """A string from a file made safe for rich markup: :func:`printable`, then ``[`` escaped."""
    from rich.markup import escape

    return escape(printable(value))

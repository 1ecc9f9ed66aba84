"""How hpctrain writes a file: created exclusively or replaced atomically, never through a link. Torch-free.

The rule, for every file hpctrain writes (run files, specs ``init`` drafts,
logs, markers, requests): a folder it writes into may be shared, and anyone
who can write there can plant a symlink under the name hpctrain is about to
write (``jobs/mine.yaml -> ~victim/.bashrc``). A plain ``open(path, "w")``
follows that link and overwrites the target with the victim's rights. So:

* :func:`write_atomic` writes a temporary file created with ``O_EXCL`` (by
  ``mkstemp``) beside the destination, fsyncs it, then either replaces the
  name with ``os.replace`` (a symlink there is replaced, never written
  through) or, ``exclusive=True``, gives it the name with ``os.link``, which
  fails on any existing name, a dangling link included. Readers see the old
  file or the new one, never half.
* :func:`open_append` opens a log or a line file for appending with
  ``O_NOFOLLOW``: a symlink under its name is refused (``ELOOP``).
* An ``OSError`` from either names the file it was writing (``ENOSPC``
  included: "No space left on device" alone does not say which disk).

``tests/unit/test_contract_file_writes.py`` holds the rule for every writer
in ``hpctrain/`` (it fails on a plain write mode outside this module).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO

from hpctrain.errors import printable

_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def _named(exc: OSError, path: str | Path) -> OSError:
    """``exc`` with the file it was about (its errno and message kept)."""
    if exc.filename is not None:
        return exc
    return type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno or 0), str(path))


def write_temporary(beside: str | Path, data: str | bytes, *, suffix: str = ".tmp") -> Path:
    """A new file (``O_EXCL``, mode 0600) holding ``data``, fsynced, in ``beside``'s folder under a name
    nobody could predict; the caller renames or removes it."""
    beside = Path(beside)
    beside.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{beside.name}.", suffix=suffix, dir=beside.parent)
    except OSError as exc:
        raise _named(exc, beside) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _named(exc, beside) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def copy_atomic(source: str | Path | IO[bytes], path: str | Path, *, mode: int | None = None) -> None:
    """Copy ``source`` (a file's path, or a file open for reading) to ``path`` through a fresh temporary
    file, then replace the name (not fsynced: for many files, such as a staged dataset or a code snapshot,
    whose completeness something else records). ``mode``: default the umask's, as a plain copy gets."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        os.fchmod(fd, user_file_mode() if mode is None else mode)
        with os.fdopen(fd, "wb") as dst:
            if isinstance(source, (str, Path)):
                with open(source, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
            else:
                shutil.copyfileobj(source, dst, 1 << 20)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _named(exc, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: str | bytes, *, exclusive: bool = False, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` through a fresh temporary file (see the module docstring).

    ``exclusive``: the name must be free (FileExistsError otherwise, for a
    symlink too); else whatever has the name is replaced. ``mode``: the
    file's permissions (default: ``mkstemp``'s 0600, hpctrain's run files).
    """
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = write_temporary(path, raw)
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        if exclusive:
            _link_new(str(tmp), path, raw, mode)
        else:
            os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _named(exc, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def _link_new(tmp: str, path: Path, raw: bytes, mode: int | None) -> None:
    """Give the written ``tmp`` the free name ``path``; where the filesystem has no hard links, create
    ``path`` with ``O_EXCL`` (which never follows a link either) and write it there."""
    try:
        os.link(tmp, path, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600 if mode is None else mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
    os.unlink(tmp)


def user_file_mode() -> int:
    """0666 less the umask: the mode ``open(path, "w")`` would give a user's own file (a spec ``init`` writes)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)  # no /proc: read it by setting it (and back at once)
    os.umask(umask)
    return 0o666 & ~umask


def open_append(path: str | Path, mode: int = 0o644) -> int:
    """A descriptor appending to ``path`` (created with ``mode`` if missing); OSError ``ELOOP`` for a symlink."""
    try:
        return os.open(path, _APPEND_FLAGS, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symlink; hpctrain never writes through one", str(path)) from None
        raise _named(exc, path) from None


def open_resumable(path: str | Path) -> int:
    """A descriptor reading and writing ``path`` (created 0600 if missing), refused for a symlink: a partial
    copy that a later start goes on with."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _named(exc, path) from None


def write_failure(exc: OSError, where: str | Path) -> str:
    """What a failed write says: the file, the reason, and for a full disk or quota which file system and
    how much room it has left (``where``: the folder written into, when the error names no file)."""
    target = exc.filename if exc.filename is not None else where
    text = f"cannot write {printable(target)}: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        folder = Path(target)
        while not folder.is_dir() and folder.parent != folder:
            folder = folder.parent
        try:
            usage = shutil.disk_usage(folder)
            text += f" (the file system holding {printable(folder)} has {usage.free / 2**20:.0f} MiB free"
            text += f" of {usage.total / 2**30:.1f} GiB)"
        except OSError:
            pass
    return text


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory (a directory's fsync makes a rename inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

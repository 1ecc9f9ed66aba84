"""Which file system a path lives on, whether compute nodes can share it, and how fast it serves files. Torch-free.

A run directory, a dataset or a virtual environment on a login node's local
disk or ``tmpfs`` is invisible to the compute nodes: the job fails after its
queue wait. The mount table (``/proc/self/mounts``) says which file system
holds a path; its type says whether it is shared. Pure over the table's text
except :func:`mount_of`, which reads it.

A training job opens and stats one file per sample: ImageNet's 1.28M files
at thousands of images/s load the metadata server more than the disks.
:func:`measure_file_rate` measures that rate on a small random sample
(bounded in files, folders listed and time), for ``hpctrain doctor``.
"""

from __future__ import annotations

import os
import random
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from hpctrain.contract.runfiles import real_path
from hpctrain.dataset import walk

MOUNTS_FILE = "/proc/self/mounts"

# Network and cluster file systems every node of a cluster can mount.
SHARED_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "cifs",
        "smb3",
        "ceph",
        "cephfs",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "panfs",
        "wekafs",
        "fuse.weka",
        "afs",
        "pvfs2",
        "orangefs",
        "fuse.sshfs",
        "9p",
        "virtiofs",
        "fuse.juicefs",
    }
)
# Memory-backed: gone at reboot, and one copy per machine.
MEMORY_TYPES = frozenset({"tmpfs", "ramfs", "devtmpfs"})

Sharing = Literal["shared", "local", "memory"]


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    device: str

    @property
    def sharing(self) -> Sharing:
        if self.fstype in MEMORY_TYPES:
            return "memory"
        return "shared" if self.fstype in SHARED_TYPES else "local"


def _unescape(field: str) -> str:
    """The mount table writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def parse_mounts(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            mounts.append(Mount(point=_unescape(fields[1]), fstype=fields[2], device=_unescape(fields[0])))
    return mounts


def mount_for(path: str | Path, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path`` (an absolute, resolved path): the longest matching mount point, last wins."""
    target = str(path)
    best: Mount | None = None
    for mount in mounts:
        point = mount.point.rstrip("/") or "/"
        inside = target == point or target.startswith(point + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = mount
    return best


def existing_ancestor(path: str | Path) -> Path:
    """``path`` itself or its nearest existing parent (a run folder is created at submit)."""
    current = Path(os.path.abspath(os.path.expanduser(str(path))))
    while not current.exists() and current != current.parent:
        current = current.parent
    return real_path(current)


def mount_of(path: str | Path, mounts_text: str | None = None) -> Mount | None:
    """The mount holding ``path`` (or the nearest existing parent), from this machine's mount table."""
    if mounts_text is None:
        try:
            mounts_text = Path(MOUNTS_FILE).read_text()
        except OSError:
            return None
    return mount_for(existing_ancestor(path), parse_mounts(mounts_text))


# ------------------------------------------------------------------ how fast a tree serves files

SAMPLE_CLASS_FOLDERS = 64  # class folders listed per measurement
ENTRIES_PER_FOLDER = 4096  # names read from one folder at most (a flat million-file folder stays cheap)
FIRST_BLOCK = 64 * 1024  # bytes read per opened file: the JPEG header and a little more


@dataclass(frozen=True)
class FileRate:
    """What :func:`measure_file_rate` saw: ``stats`` files stat'ed in ``stat_s`` wall seconds, then
    ``opens`` other files opened and read (first block) in ``open_s``, each phase by ``threads`` threads."""

    path: str
    fstype: str
    threads: int
    stats: int
    stat_s: float
    opens: int
    open_s: float
    bytes_read: int
    stat_ms: tuple[float, float]  # p50, p99 latency of one stat
    open_ms: tuple[float, float]  # p50, p99 latency of one open + first read + close
    classes: int  # class folders under the split
    files_estimate: int  # files in the split, estimated from the folders listed
    stopped_by: str  # "files", "time" or "tree" (the tree had fewer files than asked)

    @property
    def stats_per_s(self) -> float:
        return self.stats / self.stat_s if self.stat_s > 0 else 0.0

    @property
    def opens_per_s(self) -> float:
        return self.opens / self.open_s if self.open_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Samples one node can fetch per second when each takes one stat and one open."""
        if self.stats_per_s <= 0 or self.opens_per_s <= 0:
            return 0.0
        return 1.0 / (1.0 / self.stats_per_s + 1.0 / self.opens_per_s)

    @property
    def mb_per_s(self) -> float:
        return self.bytes_read / 1e6 / self.open_s if self.open_s > 0 else 0.0

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out.update(
            stat_s=round(self.stat_s, 4),
            open_s=round(self.open_s, 4),
            stats_per_s=round(self.stats_per_s, 1),
            opens_per_s=round(self.opens_per_s, 1),
            samples_per_s=round(self.samples_per_s, 1),
            mb_per_s=round(self.mb_per_s, 2),
        )
        return out

    @classmethod
    def from_json(cls, data: object) -> FileRate | None:
        """A probe's report back into a FileRate; None when it is not one (the node's output is untrusted)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                path=str(data["path"])[:4096],
                fstype=str(data["fstype"])[:64],
                threads=int(data["threads"]),
                stats=int(data["stats"]),
                stat_s=float(data["stat_s"]),
                opens=int(data["opens"]),
                open_s=float(data["open_s"]),
                bytes_read=int(data["bytes_read"]),
                stat_ms=(float(data["stat_ms"][0]), float(data["stat_ms"][1])),
                open_ms=(float(data["open_ms"][0]), float(data["open_ms"][1])),
                classes=int(data["classes"]),
                files_estimate=int(data["files_estimate"]),
                stopped_by=str(data["stopped_by"])[:16],
            )
        except (KeyError, IndexError, TypeError, ValueError, OverflowError):
            return None

    def describe(self) -> str:
        return (
            f"{self.opens_per_s:,.0f} opens/s (p50 {self.open_ms[0]:.2f} ms, p99 {self.open_ms[1]:.2f} ms), "
            f"{self.stats_per_s:,.0f} stats/s (p50 {self.stat_ms[0]:.2f} ms, p99 {self.stat_ms[1]:.2f} ms), "
            f"{self.mb_per_s:.1f} MB/s; {self.stats + self.opens} files, {self.threads} threads, {self.fstype}"
        )


def _percentiles_ms(latencies: list[float]) -> tuple[float, float]:
    if not latencies:
        return (0.0, 0.0)
    ordered = sorted(latencies)
    return tuple(round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3) for q in (0.5, 0.99))  # type: ignore[return-value]


def entry_kind(entry: os.DirEntry[str]) -> str:
    """'dir', 'file' or 'other' by the rules of the job's own walk (``hpctrain.dataset.walk``): a FIFO, a
    device, a dangling or looping link, or one onto a pseudo file system (/proc, /sys) is 'other'."""
    return walk.entry_kind(entry)


def _sample_files(split: Path, max_files: int, rng: random.Random) -> tuple[list[str], int, int]:
    """A random sample of up to ``max_files`` regular-looking files from random class folders, the
    number of class folders, and the split's estimated file count. Never lists more than
    ``SAMPLE_CLASS_FOLDERS`` folders of ``ENTRIES_PER_FOLDER`` names each."""
    folders: list[str] = []
    loose: list[str] = []
    with os.scandir(split) as entries:
        for index, entry in enumerate(entries):
            if index >= ENTRIES_PER_FOLDER * 16:
                break
            kind = entry_kind(entry)  # below a class folder nothing is walked: no symlink loop can recur
            if kind == "dir":
                folders.append(entry.path)
            elif kind == "file":
                loose.append(entry.path)
    chosen = rng.sample(folders, min(len(folders), SAMPLE_CLASS_FOLDERS))
    per_folder = max(1, -(-max_files // max(1, len(chosen))))
    files, listed = list(loose), []
    for folder in chosen:
        names: list[str] = []
        try:
            with os.scandir(folder) as entries:
                for index, entry in enumerate(entries):
                    if index >= ENTRIES_PER_FOLDER:
                        break
                    if entry_kind(entry) == "file":
                        names.append(entry.path)
        except OSError:
            continue
        listed.append(len(names))
        files += rng.sample(names, min(len(names), per_folder))
    estimate = len(loose) + (round(sum(listed) / len(listed) * len(folders)) if listed else 0)
    rng.shuffle(files)
    return files[:max_files], len(folders), estimate


def measure_file_rate(
    root: str | Path,
    *,
    max_files: int = 2000,
    max_s: float = 10.0,
    threads: int = 8,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    mounts_text: str | None = None,
) -> FileRate:
    """Stats/s and opens/s on a random sample of ``root``'s files, as loader workers would ask.

    Half the sample is stat'ed, the other half opened and read (the first
    ``FIRST_BLOCK`` bytes, page cache dropped first), each phase by
    ``threads`` threads and within ``max_s / 2`` seconds of ``clock``. Random
    files, so a second run mostly meets files it did not touch; the client's
    cache of what it did touch can still flatter a repeated run.
    Raises OSError when ``root`` cannot be listed.
    """
    from concurrent.futures import ThreadPoolExecutor

    split = Path(root)
    files, classes, estimate = _sample_files(split, max_files, rng or random.Random())
    to_stat, to_open = files[::2], files[1::2]
    threads = max(1, threads)

    late: list[str] = []  # files left untouched when a phase ran out of time

    def run_phase(paths: list[str], one: Callable[[str], int]) -> tuple[int, float, int, list[float]]:
        deadline = clock() + max_s / 2
        latencies: list[float] = []
        sizes: list[int] = []

        def timed(path: str) -> None:
            if clock() > deadline:
                late.append(path)
                return
            start = clock()
            size = one(path)
            if size >= 0:
                latencies.append(clock() - start)
                sizes.append(size)

        start = clock()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(timed, paths))
        return len(latencies), clock() - start, sum(sizes), latencies

    stats, stat_s, _, stat_lat = run_phase(to_stat, _stat_one)
    opens, open_s, read, open_lat = run_phase(to_open, _open_one)
    stopped = "time" if late else ("files" if len(files) >= max_files else "tree")
    mount = mount_of(split, mounts_text)
    return FileRate(
        path=str(split),
        fstype=mount.fstype if mount else "unknown",
        threads=threads,
        stats=stats,
        stat_s=stat_s,
        opens=opens,
        open_s=open_s,
        bytes_read=read,
        stat_ms=_percentiles_ms(stat_lat),
        open_ms=_percentiles_ms(open_lat),
        classes=classes,
        files_estimate=estimate,
        stopped_by=stopped,
    )


def _stat_one(path: str) -> int:
    """0 for a regular file, -1 for anything else (a vanished file, a FIFO, a dangling link)."""
    try:
        return 0 if stat.S_ISREG(os.stat(path).st_mode) else -1
    except OSError:
        return -1


def _open_one(path: str) -> int:
    """Bytes of the first block of a regular file; -1 when it is not one or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return -1
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return -1
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return len(os.read(fd, FIRST_BLOCK))
    except OSError:
        return -1
    finally:
        os.close(fd)

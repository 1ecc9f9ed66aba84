"""The Slurm end-to-end tier: every test here runs against a real multi-node cluster.

The session fixture `slurm_cluster` starts the cluster with
`tests/cluster/slurm-cluster up` (2 nodes, proctrack/cgroup, Slurm
$HPCTRAIN_TEST_SLURM: 22.05 by default, or 24.11 / 26.05) and stops it at the
end of the session, unless it was already up before the session or
HPCTRAIN_KEEP_CLUSTER=1. Without root or namespaces, or where that Slurm
version's root filesystem cannot be made (no package registry), the tier is
skipped, except under CI (env CI set), where that is a failure: CI must run
this tier. Tests marked `slurm_contract` are the subset every version must pass
(`-m slurm_contract`).

$HPCTRAIN_SLURM_INSTANCE picks the cluster instance (0 by default; scripts/test.sh runs the side
releases on instance 1 beside 24.11 on instance 0): tests name nodes from `slurm_cluster.nodes`.

Tests marked `slurm_shared` may run beside each other on the one cluster: they
do not restart, resize, slow or kill any of it, preempt through the `urgent`
partition, read the whole queue, or time anything a neighbour's job could
slow. scripts/test.sh runs them two at a time (pytest-xdist, `-n 2 --dist
loadfile`), then the others alone. Under xdist each worker is a session of its
own: the first one brings the cluster up (the others wait on a lock and find it
up), and none brings it down (scripts/test.sh does, between versions).

Tests marked `slurm_side` must run alone but say nothing release-specific: CI runs them on the side
releases' cluster (26.05, instance 1, after its contract subset) instead of on 24.11's, whose alone half is
CI's critical path while the side stream waits with minutes to spare (docs/testing.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpctrain.contract.slurm import RELEASE_AFTER_REQUEUE_S
from hpctrain.contract.slurm_answers import parse_sacct_states
from tests.cluster_scripts import load_cluster_script

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
SCRIPT = REPO_ROOT / "tests" / "cluster" / "slurm-cluster"
UP_TIMEOUT_S = 300  # includes an apt-get install on a bare machine
# Building a newer version's root filesystem (first use only) adds ~30 s with a good mirror.
FIRST_UP_TIMEOUT_S = 1800
SLURM_VERSION_ENV = "HPCTRAIN_TEST_SLURM"
# slurm-cluster's exit status when the version's root filesystem cannot be made here.
ROOTFS_UNAVAILABLE = 4


_SCRIPT_MODULE = load_cluster_script("slurm-cluster")  # it owns the list of offered Slurm versions
DEFAULT_SLURM: str = _SCRIPT_MODULE.DEFAULT_SLURM  # type: ignore[attr-defined]
TEST_USER: str = _SCRIPT_MODULE.TEST_USER  # type: ignore[attr-defined]
SLURM_VERSIONS: dict[str, str | None] = _SCRIPT_MODULE.SLURM_VERSIONS  # type: ignore[attr-defined]
# This machine's address on the nodes' bridge: where a server the test starts here (a login node's, such as a
# tracking server) is reached from the nodes, which have network namespaces of their own (127.0.0.1 is theirs).
HOST_ADDR: str = _SCRIPT_MODULE.HOST_ADDR  # type: ignore[attr-defined]
# The cluster instance this session uses ($HPCTRAIN_SLURM_INSTANCE, 0 by default; scripts/test.sh runs the side
# releases' contract subsets on instance 1 beside 24.11's tests on 0): its state dir, node names and clients.
INSTANCE: int = _SCRIPT_MODULE.INSTANCE  # type: ignore[attr-defined]
DEFAULT_STATE_DIR: str = _SCRIPT_MODULE.DEFAULT_STATE_DIR  # type: ignore[attr-defined]
WRAPPER_DIR: Path = _SCRIPT_MODULE.WRAPPER_DIR  # type: ignore[attr-defined]


def node_names(count: int) -> list[str]:
    """The names of a ``count``-node cluster of this instance (n1.. on instance 0, m1.. on instance 1)."""
    return _SCRIPT_MODULE.node_names(count)  # type: ignore[attr-defined, no-any-return]


# sacct's terminal states; "CANCELLED by 0" is normalised to "CANCELLED".
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)

_cluster: SlurmCluster | None = None  # for the failure-report hook


class SlurmCommandError(subprocess.CalledProcessError):
    """A Slurm client command failed; str() shows its output, unlike the base class."""

    def __str__(self) -> str:
        return (
            f"{' '.join(map(str, self.cmd))} exited {self.returncode}\n"
            f"stdout: {(self.stdout or '').strip()}\nstderr: {(self.stderr or '').strip()}"
        )


@dataclass
class SlurmCluster:
    """Handle on the running test cluster, for tests and their subprocesses."""

    state_dir: Path
    nodes: list[str]
    env: dict[str, str]
    proctrack: str = "cgroup"
    slurm: str = DEFAULT_SLURM
    apptainer: bool = False
    shared: Path | None = None
    user: str = TEST_USER
    script: Path = field(default=SCRIPT)

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (sinfo, sbatch, srun, sacct, ...) with the cluster's env."""
        proc = subprocess.run(
            [str(a) for a in args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise SlurmCommandError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    def sbatch(self, *args: str) -> str:
        """Submit with `sbatch --parsable ARGS`; returns the job id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def job_states(self, job_id: str) -> list[str]:
        """sacct's allocation states of a job (one per array task), normalised, read by the product's parser.

        A job that lost a node while running (``--no-kill``) has two allocation rows with its id: the
        allocation before Slurm removed the node (RESIZING, for good) and the one after; the later row
        is the job's state (seen on 22.05 when the node was marked DOWN during the run)."""
        proc = self.run("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", str(job_id), check=False)
        if proc.returncode != 0:
            return []
        return list(parse_sacct_states(proc.stdout).values())

    def wait_state(self, job_id: str, states: Iterable[str] = FINAL_STATES, timeout: float = 60) -> str:
        """Poll sacct until the job (every array task) is in one of `states`; return that state.

        sacct lags squeue by about a second after a job ends and shows nothing
        right after submission, so an empty answer just means "ask again".
        """
        wanted = {s.upper() for s in states}
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while time.monotonic() < deadline:
            seen = self.job_states(job_id)
            if seen and all(s in wanted for s in seen):
                return seen[0]
            time.sleep(0.2)
        raise AssertionError(
            f"job {job_id} not in {sorted(wanted)} after {timeout}s (sacct says {seen or 'nothing'})\n"
            f"{self.run('squeue', '-a', '-j', str(job_id), check=False).stdout}\n"
            f"{self.log_tail(30)}"
        )

    def release(self, job_id: str) -> None:
        """Start a requeued job now; Slurm otherwise holds it ~120 s (Reason=BeginTime; 22.05 to 26.05).
        Called once the job was seen requeued; waits as hpctrain's own release does (22.05 fails a job
        released within the second of its requeue: ``contract.slurm.RELEASE_AFTER_REQUEUE_S``)."""
        time.sleep(RELEASE_AFTER_REQUEUE_S)
        self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def configure(
        self, nodes: int = 2, proctrack: str = "cgroup", shared: Path | None = None, apptainer: bool = False
    ) -> None:
        """The whole cluster as one file needs it (defaults: the 2-node cluster every other file runs on):
        one ``slurm-cluster up``, a no-op when it is so and healthy, a restart otherwise (~20 s). A file that
        needs another shape says so (:data:`CLUSTER_SHAPES`) and calls this from its module fixture; it does
        not change the cluster back afterwards: the next file that needs the default asks for it.

        Where Apptainer's root filesystem cannot be made (no package registry), the calling test is
        skipped, or fails under CI."""
        if proctrack not in ("cgroup", "linuxproc"):
            raise ValueError(f"proctrack must be 'cgroup' or 'linuxproc', not {proctrack!r}")
        self.nodes = node_names(nodes)
        self.proctrack, self.shared = proctrack, shared
        if not apptainer:
            self.apptainer = False
            _script("up", *self._up_args())
            return
        up = _script("up", *self._up_args(apptainer=True), timeout=FIRST_UP_TIMEOUT_S, ok=(0, ROOTFS_UNAVAILABLE))
        if up.returncode == ROOTFS_UNAVAILABLE:
            _skip_or_fail(f"Apptainer is not available here: {up.stderr.strip()}")
        self.apptainer = True

    def set_proctrack(self, mode: str) -> None:
        """Restart the cluster with ProctrackType=proctrack/<mode>; no-op if already so."""
        if mode not in ("cgroup", "linuxproc"):
            raise ValueError(f"proctrack must be 'cgroup' or 'linuxproc', not {mode!r}")
        _script("up", *self._up_args(proctrack=mode))
        self.proctrack = mode

    def resize(self, nodes: int) -> None:
        """Restart the cluster with ``nodes`` nodes (and every dead daemon started again); no-op if so and healthy."""
        self.nodes = node_names(nodes)
        _script("up", *self._up_args())

    def user_dir(self, name: str) -> Path:
        """A new folder of the unprivileged test user (in its home: pytest's own temp dirs are root's, 0700)."""
        account = pwd.getpwnam(self.user)
        folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=account.pw_dir))
        os.chown(folder, account.pw_uid, account.pw_gid)
        return folder

    def use_apptainer(self) -> None:
        """The 2-node cluster with the real Apptainer on every node (``up --apptainer``): :meth:`configure`."""
        self.configure(apptainer=True)

    def build_image(self, out: Path) -> Path:
        """``slurm-cluster image OUT``: a small SIF image for the jobs (the venv is bound in)."""
        argv = ["image", "--state-dir", str(self.state_dir), str(out)]
        built = _script(*argv, timeout=FIRST_UP_TIMEOUT_S, ok=(0, ROOTFS_UNAVAILABLE))
        if built.returncode == ROOTFS_UNAVAILABLE:
            _skip_or_fail(f"the Apptainer image cannot be built here: {built.stderr.strip()}")
        return out

    def use_shared(self, folder: Path | None) -> None:
        """The 2-node cluster with ``folder`` served to every node over sshfs (``up --shared``): :meth:`configure`.

        Where sshfs or the OpenSSH server is not installed, the calling test is skipped, or fails under CI.
        """
        tools: dict[str, str] = _SCRIPT_MODULE.SHARED_TOOLS  # type: ignore[attr-defined]
        missing = sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})
        if folder is not None and missing:
            fix: str = _SCRIPT_MODULE.SHARED_FIX  # type: ignore[attr-defined]
            _skip_or_fail(f"--shared: {', '.join(missing)} not installed; {fix}")
        self.configure(shared=folder)

    def sftp_log(self, node: str) -> Path:
        """The sftp server's log of ``node``'s mount (``up --shared``): one line per open, listing, rename."""
        return _SCRIPT_MODULE.sftp_log(_SCRIPT_MODULE.Paths(self.state_dir), node)  # type: ignore[attr-defined]

    def _up_args(self, proctrack: str | None = None, apptainer: bool | None = None) -> list[str]:
        apptainer = self.apptainer if apptainer is None else apptainer
        args = _up_args(self.slurm, len(self.nodes), proctrack or self.proctrack, self.state_dir)
        shared = ["--shared", str(self.shared)] if self.shared else []
        return [*args, *(["--apptainer"] if apptainer else []), *shared]

    def stop_controller(self) -> None:
        """Kill slurmctld (as a crash or an outage would); :meth:`repair` brings it back."""
        pid = int((self.state_dir / "run" / "slurmctld.pid").read_text().split()[0])
        os.kill(pid, 15)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)

    def repair(self) -> None:
        """Start whatever daemon is missing (``slurm-cluster up`` repairs a partly-up cluster)."""
        _script("up", *self._up_args())

    def log_tail(self, n: int = 50) -> str:
        """The last `n` lines of every daemon log, for failure messages."""
        daemons = ["slurmctld", *(f"slurmd-{node}" for node in self.nodes), "slurmdbd", "mariadb", "munged"]
        parts = []
        for daemon in daemons:
            path = self.state_dir / "log" / f"{daemon}.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-n:]
                parts.append(f"===== {path} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(parts) or f"(no logs in {self.state_dir / 'log'})"

    def processes_with_env(self, key: str, value: str) -> list[int]:
        """PIDs of live processes (on any node: namespaces share the PID space) with key=value."""
        needle = f"{key}={value}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found.append(int(entry.name))
        return sorted(found)


def _script(*args: str, timeout: float = UP_TIMEOUT_S, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    """Run tests/cluster/slurm-cluster (stdlib only, so any python3 runs it)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if proc.returncode not in ok:
        raise RuntimeError(f"slurm-cluster {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def _up_args(slurm: str, nodes: int, proctrack: str, state_dir: Path) -> list[str]:
    return ["--slurm", slurm, "--nodes", str(nodes), "--proctrack", proctrack, "--state-dir", str(state_dir)]


def _why_no_cluster() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (namespaces, /etc/hosts)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create network/UTS namespaces: {probe.stderr.strip()}"
    return None


def _client_env(state_dir: Path) -> dict[str, str]:
    # Drop SLURM_* of an enclosing job (CI may itself run under Slurm), keep our own conf.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(state_dir / "etc" / "slurm.conf")
    if INSTANCE != 0:  # this instance's clients before instance 0's wrappers in /usr/local/bin
        env["PATH"] = os.pathsep.join(p for p in (str(WRAPPER_DIR), env.get("PATH")) if p)
    # Jobs import hpctrain and tests.* from this checkout: sbatch exports the environment.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the Slurm tier, but {reason}", pytrace=False)
    pytest.skip(reason)


def _xdist_worker() -> bool:
    """Whether this session is one of several pytest-xdist workers sharing the cluster."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


@contextlib.contextmanager
def _up_lock(state_dir: Path) -> Iterator[None]:
    """Held while a session checks and brings up the cluster (beside the state dir: `down` removes that)."""
    lock = state_dir.parent / f".{state_dir.name}.up.lock"
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _keep_cluster() -> bool:
    return os.environ.get("HPCTRAIN_KEEP_CLUSTER", "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    wanted = os.environ.get(SLURM_VERSION_ENV, "")
    if wanted and wanted not in SLURM_VERSIONS:
        raise pytest.UsageError(
            f"{SLURM_VERSION_ENV}={wanted} is not offered; choose one of {', '.join(SLURM_VERSIONS)}"
        )
    config.addinivalue_line("markers", "slurm: end-to-end test against the Slurm test cluster")
    config.addinivalue_line(
        "markers", "slurm_contract: the Slurm tests every supported Slurm version must pass (the CI matrix's subset)"
    )
    config.addinivalue_line(
        "markers", "shared_fs: data and output_dir on a network mount (`slurm-cluster up --shared`, sshfs)"
    )
    config.addinivalue_line(
        "markers",
        "slurm_shared: safe beside other slurm_shared tests on the same cluster at once (scripts/test.sh: -n 2)",
    )
    config.addinivalue_line(
        "markers",
        "slurm_side: runs alone on the side releases' cluster (Slurm 26.05, instance 1) instead of on 24.11's "
        "(scripts/test.sh): a release-neutral test that must run alone",
    )


# pytest-timeout's bound on one Slurm test (setup.cfg's 600 s is the other tiers'). A Slurm test's own waits are
# bounded, and do not count a run's time in the queue or its tasks' visible work (stop_helpers.wait_for, up to
# 300 s each); this is the last guard, against a call that blocks without a bound. The tracking test took 554 s
# of 600 in rehearsal 32, on a machine 2-4x slower than usual.
SLURM_TEST_TIMEOUT_S = 1200


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items: mark only ours.
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.slurm)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(SLURM_TEST_TIMEOUT_S))
    items[:] = sorted(items, key=_shape_rank)  # stable: a file's tests keep their order


def current_cluster() -> SlurmCluster | None:
    """This session's cluster while it is up (helpers that have no fixture: ``stop_helpers.wait_for``)."""
    return _cluster


@pytest.fixture(scope="session", autouse=True)
def slurm_cluster() -> Iterator[SlurmCluster]:
    global _cluster
    reason = _why_no_cluster()
    if reason:
        _skip_or_fail(reason)

    slurm = os.environ.get(SLURM_VERSION_ENV, "") or DEFAULT_SLURM
    state_dir = Path(os.environ.get("HPCTRAIN_SLURM_STATE", DEFAULT_STATE_DIR)).resolve()
    nodes = node_names(2)
    with _up_lock(state_dir):  # xdist's workers start at once: one brings the cluster up, the others find it up
        status = _script("status", "--state-dir", str(state_dir), timeout=60, ok=(0, 1, 3))
        was_up = status.returncode == 0 and f"slurm={slurm} " in status.stdout
        try:
            up_args = _up_args(slurm, len(nodes), "cgroup", state_dir)
            up = _script("up", *up_args, timeout=FIRST_UP_TIMEOUT_S, ok=(0, ROOTFS_UNAVAILABLE))
        except RuntimeError as exc:
            if not _keep_cluster() and not _xdist_worker():
                _script("down", "--state-dir", str(state_dir), timeout=120)
            pytest.fail(str(exc), pytrace=False)
    if up.returncode == ROOTFS_UNAVAILABLE:
        _skip_or_fail(f"Slurm {slurm} is not available here: {up.stderr.strip()}")

    _cluster = SlurmCluster(state_dir=state_dir, nodes=nodes, env=_client_env(state_dir), slurm=slurm)
    if INSTANCE != 0:  # what a test runs without the cluster's env (submitit's own sbatch) finds this instance too
        os.environ.update({key: _cluster.env[key] for key in ("SLURM_CONF", "PATH")})
    if not _xdist_worker():  # a session alone on the cluster starts with an empty queue
        _cancel_all(_cluster, "jobs an earlier session left queued")
    try:
        yield _cluster
    finally:
        _cluster = None
        if _keep_cluster() or was_up or _xdist_worker():
            print(
                f"\nslurm test cluster left up (state dir {state_dir}); "
                f"stop it with: {SCRIPT} down --state-dir {state_dir}"
            )
        else:
            _script("down", "--state-dir", str(state_dir), timeout=120)


# The cluster shapes a file may ask for with a module-level ``CLUSTER_SHAPE``, in the order the files run:
# the files on the default 2-node cluster first, then each shape's files together, so that each shape
# costs one restart, and nothing is changed back at a file's end (the session ends, or the next file that
# needs the default asks for it). A file that changes the cluster for one test only changes it back itself.
CLUSTER_SHAPES = ("three nodes", "five nodes", "linuxproc", "shared", "apptainer")


def _shape_rank(item: pytest.Item) -> int:
    shape = getattr(item.module, "CLUSTER_SHAPE", None) if isinstance(item, pytest.Function) else None
    if shape is not None and shape not in CLUSTER_SHAPES:
        raise pytest.UsageError(f"{item.nodeid}: CLUSTER_SHAPE {shape!r} is not one of {CLUSTER_SHAPES}")
    return 0 if shape is None else 1 + CLUSTER_SHAPES.index(shape)


@pytest.fixture(scope="module", autouse=True)
def the_cluster_a_file_needs(request: pytest.FixtureRequest, slurm_cluster: SlurmCluster) -> None:
    """A file without a ``CLUSTER_SHAPE`` runs on the default cluster, healthy (a node an earlier file
    killed is started again); a file with one sets it up in its own module fixture. Under xdist (the
    shared half) no file changes the cluster, and the workers leave it alone."""
    if getattr(request.module, "CLUSTER_SHAPE", None) is None and not _xdist_worker():
        slurm_cluster.configure()


@pytest.fixture(scope="module", autouse=True)
def no_job_outlives_its_file(slurm_cluster: SlurmCluster) -> Iterator[None]:
    """Cancel what a file's failed test left queued, so its failure does not become the next file's.

    Tests that care assert an empty queue themselves; this only stops the cascade. Under xdist the queue
    holds the other workers' jobs too: the leftovers are only named (the next exclusive session cancels them).
    """
    yield
    if _xdist_worker():
        left = slurm_cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if left:
            print(f"\njobs in the queue after this file (this worker's or another's): {' '.join(left)}")
        return
    _cancel_all(slurm_cluster, "jobs a failed test left queued")


def _cancel_all(cluster: SlurmCluster, what: str) -> None:
    """Cancel every queued job and wait (up to 60 s) until the queue is empty."""
    left = cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
    if not left:
        return
    print(f"\ncancelling {what}: {' '.join(left)}")
    cluster.run("scancel", *left, check=False)
    deadline = time.monotonic() + 60
    while cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split() and time.monotonic() < deadline:
        time.sleep(0.5)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report = yield
    if report.failed and report.when == "call" and _cluster is not None:
        report.sections.append(("slurm daemon logs", _cluster.log_tail()))
    return report

"""What hpctrain adds to a user's script: start-up time, and how fast a stop reaches the script and requeues.

Needs the Slurm test cluster (root, namespaces); this brings it up (2 nodes, ``--slurm``, 24.11 by default)
and down again (unless it was up already). Hold the machine's lock:

    flock /tmp/hpctrain-slurm.lock .venv/bin/python benchmarks/script_overhead.py --repeats 3

The same tiny script (no torch: its first line takes a timestamp) runs on 2 nodes x 2 processes two ways:

* hpctrain: ``hpctrain submit`` of a ``script:`` spec (the CLI, the code snapshot, sbatch, each task's
  wrapper, then the script); with ``health.burn_in.enabled: false`` unless ``--burn-in`` (the burn-in's own
  seconds are node_health.py's);
* baseline: a hand-written sbatch script, ``srun python script.py`` (what the spec replaces).

Everything runs as the cluster's unprivileged test user, as the stop tests do (as root, every task's clean-up
watcher would read the environment of every root process on this shared machine, which a user's does not).
Start-up: from just before the submitting command to the last process's first line. Stop: ``scancel
--signal=USR2`` (what Slurm sends before the time limit) to (a) the last script noticing its stop signal,
(b) the last script's exit, (c) the job seen requeued (PENDING, Restarts 1). The baseline's script does
by hand what the hpctrain job does for it: it handles USR2 itself and its rank 0 runs ``scontrol requeue``.
Which way runs first alternates per repeat. The machine is shared: the summary gives the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm.conftest import TEST_USER  # noqa: E402 (the checkout's tests package)
from tests.slurm.hpctrain_cli import user_prefix  # noqa: E402

CLUSTER = REPO / "tests" / "cluster" / "slurm-cluster"
STATE_DIR = Path(os.environ.get("HPCTRAIN_SLURM_STATE", "/tmp/hpctrain-slurm"))
RANKS = 4
SCRIPT = """
import os, signal, subprocess, sys, time
stamp = time.time()
out, rank = sys.argv[1], os.environ.get("RANK") or os.environ["SLURM_PROCID"]
restart = os.environ.get("HPCTRAIN_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT", "0")
open(f"{out}/first-{restart}-{rank}", "w").write(repr(stamp))
if "--wait" in sys.argv:
    got = {}
    by_hand = "--by-hand" in sys.argv  # the baseline: the time-limit signal itself, and its own requeue
    signal.signal(signal.SIGUSR2 if by_hand else signal.SIGTERM, lambda s, f: got.setdefault("t", time.time()))
    while not got and time.time() - stamp < 300:
        time.sleep(0.01)
    # written before a by-hand requeue, which ends every process of the job
    open(f"{out}/stop-{restart}-{rank}", "w").write(f"{got.get('t', 0)!r} {time.time()!r}")
    if by_hand and rank == "0":
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
"""


class Cluster:
    def __init__(self, slurm: str) -> None:
        self.slurm = slurm
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(STATE_DIR / "etc" / "slurm.conf")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        self.env = env
        self.prefix: list[str] = []
        status = subprocess.run([sys.executable, str(CLUSTER), "status"], capture_output=True, text=True)
        self.was_up = status.returncode == 0 and f"slurm={slurm} " in status.stdout

    def up(self) -> Path:
        """Up, as the unprivileged test user from now on; a folder of that user's to work in."""
        subprocess.run([sys.executable, str(CLUSTER), "up", "--slurm", self.slurm], check=True, capture_output=True)
        account = pwd.getpwnam(TEST_USER)
        work = Path(tempfile.mkdtemp(prefix="bench-script-", dir=account.pw_dir))
        os.chown(work, account.pw_uid, account.pw_gid)
        self.prefix = user_prefix(f"{account.pw_uid}:{account.pw_gid}", STATE_DIR / "etc" / "slurm.conf")
        self.env.update(HOME=account.pw_dir, USER=TEST_USER, LOGNAME=TEST_USER, XDG_STATE_HOME=str(work / "state"))
        self.env["HPCTRAIN_CONFIG_DIR"] = str(work / "config")
        return work

    def down(self) -> None:
        if not self.was_up:
            subprocess.run([sys.executable, str(CLUSTER), "down"], check=False, capture_output=True)

    def run(self, *args: str) -> str:
        done = subprocess.run([*self.prefix, *args], env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def record(self, job_id: str) -> dict[str, str]:
        command = [*self.prefix, "scontrol", "-o", "show", "job", job_id]
        text = subprocess.run(command, env=self.env, capture_output=True, text=True)
        return dict(word.split("=", 1) for word in text.stdout.split() if "=" in word)

    def end(self, job_id: str) -> None:
        subprocess.run([*self.prefix, "scancel", job_id], env=self.env, capture_output=True)
        deadline = time.monotonic() + 60
        while self.run("squeue", "-h", "-j", job_id, "-o", "%T").strip() and time.monotonic() < deadline:
            time.sleep(0.5)


def wait_files(folder: Path, prefix: str, timeout: float = 300) -> list[float]:
    """The first number of each of the ranks' ``prefix-RANK`` files, once all are there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(folder.glob(f"{prefix}-*"))
        if len(found) == RANKS and all(path.read_text() for path in found):
            return [float(path.read_text().split()[0]) for path in found]
        time.sleep(0.02)
    raise TimeoutError(f"{prefix} files in {folder}: {[p.name for p in folder.glob(prefix + '-*')]}")


BURN_IN = {"enabled": False}  # main() sets it: the wrapper alone, or with the burn-in (--burn-in)


def hpctrain_job(cluster: Cluster, work: Path, name: str, wait: bool) -> tuple[str, Path, float]:
    """Submit the script with hpctrain; (job id, the folder its stamps go to, the wall time before submit)."""
    spec = {
        "health": {"burn_in": dict(BURN_IN)},
        "name": name,
        "cluster": "slurm",
        "output_dir": str(work / "runs"),
        "resources": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "time": "00:10:00", "partition": "debug"},
        "signals": {"signal_delay_s": 60},
        "script": {"path": str(work / "scripts" / "stamp.py"), "args": ["{run_dir}", *(["--wait"] if wait else [])]},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    started = time.time()
    out = cluster.run(sys.executable, "-m", "hpctrain", "submit", str(path), "--json")
    report = next(json.loads(line) for line in out.splitlines() if line.startswith("{"))
    return report["job_id"], Path(report["run_dir"]), started


def baseline_job(cluster: Cluster, work: Path, name: str, wait: bool) -> tuple[str, Path, float]:
    """The same script from a hand-written sbatch script."""
    out = work / name
    out.mkdir()
    os.chown(out, *_owner(work))  # the user's script writes its stamps there
    extra = " --wait --by-hand" if wait else ""
    batch = work / f"{name}.sbatch"
    batch.write_text(
        "#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=2 --cpus-per-task=1 -p debug --time=10 --requeue\n"
        f"#SBATCH -o {out}/slurm-%j.out\n"
        f"srun {sys.executable} {work / 'scripts' / 'stamp.py'} {out}{extra}\n"
    )
    started = time.time()
    job_id = cluster.run("sbatch", "--parsable", str(batch)).strip().split(";")[0]
    return job_id, out, started


def _owner(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_uid, info.st_gid


def startup(cluster: Cluster, work: Path, way: str, index: int) -> float:
    submit = hpctrain_job if way == "hpctrain" else baseline_job
    job_id, folder, started = submit(cluster, work, f"start-{way}-{index}", False)
    first = wait_files(folder, "first-0")
    cluster.end(job_id)
    return max(first) - started


def stop(cluster: Cluster, work: Path, way: str, index: int) -> tuple[float, float, float]:
    submit = hpctrain_job if way == "hpctrain" else baseline_job
    job_id, folder, _ = submit(cluster, work, f"stop-{way}-{index}", True)
    wait_files(folder, "first-0")
    time.sleep(1.0)  # every process is past its first line and waiting
    signalled = time.time()
    cluster.run("scancel", "--signal=USR2", job_id)
    requeued = None
    deadline = time.monotonic() + 120
    while requeued is None and time.monotonic() < deadline:
        record = cluster.record(job_id)
        if record.get("JobState") == "PENDING" and record.get("Restarts") == "1":
            requeued = time.time()
        time.sleep(0.05)
    stamps = [p.read_text().split() for p in sorted(folder.glob("stop-0-*"))]
    cluster.end(job_id)
    if requeued is None or len(stamps) != RANKS:
        raise RuntimeError(f"{way}: not requeued, or not every script stopped ({len(stamps)})")
    noticed = max(float(got) for got, _ in stamps) - signalled
    exited = max(float(left) for _, left in stamps) - signalled
    return noticed, exited, requeued - signalled


def spread(values: list[float], unit: str = " s", digits: int = 2) -> str:
    low, high, mid = min(values), max(values), statistics.median(values)
    return f"median {mid:.{digits}f}{unit} ({low:.{digits}f}-{high:.{digits}f}{unit}, {len(values)} repeats)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slurm", default="24.11")
    parser.add_argument(
        "--burn-in", action="store_true", help="the hpctrain job with its burn-in (default off: the wrapper alone)"
    )
    args = parser.parse_args()
    BURN_IN["enabled"] = args.burn_in
    cluster = Cluster(args.slurm)
    work = cluster.up()
    (work / "scripts").mkdir()
    (work / "scripts" / "stamp.py").write_text(SCRIPT)
    times: dict[str, list] = {"hpctrain": [], "baseline": []}
    stops: dict[str, list] = {"hpctrain": [], "baseline": []}
    print(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    try:
        for index in range(args.repeats):
            order = ("hpctrain", "baseline") if index % 2 == 0 else ("baseline", "hpctrain")
            for way in order:
                times[way].append(startup(cluster, work, way, index))
                print(f"start-up {index} {way}: submit -> last first line {times[way][-1]:.2f} s", flush=True)
            for way in order:
                stops[way].append(stop(cluster, work, way, index))
                noticed, exited, requeued = stops[way][-1]
                print(
                    f"stop {index} {way}: USR2 -> stop noticed {noticed:.2f} s, script exited {exited:.2f} s, "
                    f"job requeued {requeued:.2f} s",
                    flush=True,
                )
    finally:
        cluster.down()
    for way in ("hpctrain", "baseline"):
        print(f"{way}: start-up {spread(times[way])}")
        for label, column in (("stop noticed", 0), ("script exited", 1), ("requeued", 2)):
            print(f"{way}: USR2 -> {label} {spread([one[column] for one in stops[way]])}")
    ratio = [a / b for a, b in zip(times["hpctrain"], times["baseline"])]
    added = [a - b for a, b in zip(times["hpctrain"], times["baseline"])]
    print(f"start-up hpctrain / baseline: {spread(ratio, unit='', digits=2)}; added {spread(added)}")
    requeue = [a[2] / b[2] for a, b in zip(stops["hpctrain"], stops["baseline"])]
    print(f"USR2 -> requeued, hpctrain / baseline: {spread(requeue, unit='', digits=2)}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())

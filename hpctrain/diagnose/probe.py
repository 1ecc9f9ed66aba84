"""``hpctrain doctor --probe``: a short job that reports what a compute node sees.

The login node submits ``python -m hpctrain.diagnose.probe`` to one node of the spec's
partition (with the spec's GPUs, account and QOS) and reads the one JSON line
it prints: hostname, Python, torch and CUDA versions, visible GPUs, NCCL's
version, whether ``data.root`` is readable and ``output_dir`` writable
from there, and how many files per second ``data.root`` serves it
(:func:`hpctrain.diagnose.filesystems.measure_file_rate`, bounded in files and
time). The job's output file lies in ``output_dir``: if the login node
cannot read it afterwards, the node does not share that file system.

The login side (:func:`run_probe`) is torch-free; the node side
(:func:`report`) imports torch only to describe it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.contract.runfiles import RunFileError, load_json, read_bounded, real_path
from hpctrain.contract.slurm import Slurm, WaitTimedOut, sbatch_wrap_command
from hpctrain.diagnose.filesystems import measure_file_rate
from hpctrain.diagnose.findings import Finding

PROBE_DIR = ".hpctrain-probe"
MARKER = "HPCTRAIN-PROBE "


# ------------------------------------------------------------------ login node


@dataclass(frozen=True)
class Measure:
    """Where and how long the node measures files/s: a folder (data.root's training split) and its bounds."""

    folder: str
    max_files: int = 2000
    max_s: float = 10.0
    threads: int = 8

    def argv(self) -> list[str]:
        return ["--measure", self.folder, "--measure-files", str(self.max_files),
                "--measure-seconds", str(self.max_s), "--measure-threads", str(self.threads)]  # fmt: skip


def probe_command(python: str, data_root: str | None, output_dir: str, measure: Measure | None = None) -> str:
    """The shell line sbatch --wrap runs; every part quoted."""
    argv = [python, "-m", "hpctrain.diagnose.probe", "--output-dir", output_dir]
    if data_root:
        argv += ["--data-root", data_root]
    if measure is not None:
        argv += measure.argv()
    return shlex.join(argv)


def sbatch_args(
    *, partition: str | None, gres: str | None, account: str | None, qos: str | None, output: Path, wrap: str
) -> list[str]:
    options = (("partition", partition), ("gres", gres), ("account", account), ("qos", qos))
    return sbatch_wrap_command(job_name="hpctrain-probe", wrap=wrap, output=output, time_min=2, options=options)


def run_probe(
    *,
    output_dir: str,
    data_root: str | None,
    partition: str | None,
    gres: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    timeout_s: float = 300.0,
    measure: Measure | None = None,
    slurm: Slurm | None = None,
) -> dict[str, Any]:
    """Submit the probe, wait for it, and return what it reported (or why it could not)."""
    slurm = slurm or Slurm()
    folder = Path(os.path.expanduser(output_dir)) / PROBE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    output = folder / "probe-%j.out"
    wrap = probe_command(sys.executable, data_root, str(real_path(os.path.expanduser(output_dir))), measure)
    job_id = slurm.submit_wrapped(
        sbatch_args(partition=partition, gres=gres, account=account, qos=qos, output=output, wrap=wrap)
    )
    try:
        state = slurm.wait_for(job_id, timeout_s=timeout_s)
    except WaitTimedOut as exc:
        slurm.cancel_job(job_id)
        return {"job_id": job_id, "state": exc.state, "error": f"still {exc.state} after {timeout_s:.0f} s; cancelled"}
    out_file = folder / f"probe-{job_id}.out"
    result: dict[str, Any] = {"job_id": job_id, "state": state}
    try:
        text = read_bounded(out_file).decode(errors="replace")
    except (OSError, RunFileError):
        result["error"] = (
            f"the probe's output {out_file} is not visible here: the node does not share output_dir's file system"
        )
        return result
    for line in text.splitlines():
        if line.startswith(MARKER):
            try:
                found = load_json(line[len(MARKER) :])
            except ValueError:
                found = None
            if isinstance(found, dict):
                result.update(found)
                break
    else:
        result["error"] = "the probe did not report: " + " | ".join(text.strip().splitlines()[-3:])
    out_file.unlink(missing_ok=True)
    return result


# ------------------------------------------------------------------ compute node


def report(data_root: str | None, output_dir: str, measure: Measure | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": sys.executable,
        "python_version": platform.python_version(),
    }
    try:
        import torch

        found["torch"] = torch.__version__
        found["cuda"] = torch.version.cuda
        found["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available():
            found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # report what is broken instead of failing
        found["torch_error"] = f"{type(exc).__name__}: {exc}"
    if data_root:
        try:
            entries = sorted(os.listdir(data_root))
            found["data_root_readable"] = True
            found["data_root_entries"] = entries[:10]
        except OSError as exc:
            found["data_root_readable"] = False
            found["data_root_error"] = exc.strerror
    if measure is not None and found.get("data_root_readable"):
        found["file_rate"] = file_rate(measure)
    try:
        with tempfile.NamedTemporaryFile(dir=output_dir, prefix=".probe-", delete=True):
            pass
        found["output_dir_writable"] = True
    except OSError as exc:
        found["output_dir_writable"] = False
        found["output_dir_error"] = exc.strerror
    return found


def file_rate(measure: Measure) -> dict[str, Any]:
    """The measurement's numbers, or why there are none."""
    try:
        rate = measure_file_rate(measure.folder, max_files=measure.max_files, max_s=measure.max_s,
                                 threads=measure.threads)  # fmt: skip
    except OSError as exc:
        return {"error": f"cannot list {measure.folder}: {exc.strerror or exc}"}
    return rate.as_json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.diagnose.probe")
    parser.add_argument("--data-root")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--measure", help="folder whose files/s to measure (data.root's training split)")
    parser.add_argument("--measure-files", type=int, default=2000)
    parser.add_argument("--measure-seconds", type=float, default=10.0)
    parser.add_argument("--measure-threads", type=int, default=8)
    args = parser.parse_args(argv)
    measure = None
    if args.measure:
        measure = Measure(args.measure, args.measure_files, args.measure_seconds, args.measure_threads)
    print(MARKER + json.dumps(report(args.data_root, args.output_dir, measure)), flush=True)
    return 0


def probe_findings(found: dict[str, Any], *, wants_gpus: int) -> list[Finding]:
    """An error for every problem the probe found; pure."""
    if "error" in found:
        return [
            Finding("error", "probe", found["error"], "run it again; check 'hpctrain doctor' without --probe first")
        ]
    host, gpus = found.get("hostname"), len(found.get("gpus", []))
    problems = []
    if "torch_error" in found:
        problems.append(Finding("error", "python", f"torch does not import on {host}: {found['torch_error']}",
                                "install the environment where compute nodes see it (a shared venv)"))  # fmt: skip
    if wants_gpus and gpus < wants_gpus:
        problems.append(Finding("error", "resources.gpus_per_node", f"{host} shows {gpus} GPU(s), the spec asks for "
                                f"{wants_gpus}", "check the profile's gpu_gres template"))  # fmt: skip
    if found.get("data_root_readable") is False:
        problems.append(Finding("error", "data.root", f"{host} cannot read it: {found.get('data_root_error')}",
                                "put the dataset where compute nodes mount it"))  # fmt: skip
    if found.get("output_dir_writable") is False:
        problems.append(Finding("error", "output_dir", f"{host} cannot write it: {found.get('output_dir_error')}",
                                "put output_dir on the shared file system"))  # fmt: skip
    return problems


if __name__ == "__main__":
    sys.exit(main())

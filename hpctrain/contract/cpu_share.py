"""The CPU share of a task: one rule for ``OMP_NUM_THREADS``, torchrun's workers and bench-data. Torch-free.

Under Slurm a task owns ``SLURM_CPUS_PER_TASK`` cores; whatever shares the
task (torchrun's workers on a node, the GPUs one task drives) gets an equal
part, at least one core. Without that, torch starts one thread per core of
the node in every process, and N processes per node oversubscribe it N
times (the 2x2 CPU smoke job trained 10x slower on a 2-core test machine).
A user's own ``OMP_NUM_THREADS`` always wins.
"""

from __future__ import annotations

from collections.abc import Mapping


def slurm_cpus_per_task(environ: Mapping[str, str]) -> int | None:
    """The cores Slurm gave this task, or None outside a job (or when it does not say)."""
    cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    return int(cpus) if cpus.isdigit() and int(cpus) > 0 else None


def cpu_share(cpus: int, sharers: int) -> int:
    """Each of ``sharers``' equal part of ``cpus``, at least one core. Pure."""
    return max(1, cpus // max(1, sharers))


def omp_num_threads(environ: Mapping[str, str], *, sharers: int = 1, cpu_count: int | None = None) -> str | None:
    """``OMP_NUM_THREADS`` for one of ``sharers`` processes of this task; None to leave it alone.

    Under Slurm the task's cores are ``SLURM_CPUS_PER_TASK``; on submitit's
    local executor (``cpu_count`` given) this machine's cores are divided
    among the local tasks. None when the user set it, or nothing says.
    """
    if "OMP_NUM_THREADS" in environ:
        return None
    cpus = slurm_cpus_per_task(environ)
    if cpus is not None:
        return str(cpu_share(cpus, sharers))
    local_tasks = environ.get("SUBMITIT_LOCAL_NTASKS", "")
    if environ.get("SUBMITIT_EXECUTOR") == "local" and local_tasks.isdigit() and int(local_tasks) > 1 and cpu_count:
        return str(cpu_share(cpu_count, int(local_tasks) * max(1, sharers)))
    return None

"""A Slurm for tests that need none: a runner that answers the one client's commands in-process.

:class:`FakeSlurm` is a ``subprocess.run`` stand-in for
``hpctrain.contract.slurm.Slurm``: it keeps a few jobs' states and answers
``sacct``, ``squeue``, ``scancel``, ``scontrol``, ``sbatch`` and ``sinfo`` (one partition's nodes) as Slurm does
(``scancel`` ends a job as CANCELLED, with its processes still COMPLETING
until :meth:`FakeSlurm.settle`), records every command, and lets a test
script any other answer by command prefix. ``install(monkeypatch)`` makes it
the runner of every client the library makes, so both faces (``hpctrain
...`` in-process and ``import hpctrain``) talk to it. Nothing on PATH is faked.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from hpctrain.contract import slurm

Answer = tuple[int, str] | Callable[[list[str]], tuple[int, str]]


def on_path(name: str) -> str:
    """``which`` for a machine with every Slurm client installed."""
    return f"/usr/bin/{name}"


def nowhere(name: str) -> None:
    """``which`` for a machine without Slurm."""
    return None


class FakeSlurm:
    """Slurm's answers from ``jobs`` (job id -> state); ``answers``: command prefix -> (exit code, text), or a
    function of the argv that returns one, for anything else (the longest matching prefix wins)."""

    def __init__(
        self,
        jobs: Mapping[str, str] | None = None,
        *,
        answers: Mapping[str, Answer] | None = None,
        kill_wait_s: int = 0,
        settle_on_cancel: bool = True,
        partition: Mapping[str, str] | None = None,
    ) -> None:
        self.jobs: dict[str, str] = dict(jobs or {})
        self.stopping: set[str] = set()  # jobs whose processes are still stopping (squeue: COMPLETING)
        self.answers: dict[str, Answer] = dict(answers or {})
        self.kill_wait_s, self.settle_on_cancel = kill_wait_s, settle_on_cancel
        self.commands: list[list[str]] = []
        self.partition: dict[str, str] = dict(partition or {})  # node -> sinfo state, all in partition debug
        self.node_gres: dict[str, str] = {}  # node -> its sinfo %G (none: "(null)")
        self.node_cpus: dict[str, int] = {}  # node -> its sinfo %c (none: 4)
        self.test_only_answers: dict[int, tuple[int, str]] = {}  # node count -> sbatch --test-only's answer

    def test_only(self, argv: list[str]) -> tuple[int, str]:
        """``sbatch --test-only --nodes=N ...``: :attr:`test_only_answers` [N], else a start now on n1."""
        nodes = next((int(arg.split("=", 1)[1]) for arg in argv if arg.startswith("--nodes=")), 1)
        return self.test_only_answers.get(
            nodes,
            (0, "sbatch: Job 9 to start at 2026-11-29T00:13:14 using 1 processors on nodes n1 in partition debug\n"),
        )

    # ---------------------------------------------------------------- test side

    def client(self, **kwargs: Any) -> slurm.Slurm:
        """A client on this fake that never sleeps."""
        return slurm.Slurm(self, which=kwargs.pop("which", on_path), sleep=lambda seconds: None, **kwargs)

    def install(self, monkeypatch: pytest.MonkeyPatch, which: Callable[[str], str | None] = on_path) -> FakeSlurm:
        """Every ``Slurm()`` the library makes runs on this fake."""
        monkeypatch.setattr(slurm, "default_runner", self)
        monkeypatch.setattr(slurm, "default_which", which)
        return self

    def settle(self, *job_ids: str) -> None:
        """The jobs' last processes have exited (squeue forgets them)."""
        self.stopping -= set(job_ids or self.stopping)

    def asked(self, command: str) -> list[list[str]]:
        """The commands run whose name is ``command``."""
        return [argv for argv in self.commands if argv[:1] == [command]]

    # ---------------------------------------------------------------- Slurm side

    def __call__(self, command: Iterable[str], **_: Any) -> subprocess.CompletedProcess[str]:
        argv = list(command)
        self.commands.append(argv)
        text = " ".join(argv)
        for prefix in sorted(self.answers, key=len, reverse=True):
            if text.startswith(prefix):
                answer = self.answers[prefix]
                code, out = answer(argv) if callable(answer) else answer
                return self._done(argv, code, out)
        if argv[:2] == ["sbatch", "--test-only"]:  # sbatch prints its answer, and its refusal, on stderr
            code, said = self.test_only(argv)
            return subprocess.CompletedProcess(argv, code, "", said)
        handler = getattr(self, f"_{argv[0]}", None)
        if handler is None:
            raise AssertionError(f"FakeSlurm: unexpected command {text}")
        return self._done(argv, *handler(argv))

    @staticmethod
    def _done(argv: list[str], code: int, out: str) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, code, out if code == 0 else "", "" if code == 0 else out)

    def _job_ids(self, argv: list[str]) -> list[str]:
        return argv[argv.index("-j") + 1].split(",") if "-j" in argv else []

    def _sacct(self, argv: list[str]) -> tuple[int, str]:
        return 0, "".join(f"{job}|{self.jobs[job]}\n" for job in self._job_ids(argv) if job in self.jobs)

    def _squeue(self, argv: list[str]) -> tuple[int, str]:
        (job,) = self._job_ids(argv)
        if job not in self.jobs:
            return 1, "slurm_load_jobs error: Invalid job id specified"
        if job in self.stopping:
            return 0, "COMPLETING\n"
        final = slurm.is_final(self.jobs[job])
        return 0, "" if final else f"{self.jobs[job]}\n"

    def _scancel(self, argv: list[str]) -> tuple[int, str]:
        job = argv[-1].split(".")[0]  # a step is its job's
        if job not in self.jobs:
            return 1, f"scancel: error: Kill job error on job id {job}: Invalid job id specified"
        if not any(arg.startswith("--signal") for arg in argv) and not slurm.is_final(self.jobs[job]):
            self.jobs[job] = "CANCELLED"
            if not self.settle_on_cancel:
                self.stopping.add(job)
        return 0, ""

    def _scontrol(self, argv: list[str]) -> tuple[int, str]:
        if argv[1:3] == ["show", "config"]:
            return 0, f"KillWait                = {self.kill_wait_s} sec\n"
        if argv[1:2] == ["--version"]:
            return 0, "slurm 24.11.5\n"
        if argv[1:2] == ["ping"]:
            return 0, "Slurmctld(primary) at ctl is UP\n"
        if argv[1:4] == ["--oneliner", "show", "job"]:
            job = argv[4]
            if job not in self.jobs:
                return 1, "slurm_load_jobs error: Invalid job id specified"
            return 0, f"JobId={job} JobState={self.jobs[job]} ExcNodeList=(null)\n"
        if argv[1:4] in (["--oneliner", "show", "partition"], ["--oneliner", "show", "node"]):
            return 0, ""
        if argv[1:2] == ["update"] or argv[1:2] == ["requeue"]:
            return 0, ""
        raise AssertionError(f"FakeSlurm: unexpected command {' '.join(argv)}")

    def _sinfo(self, argv: list[str]) -> tuple[int, str]:
        """``sinfo -h -N -o "%N|%P|%T|%f|%G|%c|%m"`` over :attr:`partition` (none: an empty answer): each node has
        :attr:`node_gres` (default no GRES) and :attr:`node_cpus` (default 4, as the test cluster's), 3900 MB."""
        if "%N|%P|%T|%f|%G|%c|%m" not in argv:
            raise AssertionError(f"FakeSlurm: unexpected command {' '.join(argv)}")
        return 0, "".join(
            f"{node}|debug*|{state}|(null)|{self.node_gres.get(node, '(null)')}|{self.node_cpus.get(node, 4)}|3900\n"
            for node, state in self.partition.items()
        )

    def _sacctmgr(self, argv: list[str]) -> tuple[int, str]:
        return 0, ""

    def _sbatch(self, argv: list[str]) -> tuple[int, str]:
        if argv[1:2] == ["--version"]:
            return 0, "slurm 24.11.5\n"
        job = str(4000 + len(self.jobs))
        self.jobs[job] = "PENDING"
        return 0, f"{job}\n"

"""A task's folder in the node's temp dir: named before it exists, removed only when it is still the task's own
(runtime/node_dirs.py), and the torchrun node task's order: name, tell the reaper, make, remove."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpctrain.errors import HpctrainError
from hpctrain.jobspec.models import JobSpec
from hpctrain.programs import torchrun_node
from hpctrain.programs.torchrun_node import TorchrunNodeLauncher, make_state_dir
from hpctrain.runtime import node_dirs
from hpctrain.runtime.task_env import derive_task_env

NODE_0_TASK = {  # node 0's task of a 2-node torchrun job
    "SLURM_JOB_ID": "1234",
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}


def test_a_planned_folder_is_a_fresh_name_in_the_job_scoped_temp_dir_first(tmp_path: Path) -> None:
    job_tmp, tmp = tmp_path / "job", tmp_path / "tmp"
    tmp.mkdir()
    env = {"SLURM_TMPDIR": str(job_tmp), "TMPDIR": str(tmp)}
    first = node_dirs.planned("torchrun", env)
    assert first.parent == tmp and first.name.startswith("hpctrain-torchrun-") and not first.exists()
    job_tmp.mkdir()  # a SLURM_TMPDIR that exists wins; one leaked from an ended job (gone) is passed over
    assert node_dirs.planned("torchrun", env).parent == job_tmp
    assert node_dirs.planned("torchrun", env) != node_dirs.planned("torchrun", env)
    assert node_dirs.planned("torchrun", {}).parent == Path(os.path.realpath("/tmp"))


def test_a_planned_folder_names_its_task_host_pid_and_start() -> None:
    name = node_dirs.planned("torchrun", {}).name
    found = re.fullmatch(r"hpctrain-torchrun-[0-9a-f]{16}-(\d+)-(\d+)-(.+)", name)
    assert found is not None, name
    assert int(found[1]) == os.getpid() and int(found[2]) == node_dirs.process_start(os.getpid())
    assert found[3] == re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64]


def ended_task_folder(temp: Path, kind: str = "torchrun", host: str | None = None) -> Path:
    """A folder named like planned()'s by a task that has ended (a SIGKILLed node task whose reaper died too)."""
    proc = subprocess.Popen(["sleep", "5"])
    start = node_dirs.process_start(proc.pid)
    proc.kill()
    proc.wait()
    host = host or re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64]
    folder = temp / f"hpctrain-{kind}-{os.urandom(8).hex()}-{proc.pid}-{start}-{host}"
    (folder / "torchrun-logs").mkdir(parents=True)
    return folder


def test_the_sweep_removes_only_this_users_folders_of_ended_tasks_of_this_host(tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path)}
    dead = ended_task_folder(tmp_path)
    live = node_dirs.create(node_dirs.planned("torchrun", env))  # this process's: alive
    elsewhere = ended_task_folder(tmp_path, host="another-node")  # /tmp on a shared disk: PIDs mean nothing here
    other_kind = ended_task_folder(tmp_path, kind="bench")
    target = tmp_path / "precious"
    target.mkdir()
    planted = ended_task_folder(tmp_path)
    shutil.rmtree(planted)
    planted.symlink_to(target)  # a link with a dead task's name: never followed, never removed
    assert node_dirs.sweep("torchrun", env) == [str(dead)]
    assert not dead.exists() and live.is_dir() and elsewhere.is_dir() and other_kind.is_dir()
    assert planted.is_symlink() and target.is_dir()


def test_the_task_s_own_folder_is_removed_whole(tmp_path: Path) -> None:
    folder = node_dirs.create(node_dirs.planned("torchrun", {"TMPDIR": str(tmp_path)}))
    assert folder.stat().st_mode & 0o777 == 0o700
    (folder / "torchrun-logs" / "1").mkdir(parents=True)
    (folder / "result-0.pkl").write_bytes(b"x")
    assert node_dirs.remove_owned(folder) == "removed" and not folder.exists()
    assert node_dirs.remove_owned(folder) == "already gone"  # the task's own finally came first


def test_a_symlink_in_its_place_is_left_and_so_is_what_it_points_to(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    (target / "data").write_text("keep")
    link = tmp_path / "hpctrain-torchrun-0123"
    link.symlink_to(target)
    assert node_dirs.remove_owned(link).startswith("refused: not a directory")
    assert link.is_symlink() and (target / "data").read_text() == "keep"


def test_a_folder_through_a_symlinked_parent_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real" / "hpctrain-torchrun-0123").mkdir(parents=True)
    (tmp_path / "via").symlink_to(tmp_path / "real")
    assert node_dirs.remove_owned(tmp_path / "via" / "hpctrain-torchrun-0123").startswith("refused")
    assert (tmp_path / "real" / "hpctrain-torchrun-0123").is_dir()


def test_someone_elses_folder_and_other_names_are_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "hpctrain-torchrun-0123"
    theirs.mkdir()
    assert node_dirs.remove_owned(theirs, uid=os.geteuid() + 1).startswith("refused: owned by uid")
    other = tmp_path / "results"
    other.mkdir()
    assert node_dirs.remove_owned(other).startswith("refused") and other.is_dir()
    assert node_dirs.remove_owned("hpctrain-torchrun-0123").startswith("refused")  # relative: never
    assert theirs.is_dir()


def test_a_taken_name_is_an_error_not_someone_elses_folder(tmp_path: Path) -> None:
    taken = tmp_path / "hpctrain-torchrun-0123"
    taken.mkdir()
    with pytest.raises(HpctrainError, match="could not make its state folder") as caught:
        make_state_dir(taken)
    assert "TMPDIR" in (caught.value.hint or "")


def test_the_node_task_sweeps_then_names_the_folder_for_its_reaper_before_making_it_and_removes_it_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("SLURM_TMPDIR", raising=False)
    left = ended_task_folder(tmp_path)  # by a node task killed with its reaper
    told: list[tuple[Path, bool]] = []
    made: list[Path] = []

    def start_reaper(self: TorchrunNodeLauncher, remove_dirs: tuple[Path, ...] = ()) -> None:
        told.extend((path, path.exists()) for path in remove_dirs)

    def popen(command: list[str], **kwargs: Any) -> None:
        made.append(Path(command[-1]))
        assert Path(command[-1], torchrun_node.SPEC_FILE).is_file()
        raise OSError("no torchrun here")

    monkeypatch.setattr(TorchrunNodeLauncher, "start_reaper", start_reaper)
    monkeypatch.setattr(TorchrunNodeLauncher, "burn_in", lambda self, spec, env: None)
    monkeypatch.setattr(torchrun_node, "check_master_address", lambda env, allow_loopback: None)
    monkeypatch.setattr(torchrun_node, "check_port_free", lambda port: None)
    monkeypatch.setattr(torchrun_node.subprocess, "Popen", popen)
    monkeypatch.setattr(torchrun_node.stop_signals, "hold", lambda: None)
    monkeypatch.setattr(torchrun_node.signal, "signal", lambda signum, handler: None)
    the_spec = JobSpec.model_validate(
        {"name": "t", "launcher": "torchrun", "resources": {"nodes": 2, "tasks_per_node": 2}}
    )
    with pytest.raises(OSError, match="no torchrun"):
        launcher = TorchrunNodeLauncher(the_spec.model_dump(mode="json"), str(tmp_path / "run"))
        launcher.run(the_spec, derive_task_env(NODE_0_TASK))
    ((path, existed),) = told
    assert not existed, "the reaper must know the folder before it exists"
    assert made == [path] and path.parent == tmp_path and path.name.startswith("hpctrain-torchrun-")
    assert not path.exists()  # the task's own finally
    assert not left.exists()  # swept at the start

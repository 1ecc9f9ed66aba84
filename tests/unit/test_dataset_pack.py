"""Packed dataset images: ``hpctrain pack``, the login-node checks, and a node's mount and its release.

The mount tests start real tasks (subprocesses) that mount with squashfuse,
kill them with SIGKILL, and read /proc/mounts: nothing may stay mounted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_helpers import REPO, assert_user_error, hpctrain, isolated_env

from hpctrain.dataset import mount, mount_release, pack, squashfs
from hpctrain.dataset.generate import make_dataset
from hpctrain.dataset.index import scan_split
from tests.squashfs_tools import require_mount, require_pack_tools

HANG_GUARD_S = 60.0


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree") / "data"
    make_dataset(root, classes=3, per_class=6, val_per_class=3, image_size=24)
    return root


@pytest.fixture(scope="module")
def image(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_pack_tools()
    out = tmp_path_factory.mktemp("image") / "data.sqsh"
    pack.pack(tree, out, log=lambda line: None)
    return out


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return isolated_env(tmp_path)


def _index(image: Path, tmp_path: Path) -> dict:
    done = subprocess.run(
        ["unsquashfs", "-d", str(tmp_path / "x"), str(image), squashfs.INDEX_NAME], capture_output=True, check=True
    )
    assert done.returncode == 0
    return json.loads((tmp_path / "x" / squashfs.INDEX_NAME).read_text())


# ------------------------------------------------------------------ pack


def test_pack_writes_the_tree_and_its_index_and_says_what_it_did(tree: Path, tmp_path: Path, env) -> None:
    require_pack_tools()
    out = tmp_path / "out.sqsh"
    done = hpctrain("pack", str(tree), str(out), env=env)
    assert done.returncode == 0, done.stderr
    files = sum(1 for p in tree.rglob("*") if p.is_file())
    assert f"packed {files} files" in done.stdout and " s" in done.stdout and "MiB" in done.stdout
    assert squashfs.is_image(out) and squashfs.check_image(out) == []
    assert not [p for p in tmp_path.iterdir() if p.name != "out.sqsh"]  # no temporary left behind
    index = _index(out, tmp_path)
    for split in ("train", "val"):
        scanned = scan_split(tree / split)
        assert index["splits"][split]["classes"] == scanned.classes
        assert [tuple(s) for s in index["splits"][split]["samples"]] == scanned.samples


def test_pack_refuses_an_existing_out_and_force_replaces_it(tree: Path, tmp_path: Path, env) -> None:
    require_pack_tools()
    out = tmp_path / "out.sqsh"
    out.write_text("mine")
    assert_user_error(hpctrain("pack", str(tree), str(out), env=env), 2, str(out), "--force")
    assert out.read_text() == "mine"
    assert hpctrain("pack", str(tree), str(out), "--force", env=env).returncode == 0
    assert squashfs.is_image(out)


def test_a_failed_pack_leaves_the_old_image_and_no_temporary(tree: Path, tmp_path: Path, env) -> None:
    require_pack_tools()
    out = tmp_path / "out.sqsh"
    out.write_text("mine")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mksquashfs").write_text("#!/bin/sh\necho 'FATAL ERROR: disk on fire' >&2\nexit 1\n")
    (fake / "mksquashfs").chmod(0o755)
    env["PATH"] = f"{fake}:{env['PATH']}"
    done = hpctrain("pack", str(tree), str(out), "--force", env=env)
    assert_user_error(done, 2, "disk on fire")
    assert out.read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hpctrain-pack")]


@pytest.mark.parametrize("case", ["no-val", "no-folder", "inside", "no-mksquashfs"])
def test_pack_bad_input_is_one_line_and_writes_nothing(case: str, tree: Path, tmp_path: Path, env) -> None:
    root, out = tree, tmp_path / "out.sqsh"
    needle = {"no-val": "val/", "no-folder": "not a folder", "inside": "inside", "no-mksquashfs": "squashfs-tools"}
    if case == "no-val":
        root = tmp_path / "half"
        (root / "train" / "a").mkdir(parents=True)
    elif case == "no-folder":
        root = tmp_path / "nothing"
    elif case == "inside":
        out = tree / "data.sqsh"
    else:
        env["PATH"] = str(tmp_path)  # no squashfs-tools there
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "pack", str(root), str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_user_error(done, 2, needle[case])
    assert len(done.stderr.strip().splitlines()) == 2  # error + hint
    assert not out.exists()


def test_pack_refuses_when_the_disk_is_too_small(tree: Path, tmp_path: Path, monkeypatch) -> None:
    require_pack_tools()
    monkeypatch.setattr(pack.shutil, "disk_usage", lambda path: SimpleNamespace(total=100, used=90, free=10))
    with pytest.raises(pack.PackError, match="GiB free") as caught:
        pack.pack(tree, tmp_path / "out.sqsh", log=lambda line: None)
    assert str(tmp_path) in caught.value.message
    assert not (tmp_path / "out.sqsh").exists()


def test_pack_lists_unreadable_files_and_strict_refuses(tree: Path, tmp_path: Path) -> None:
    require_pack_tools()
    root = tmp_path / "data"
    make_dataset(root, classes=2, per_class=3, val_per_class=2, image_size=16)
    (root / "train" / "class_00" / "zz_gone.jpg").symlink_to("/nonexistent/x.jpg")
    lines: list[str] = []
    with pytest.raises(pack.PackError, match="cannot go into the image"):
        pack.pack(root, tmp_path / "strict.sqsh", strict=True, log=lines.append)
    assert any("zz_gone.jpg" in line for line in lines) and not (tmp_path / "strict.sqsh").exists()
    result = pack.pack(root, tmp_path / "out.sqsh", log=lines.append)
    assert [rel for rel, _ in result.skipped] == ["train/class_00/zz_gone.jpg"]
    samples = [rel for rel, _ in _index(tmp_path / "out.sqsh", tmp_path)["splits"]["train"]["samples"]]
    assert "class_00/zz_gone.jpg" not in samples and len(samples) == 6


def test_pack_imports_no_torch(tree: Path, tmp_path: Path, env) -> None:
    require_pack_tools()
    done = hpctrain("pack", str(tree), str(tmp_path / "o.sqsh"), env=env, importtime=True)
    assert done.returncode == 0
    assert not [line for line in done.stderr.splitlines() if "torch" in line]


# ------------------------------------------------------------------ checks before a job


def test_image_checks_name_the_path_and_the_fix(image: Path, tmp_path: Path) -> None:
    assert squashfs.check_image(image) == []
    not_image = tmp_path / "notes.sqsh"
    not_image.write_bytes(b"PK\x03\x04" + b"\0" * 200)
    cut = tmp_path / "cut.sqsh"
    cut.write_bytes(image.read_bytes()[:4096])
    half = tmp_path / "half"
    (half / "train" / "a").mkdir(parents=True)
    (half / "train" / "a" / "x.jpg").write_bytes(b"x")
    no_val = tmp_path / "noval.sqsh"
    subprocess.run(["mksquashfs", str(half), str(no_val), "-no-progress"], capture_output=True, check=True)
    for path, needle in ((not_image, "not a SquashFS image"), (cut, "truncated"), (no_val, "no val/")):
        (problem,) = squashfs.check_image(path)
        assert needle in problem.message and str(path) in problem.message and problem.hint


def test_validate_reads_an_image_root_and_fails_on_a_broken_one(image: Path, tmp_path: Path, env) -> None:
    good = hpctrain("validate", "jobs/quickstart.yaml", "--set", f"data.root={image}", env=env)
    assert good.returncode == 0, good.stderr
    cut = tmp_path / "cut.sqsh"
    cut.write_bytes(image.read_bytes()[:4096])
    bad = hpctrain("validate", "jobs/quickstart.yaml", "--set", f"data.root={cut}", env=env)
    assert bad.returncode == 2 and "truncated" in bad.stderr and str(cut) in bad.stderr
    assert "Traceback" not in bad.stderr and "OK" not in bad.stdout


def test_preflight_warns_what_mounting_needs(image: Path, monkeypatch) -> None:
    from hpctrain.diagnose import preflight

    monkeypatch.setattr(squashfs.shutil, "which", lambda name: None if name == "squashfuse" else f"/usr/bin/{name}")
    monkeypatch.setattr(squashfs.os.path, "exists", lambda path: path != "/dev/fuse")
    findings = preflight.check_data_image(image, "train", "val")
    assert [f.level for f in findings] == ["warning", "warning"]
    assert "squashfuse is not installed" in findings[0].message and "apt install squashfuse" in findings[0].message
    assert "/dev/fuse" in findings[1].message


def test_doctor_accepts_an_image_root(image: Path) -> None:
    from hpctrain.diagnose import path_checks
    from hpctrain.jobspec.load import load_job

    job = load_job(REPO / "jobs" / "quickstart.yaml", [f"data.root={image}"])
    checks = {c.name: c for c in path_checks.check_paths(job, slurm_backend=False)}
    assert checks["dataset"].level == "ok" and "SquashFS image" in checks["dataset"].detail
    assert path_checks.measured_split(job) is None  # --probe measures no tree: each node reads the one file


# ------------------------------------------------------------------ a node's mount, and its release

TASK = """
import sys, time
from pathlib import Path
from hpctrain.dataset.mount import open_image
point = open_image(Path(sys.argv[1]), Path(sys.argv[2]), is_node_leader=sys.argv[3] == "1",
                   stage=sys.argv[4] == "1", environ={"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": sys.argv[5]})
print("POINT", point, sorted(p.name for p in point.iterdir()), flush=True)
time.sleep(600)
"""


def _task(image: Path, stage_dir: Path, *, leader: bool, stage: bool = False, attempt: int = 0) -> subprocess.Popen:
    args = [str(image), str(stage_dir), "1" if leader else "0", "1" if stage else "0", str(attempt)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", TASK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _point(task: subprocess.Popen) -> Path:
    assert task.stdout is not None
    for line in task.stdout:
        if line.startswith("POINT"):
            assert "train" in line and "val" in line and squashfs.INDEX_NAME in line
            return Path(line.split()[1])
    raise AssertionError(f"the task did not mount: {task.stderr.read() if task.stderr else ''}")


def _wait_unmounted(point: Path) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while mount_release.is_mounted(point) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not mount_release.is_mounted(point), f"{point} is still in /proc/mounts"


def _kill(task: subprocess.Popen) -> None:
    task.send_signal(signal.SIGKILL)
    task.wait(timeout=HANG_GUARD_S)


def test_a_node_mounts_once_and_unmounts_after_its_last_task_is_killed(image: Path, tmp_path: Path) -> None:
    require_mount()
    leader = _task(image, tmp_path, leader=True)
    point = _point(leader)
    other = _task(image, tmp_path, leader=False)
    assert _point(other) == point
    assert mount_release.is_mounted(point)
    _kill(leader)
    time.sleep(1.0)  # the watcher has seen the leader go; the other task still reads
    assert mount_release.is_mounted(point) and (point / "train").is_dir()
    _kill(other)
    _wait_unmounted(point)
    squashfuse = subprocess.run(["pgrep", "-f", f"squashfuse -f .* {point}"], capture_output=True, text=True)
    assert squashfuse.stdout.strip() == ""


def test_a_stale_mount_of_an_earlier_attempt_is_unmounted_first(image: Path, tmp_path: Path) -> None:
    require_mount()
    first = _task(image, tmp_path, leader=True, attempt=0)
    old = _point(first)
    base = old.parent
    ready = json.loads((base / "READY-0").read_text())
    # The whole node dies at once: the watcher and squashfuse too, the mount stays behind, stale.
    watcher = subprocess.run(["pgrep", "-f", "--", f"--unmount {old}"], capture_output=True, text=True).stdout.split()
    for pid in [*watcher, str(ready["pid"])]:
        os.kill(int(pid), signal.SIGKILL)
    _kill(first)
    assert mount_release.is_mounted(old)
    second = _task(image, tmp_path, leader=True, attempt=1)
    new = _point(second)
    assert new != old and not mount_release.is_mounted(old)
    _kill(second)
    _wait_unmounted(new)


def test_a_follower_gets_the_leaders_error(tmp_path: Path) -> None:
    require_mount()
    bogus = tmp_path / "bogus.sqsh"
    bogus.write_bytes(b"hsqs" + b"\0" * 20)
    with pytest.raises(squashfs.ImageError, match="truncated"):
        mount.open_image(bogus, tmp_path, is_node_leader=True, stage=False, environ={"SLURM_JOB_ID": "5"})
    with pytest.raises(squashfs.ImageError, match="truncated"):
        mount.open_image(
            bogus, tmp_path, is_node_leader=False, stage=False, environ={"SLURM_JOB_ID": "5"}, timeout_s=30
        )


def test_stage_copies_the_image_once_and_resumes_a_cut_copy(image: Path, tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    size = image.stat().st_size
    first = mount.copy_image(image, stage, log=lambda line: None)
    assert first.read_bytes() == image.read_bytes()
    first.rename(first.with_name(first.name + ".part"))  # a copy cut off ...
    with open(first.with_name(first.name + ".part"), "r+b") as part:
        part.truncate(size // 2)
    lines: list[str] = []
    again = mount.copy_image(image, stage, log=lines.append)
    assert again == first and again.read_bytes() == image.read_bytes()
    assert any(f"from byte {size // 2}" in line for line in lines)  # ... is resumed, not redone
    assert mount.copy_image(image, stage, log=lines.append) == first and "staged already" in lines[-1]


def test_attempt_names_keep_jobs_array_tasks_and_attempts_apart() -> None:
    from hpctrain.dataset.node_folder import attempt_names

    assert attempt_names({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "2"}) == ("12", "2")
    assert attempt_names({"SLURM_JOB_ID": "13"}) == ("13", "0")
    assert attempt_names({"TORCHELASTIC_RUN_ID": "a/b", "TORCHELASTIC_RESTART_COUNT": "1"}) == ("a_b", "1")
    assert attempt_names({})[0].startswith("pid")


def test_is_mounted_reads_escaped_paths(tmp_path: Path) -> None:
    table = tmp_path / "mounts"
    table.write_text("squashfuse /tmp/a\\040b fuse.squashfuse rw 0 0\n")
    assert mount_release.is_mounted(Path("/tmp/a b"), str(table))
    assert not mount_release.is_mounted(Path("/tmp/a"), str(table))


def test_apptainer_tasks_get_the_image_as_an_image_backed_bind(image: Path) -> None:
    import shlex

    from hpctrain.jobspec.load import load_job
    from hpctrain.launch.submission import task_python

    job = load_job(REPO / "jobs" / "smoke_apptainer_cpu.yaml", [f"data.root={image}"])
    command = shlex.split(task_python(job.spec))
    binds = [command[i + 1] for i, arg in enumerate(command) if arg == "--bind"]
    assert f"{image}:{squashfs.APPTAINER_BIND}:image-src=/" in binds
    assert command[command.index("--env") + 1] == f"{squashfs.BIND_ENV}={squashfs.APPTAINER_BIND}"
    assert command.index("--env") < command.index(job.spec.container.image)  # apptainer's options, not the task's
    folder = load_job(REPO / "jobs" / "smoke_apptainer_cpu.yaml", [f"data.root={image.parent}"])
    assert "image-src" not in task_python(folder.spec) and "--env" not in task_python(folder.spec)


def test_a_task_reads_the_containers_bind_instead_of_mounting(image: Path, tmp_path: Path, monkeypatch) -> None:
    from data_helpers import data_spec

    from hpctrain.trainer.data import build_datasets

    bound = tmp_path / "bound"
    subprocess.run(["unsquashfs", "-d", str(bound), str(image)], capture_output=True, check=True)
    monkeypatch.setenv(squashfs.BIND_ENV, str(bound))
    monkeypatch.setattr(mount, "open_image", lambda *a, **k: pytest.fail("mounted although the container had"))
    train, val = build_datasets(data_spec(image))
    assert train is not None and train.index.root == str(bound / "train") and len(val.index.samples) == 9


@pytest.mark.parametrize(
    "samples", [[["../../etc/passwd", 0]], [["/etc/passwd", 0]], [["a/x.jpg", 5]], [["a/x.jpg", "0"]]], ids=str
)
def test_an_index_that_leaves_its_split_or_lies_is_refused(samples: list, tmp_path: Path) -> None:
    from hpctrain.dataset import packed_index

    split = {"classes": ["a"], "samples": samples}
    index = {"format": packed_index.PACKED_FORMAT, "version": 1, "splits": {"train": split}}
    (tmp_path / squashfs.INDEX_NAME).write_text(json.dumps(index))
    (tmp_path / "train" / "a").mkdir(parents=True)
    document = packed_index.read_packed(tmp_path)
    assert document is not None
    with pytest.raises(squashfs.ImageError, match="malformed") as caught:
        packed_index.packed_split(tmp_path, document, "train")
    assert "pack the dataset again" in caught.value.hint
    assert packed_index.read_packed(tmp_path / "nothing-here") is None


def default_stop_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signalled_pack_stops_mksquashfs_removes_its_temporary_and_keeps_the_old_image(
    signum: signal.Signals, tree: Path, tmp_path: Path, env
) -> None:
    require_pack_tools()
    out = tmp_path / "out.sqsh"
    out.write_text("mine")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mksquashfs").write_text(f"#!/bin/sh\necho $$ > {tmp_path}/mksquashfs.pid\nexec sleep 60\n")
    (fake / "mksquashfs").chmod(0o755)
    env["PATH"] = f"{fake}:{env['PATH']}"
    # As a terminal starts it: a shell's background job (`cmd &` without job control, `nohup`) starts its children
    # with SIGINT (and SIGHUP) ignored, and Python keeps an inherited SIGINT ignored (no KeyboardInterrupt), so
    # a test run started that way waited out the fake mksquashfs instead (60 s, then a timeout).
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "pack", str(tree), str(out), "--force"], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_stop_signals,  # noqa: PLW1509
    )  # fmt: skip
    pid_file = tmp_path / "mksquashfs.pid"
    deadline = time.monotonic() + HANG_GUARD_S
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signum)  # SIGHUP: the terminal was closed under it
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode != 0 and "Traceback" not in err
    assert out.read_text() == "mine" and not list(tmp_path.glob(".hpctrain-pack-*"))
    mksquashfs = int(pid_file.read_text())
    while _alive(mksquashfs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(mksquashfs), "mksquashfs writes on after pack ended"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_release_never_signals_a_process_that_is_not_that_mounts_squashfuse(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert mount_release.release(tmp_path / "mnt", sleeper.pid, grace_s=0.1)  # nothing mounted there: done
        assert sleeper.poll() is None  # a PID that is not squashfuse on that mount point is left alone
    finally:
        sleeper.kill()
        sleeper.wait()


LEAVING_TASK = """
import sys, time
from pathlib import Path
from hpctrain.dataset import mount
point = mount.open_image(Path(sys.argv[1]), Path(sys.argv[2]), is_node_leader=False, stage=False,
                         environ={"SLURM_JOB_ID": "78", "SLURM_RESTART_COUNT": "0"})
print("POINT", point, sorted(p.name for p in point.iterdir()), flush=True)
sys.stdin.readline()
mount.leave()
print("LEFT", flush=True)
time.sleep(600)
"""


def test_the_nodes_last_task_to_end_unmounts_before_it_exits(image: Path, tmp_path: Path) -> None:
    """Slurm kills squashfuse with the rest of a step once its tasks are gone: the last task must not
    leave the unmount to the watcher (which waits for this test's own process, the leader, to end)."""
    require_mount()
    environ = {"SLURM_JOB_ID": "78", "SLURM_RESTART_COUNT": "0"}
    point = mount.open_image(image, tmp_path, is_node_leader=True, stage=False, environ=environ)
    follower = subprocess.Popen(
        [sys.executable, "-c", LEAVING_TASK, str(image), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert _point(follower) == point
        mount.leave()  # the leader ends first: the follower still reads
        assert mount_release.is_mounted(point) and (point / "train").is_dir()
        assert follower.stdin is not None and follower.stdout is not None
        follower.stdin.write("leave\n")
        follower.stdin.flush()
        said = [follower.stdout.readline().strip() for _ in range(2)]
        assert said == [f"hpctrain: data: unmounted {point} (the node's last task to end)", "LEFT"]
        assert not mount_release.is_mounted(point)  # at once, by the follower, not later by the watcher
        ready = json.loads((point.parent / "READY-0").read_text())
        assert not mount_release._is_our_daemon(ready["pid"], point)
    finally:
        _kill(follower)


def test_mounting_in_a_process_without_a_task_token_sets_none(image: Path, tmp_path: Path, monkeypatch) -> None:
    """A token left in the environment is inherited by every later child, and a task reaper kills what carries
    its token: a test session that trained in-process on an image had later jobs killed that way."""
    from hpctrain.contract.process_tokens import TOKEN_ENV

    require_mount()
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    point = mount.open_image(
        image, tmp_path, is_node_leader=True, stage=False, environ={"SLURM_JOB_ID": "79", "SLURM_RESTART_COUNT": "0"}
    )
    try:
        assert TOKEN_ENV not in os.environ
    finally:
        mount.leave(log=lambda line: None)
    assert not mount_release.is_mounted(point)


# ------------------------------------------------------------------ pack follows what the job reads, on hostile trees


def _extract(image: Path, where: Path) -> Path:
    subprocess.run(["unsquashfs", "-d", str(where), str(image)], capture_output=True, check=True)
    return where


def _kinds(image: Path) -> dict[str, str]:
    """Each path in the image and its type letter (``d``, ``-``, ``l``, ``p`` ...), from ``unsquashfs -lls``."""
    done = subprocess.run(["unsquashfs", "-lls", "-d", "R", str(image)], capture_output=True, text=True, check=True)
    found = {}
    for line in done.stdout.splitlines():
        if line[:1] in "d-lpcbs" and " R" in line:
            found[line.split(" R", 1)[1].lstrip("/")] = line[0]
    return found


def _linked_tree(tmp_path: Path) -> Path:
    """A tree assembled with ``ln -s``, as on clusters: a class and the whole val split linked from a pool."""
    pool = tmp_path / "pool"
    make_dataset(pool, classes=3, per_class=4, val_per_class=2, image_size=16)
    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    for name in ("class_00", "class_01"):
        os.symlink(pool / "train" / name, root / "train" / name)
    shutil.copytree(pool / "train" / "class_02", root / "train" / "class_02", symlinks=True)
    first = pool / "train" / "class_00" / sorted(os.listdir(pool / "train" / "class_00"))[0]
    os.symlink(first, root / "train" / "class_02" / "linked.jpg")
    os.symlink(pool / "val", root / "val")
    return root


def test_pack_follows_links_as_the_job_does_and_stores_their_content(tmp_path: Path, env) -> None:
    require_pack_tools()
    root, out = _linked_tree(tmp_path), tmp_path / "out.sqsh"
    done = hpctrain("pack", str(root), str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert "4 symlink(s) followed" in done.stdout and "left out" not in done.stdout
    assert f"followed val -> {tmp_path / 'pool' / 'val'} (its content is stored)" in done.stdout
    index = _index(out, tmp_path)
    for split in ("train", "val"):
        scanned = scan_split(root / split)  # what a job on the folder reads
        assert index["splits"][split]["classes"] == scanned.classes
        assert [tuple(s) for s in index["splits"][split]["samples"]] == scanned.samples
    assert len(index["splits"]["train"]["samples"]) == 13 and len(index["splits"]["val"]["samples"]) == 6
    kinds = _kinds(out)
    assert "l" not in kinds.values(), "the image holds a link: it would point outside"
    tree = _extract(out, tmp_path / "x")
    for split in ("train", "val"):
        for rel, _ in scan_split(root / split).samples:
            assert (tree / split / rel).read_bytes() == (root / split / rel).read_bytes()


def test_a_newline_in_a_name_is_never_injected_into_mksquashfs(tmp_path: Path) -> None:
    require_pack_tools()
    root = tmp_path / "data"
    make_dataset(root, classes=2, per_class=3, val_per_class=2, image_size=16)
    victim = root / "train" / "class_01"
    # the injection of round 3: a skipped link whose name, split at the newline of the exclude list, named a
    # whole class (relative to mksquashfs's sources, the root's folders)
    (root / "train" / "class_00" / "evil\nclass_01").symlink_to("/nonexistent")
    (root / "train" / "class_00" / "odd\nname.jpg").write_bytes((victim / os.listdir(victim)[0]).read_bytes())
    lines: list[str] = []
    result = pack.pack(root, tmp_path / "out.sqsh", log=lines.append)
    skipped = dict(result.skipped)
    assert "leads nowhere" in skipped["train/class_00/evil\nclass_01"]
    assert "line break" in skipped["train/class_00/odd\nname.jpg"]
    assert not [line for line in lines if "\n" in line]  # every name printed escaped
    index = _index(tmp_path / "out.sqsh", tmp_path)
    assert [tuple(s) for s in index["splits"]["train"]["samples"]] == [
        s for s in scan_split(root / "train").samples if "\n" not in s[0]
    ]
    kinds = _kinds(tmp_path / "out.sqsh")
    assert sum(1 for p in kinds if p.startswith("train/class_01/") and kinds[p] == "-") == 3  # the class is whole
    assert not [p for p in kinds if "evil" in p or "odd" in p]


def test_loops_pseudo_file_systems_and_fifos_are_left_out_and_named(tmp_path: Path, env) -> None:
    require_pack_tools()
    root = tmp_path / "data"
    make_dataset(root, classes=2, per_class=3, val_per_class=2, image_size=16)
    cls = root / "train" / "class_00"
    (cls / "root").symlink_to("/")  # round 3 walked into /proc through this
    (cls / "proc").symlink_to("/proc/self")
    (cls / "up").symlink_to("../..")
    os.mkfifo(cls / "\x1b[31mfifo.jpg")
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "pack", str(root), str(tmp_path / "out.sqsh")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\\x1b[31mfifo.jpg: a FIFO, not a regular file" in done.stdout
    for name, why in (("root", "a loop"), ("proc", "on a pseudo file system"), ("up", "a loop")):
        assert f"skipped train/class_00/{name}: {why}" in done.stdout
    assert "4 path(s) left out" in done.stdout
    kinds = _kinds(tmp_path / "out.sqsh")
    assert not [p for p in kinds if p.startswith("train/class_00/") and kinds[p] != "-"]
    samples = [rel for rel, _ in _index(tmp_path / "out.sqsh", tmp_path)["splits"]["train"]["samples"]]
    assert samples == [rel for rel, _ in scan_split(root / "train").samples] and len(samples) == 6
    strict = hpctrain("pack", str(root), str(tmp_path / "s.sqsh"), "--strict", env=env)
    assert_user_error(strict, 2, "4 path(s)")
    assert not (tmp_path / "s.sqsh").exists()


def test_a_split_that_cannot_be_packed_says_why(tmp_path: Path, env) -> None:
    require_pack_tools()
    root = tmp_path / "data"
    make_dataset(root, classes=2, per_class=3, val_per_class=2, image_size=16)
    shutil.rmtree(root / "val")
    (root / "val").symlink_to("/proc/self")  # a folder, on a pseudo file system
    assert_user_error(hpctrain("pack", str(root), str(tmp_path / "o.sqsh"), env=env), 2, "val", "pseudo file system")
    (root / "val").unlink()
    (root / "val").mkdir()
    (root / "val" / "loose.jpg").write_bytes(b"x")  # no class folder
    assert_user_error(hpctrain("pack", str(root), str(tmp_path / "o.sqsh"), env=env), 2, "no class folders")


@pytest.mark.parametrize("processors", ["0", "-1", "1025", "many"])
def test_processors_is_range_checked(processors: str, tree: Path, tmp_path: Path, env) -> None:
    done = hpctrain("pack", str(tree), str(tmp_path / "o.sqsh"), f"--processors={processors}", env=env)
    assert done.returncode == 2 and "1 to 1,024" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(pack.PackError, match="processors"):
        pack.pack(tree, tmp_path / "o.sqsh", processors=0, log=lambda line: None)
    assert not (tmp_path / "o.sqsh").exists()


def test_out_reached_through_a_link_into_the_tree_is_refused(tree: Path, tmp_path: Path, env) -> None:
    (tmp_path / "outdir").symlink_to(tree / "train")
    assert_user_error(hpctrain("pack", str(tree), str(tmp_path / "outdir" / "x.sqsh"), env=env), 2, "inside the tree")
    assert not (tree / "train" / "x.sqsh").exists()
    (tmp_path / "link.sqsh").symlink_to(tmp_path / "elsewhere.sqsh")
    assert_user_error(hpctrain("pack", str(tree), str(tmp_path / "link.sqsh"), env=env), 2, "is a symlink")


@pytest.mark.parametrize("folder", ["/proc", "/sys"])
def test_out_in_a_folder_that_cannot_be_written_is_one_line(folder: str, tree: Path, env) -> None:
    require_pack_tools()
    assert_user_error(hpctrain("pack", str(tree), f"{folder}/x.sqsh", env=env), 2, folder)

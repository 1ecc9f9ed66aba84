"""Where a script job's code is for every attempt (hpctrain/launch/script_code.py): the script's folder
copied at submit by the entry point's rules (what git lists, no hidden file, no symlink out), never the run's
own output; the paths each attempt runs; the dry run's plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.jobspec.models import JobSpec
from hpctrain.launch import code_snapshot, script_code
from tests.git_helpers import git

BOTH = ("import_root", script_code.SCRIPT_DIR_KEY)


def spec(out: Path, **script: object) -> JobSpec:
    return JobSpec.model_validate({"name": "s", "output_dir": str(out), "script": script})


def copied_files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())


def test_a_folder_outside_git_is_copied_but_not_the_runs_inside_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "lib").mkdir(parents=True)
    (project / "train.py").write_text("import lib.x\n")
    (project / "lib" / "x.py").write_text("")
    run_dir = project / "runs" / "s" / "1"
    (project / "runs" / "s" / "0").mkdir(parents=True)
    (project / "runs" / "s" / "0" / "snapshot.pt").write_bytes(b"0" * 100)
    run_dir.mkdir(parents=True)
    job = spec(project / "runs", path=str(project / "train.py"))
    source = script_code.locate(job.script)  # type: ignore[arg-type]
    assert source is not None and source.git_root is None
    snap = script_code.take(source, job, run_dir)
    assert copied_files(run_dir) == ["code/lib/x.py", "code/train.py"], "earlier runs are no code"
    assert snap.left_out == ["runs: the run's output directory"]
    code = script_code.script_code(job, run_dir, snap.as_json())
    assert code.file == str(run_dir / "code/train.py") and code.script_dir == str(run_dir / "code")
    assert code.module is None and code.python_path is None


def test_a_script_in_a_git_tree_copies_what_git_lists_of_its_folder(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name, text in {
        "tools/train.py": "",
        "tools/conf.yaml": "lr: 0.1",
        "tools/data.bin": "x",
        "tools/.env": "TOKEN=secret",
        "pkg/__init__.py": "",
        ".gitignore": "data.bin\n",
    }.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", ".gitignore", "tools/train.py", "pkg")
    git(repo, "commit", "-q", "-m", "first")
    (repo / "tools" / "passwd").symlink_to("/etc/passwd")
    run_dir = tmp_path / "runs" / "1"
    run_dir.mkdir(parents=True)
    job = spec(tmp_path / "runs", path=str(repo / "tools" / "train.py"))
    snap = script_code.take(script_code.locate(job.script), job, run_dir)  # type: ignore[arg-type]
    assert copied_files(run_dir) == ["code/conf.yaml", "code/train.py"], "untracked but not ignored is copied"
    assert snap.script_dir == "code" and snap.git_commit and snap.git_dirty, "conf.yaml is not committed"
    assert snap.left_out_count == 3 and any("passwd: a symlink to /etc/passwd" in n for n in snap.left_out)
    assert script_code.script_code(job, run_dir, snap.as_json()).file == str(run_dir / "code/train.py")
    _, lines = script_code.planned(job, run_dir, snapshot=True)
    assert "2 files are copied into RUN_DIR/code/" in lines[0] and "left out" in lines[1], "as submit does"


def test_a_module_runs_from_its_copy_with_the_import_root_on_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / "src" / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "mypkg" / "train.py").write_text("")
    monkeypatch.chdir(tmp_path / "src")
    run_dir = tmp_path / "runs" / "1"
    run_dir.mkdir(parents=True)
    job = spec(tmp_path / "runs", module="mypkg.train")
    record = script_code.take(script_code.locate(job.script), job, run_dir).as_json()  # type: ignore[arg-type]
    code = script_code.script_code(job, run_dir, record)
    assert (code.file, code.module) == (None, "mypkg.train")
    assert code.python_path == str(run_dir / "code") and code.script_dir == str(run_dir / "code/mypkg")
    planned, lines = script_code.planned(job, run_dir, snapshot=True)
    assert planned == code and "2 files are copied into RUN_DIR/code/" in lines[0], "the dry run says what submit does"


def test_without_a_snapshot_every_attempt_runs_the_live_file(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    job = spec(tmp_path / "runs", path=str(tmp_path / "train.py"))
    code = script_code.script_code(job, tmp_path / "runs" / "1", None)
    assert (code.file, code.script_dir) == (str(tmp_path / "train.py"), str(tmp_path))
    _, lines = script_code.planned(job, tmp_path / "runs" / "1", snapshot=False)
    assert lines == [f"# code: --no-snapshot: every attempt runs the live {tmp_path / 'train.py'}"]


def test_a_crafted_record_pointing_out_of_the_run_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    job = spec(tmp_path / "runs", path=str(tmp_path / "train.py"))
    crafted = {script_code.SCRIPT_DIR_KEY: "../../../etc"}
    assert script_code.script_code(job, tmp_path / "runs" / "1", crafted).file == str(tmp_path / "train.py")


def test_a_script_directly_in_the_home_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "train.py").write_text("")
    job = spec(tmp_path / "runs", path=str(tmp_path / "train.py"))
    with pytest.raises(UsageError, match="your home directory, so it would copy all of it") as caught:
        script_code.locate(job.script)  # type: ignore[arg-type]
    assert "--no-snapshot" in (caught.value.hint or "")


def test_a_sweeps_record_seen_from_a_trial(tmp_path: Path) -> None:
    record = {"import_root": "code", script_code.SCRIPT_DIR_KEY: "code/proj", "files": 3}
    moved = code_snapshot.for_trial(record, tmp_path, tmp_path / "trial-000")
    assert {key: moved[key] for key in BOTH} == {"import_root": "../code", script_code.SCRIPT_DIR_KEY: "../code/proj"}
    assert moved["files"] == 3


# -- the rule is on the resolved target (code_selection.py): whatever a name leads to ------------------------------
def home_with_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def test_a_script_that_leads_into_a_hidden_home_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = home_with_secrets(tmp_path, monkeypatch)
    (home / ".ssh" / "train.py").write_text("")
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").symlink_to(home / ".ssh" / "train.py")  # the red team's case
    (tmp_path / "linked").symlink_to(home / ".ssh", target_is_directory=True)  # the folder itself a link
    (home / ".config" / "tool").mkdir(parents=True)  # any hidden folder of the home, however deep
    (home / ".config" / "tool" / "train.py").write_text("")
    for path in (project / "train.py", tmp_path / "linked" / "train.py", home / ".config" / "tool" / "train.py"):
        with pytest.raises(UsageError, match="lies in the hidden folder") as caught:
            script_code.locate(spec(tmp_path / "runs", path=str(path)).script)  # type: ignore[arg-type]
        assert "--no-snapshot" in (caught.value.hint or "")


def test_a_link_in_the_folder_to_a_hidden_one_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = home_with_secrets(tmp_path, monkeypatch)
    project = tmp_path / "project"
    (project / ".secrets").mkdir(parents=True)
    (project / ".secrets" / "token").write_text("secret")
    (project / "train.py").write_text("")
    (project / "keys").symlink_to(project / ".secrets", target_is_directory=True)  # inside, but hidden
    (project / "token.txt").symlink_to(project / ".secrets" / "token")
    (project / "ssh").symlink_to(home / ".ssh", target_is_directory=True)  # outside
    job = spec(tmp_path / "runs", path=str(project / "train.py"))
    source = script_code.locate(job.script)  # type: ignore[arg-type]
    assert source is not None
    run_dir = tmp_path / "runs" / "1"
    snap = script_code.take(source, job, run_dir)
    assert copied_files(run_dir) == ["code/train.py"]
    left = "\n".join(snap.left_out)
    assert "keys: leads to" in left and "token.txt: leads to" in left and "a hidden file or folder" in left
    assert f"ssh: a symlink to {home.resolve() / '.ssh'}, outside" in left


def test_a_file_swapped_for_a_link_after_the_plan_is_not_copied(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".secrets").mkdir(parents=True)
    (project / ".secrets" / "token").write_text("secret")
    (project / "train.py").write_text("")
    (project / "conf.yaml").write_text("lr: 1")
    job = spec(tmp_path / "runs", path=str(project / "train.py"))
    source = script_code.locate(job.script)  # type: ignore[arg-type]
    assert source is not None
    chosen = script_code.plan(source, job)
    (project / "conf.yaml").unlink()
    (project / "conf.yaml").symlink_to(project / ".secrets" / "token")
    with pytest.raises(UsageError, match="conf.yaml: leads to .*hidden"):
        code_snapshot.take(source, tmp_path / "run", chosen)
    assert not (tmp_path / "run" / "code" / "conf.yaml").exists()


@pytest.mark.parametrize("where", ["home", "root", "sticky"])
def test_a_script_directly_in_a_folder_of_everything_is_refused(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$HOME and / as before, and now a shared folder everyone writes into (/tmp, /var/tmp, /dev/shm)."""
    folder = {"home": tmp_path, "root": Path("/"), "sticky": tmp_path / "shared"}[where]
    monkeypatch.setenv("HOME", str(tmp_path))
    if where == "sticky":
        folder.mkdir()
        folder.chmod(0o1777)
    why = {"home": "your home directory", "root": "a file system's root", "sticky": "world-writable"}[where]
    with pytest.raises(UsageError, match=why):
        script_code.locate(spec(tmp_path / "runs", path=str(folder / "train.py")).script)  # type: ignore[arg-type]


def test_symlink_loops_are_left_out_never_a_traceback(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "train.py").write_text("")
    (project / "a").symlink_to(project / "b")
    (project / "b").symlink_to(project / "a")
    (project / "self").symlink_to("self")
    (project / "sub" / "up").symlink_to(project / "sub" / "up2")
    (project / "sub" / "up2").symlink_to(project / "sub" / "up")
    job = spec(tmp_path / "runs", path=str(project / "train.py"))
    source = script_code.locate(job.script)  # type: ignore[arg-type]
    assert source is not None
    code, lines = script_code.planned(job, tmp_path / "runs" / "1", snapshot=True)
    assert "a: a symlink loop" in lines[1] and "self: a symlink loop" in lines[1]
    snap = script_code.take(source, job, tmp_path / "runs" / "1")
    assert copied_files(tmp_path / "runs" / "1") == ["code/train.py"]
    assert sum("symlink loop" in note for note in snap.left_out) == 5


@pytest.mark.parametrize("limit", ["bytes", "files"])
def test_the_dry_run_refuses_what_the_submit_refuses(
    limit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One decision for both (the red team's dry run called a 10 GiB, 100k-file folder copyable)."""
    monkeypatch.setattr(code_snapshot, "MAX_SNAPSHOT_BYTES" if limit == "bytes" else "MAX_SNAPSHOT_FILES", 3)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import os\n")
    for index in range(4):
        (project / f"data{index}.bin").write_bytes(b"")
    job = spec(tmp_path / "runs", path=str(project / "train.py"))
    source = script_code.locate(job.script)  # type: ignore[arg-type]
    assert source is not None
    with pytest.raises(UsageError, match="would copy") as planned:
        script_code.planned(job, tmp_path / "runs" / "1", snapshot=True)
    with pytest.raises(UsageError, match="would copy") as taken:
        script_code.take(source, job, tmp_path / "runs" / "1")
    assert str(planned.value) == str(taken.value)
    assert not (tmp_path / "runs" / "1" / "code").exists()

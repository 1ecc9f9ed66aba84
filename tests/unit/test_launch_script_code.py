"""Where a script job's code is for every attempt (hpctrain/launch/script_code.py): the folder or git tree
copied at submit, never the run's own output; the paths each attempt runs; the dry run's plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.jobspec.models import JobSpec
from hpctrain.launch import script_code
from tests.git_helpers import git

BOTH = ("import_root", script_code.SCRIPT_DIR_KEY)


def spec(out: Path, **script: object) -> JobSpec:
    return JobSpec.model_validate({"name": "s", "output_dir": str(out), "script": script})


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
    record = script_code.take(source, job, run_dir)
    copied = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
    assert copied == ["code/project/lib/x.py", "code/project/train.py"], "earlier runs are no code"
    code = script_code.script_code(job, run_dir, record)
    assert code.file == str(run_dir / "code/project/train.py") and code.script_dir == str(run_dir / "code/project")
    assert code.module is None and code.python_path is None


def test_a_script_in_a_git_tree_copies_the_tree_and_runs_its_copy(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name, text in {
        "tools/train.py": "",
        "pkg/__init__.py": "",
        "data.bin": "x",
        ".gitignore": "data.bin\n",
    }.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    run_dir = tmp_path / "runs" / "1"
    run_dir.mkdir(parents=True)
    job = spec(tmp_path / "runs", path=str(repo / "tools" / "train.py"))
    record = script_code.take(script_code.locate(job.script), job, run_dir)  # type: ignore[arg-type]
    assert record[script_code.SCRIPT_DIR_KEY] == "code/tools" and record["git_commit"]
    assert (run_dir / "code/pkg/__init__.py").exists() and not (run_dir / "code/data.bin").exists()
    assert script_code.script_code(job, run_dir, record).file == str(run_dir / "code/tools/train.py")


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
    record = script_code.take(script_code.locate(job.script), job, run_dir)  # type: ignore[arg-type]
    code = script_code.script_code(job, run_dir, record)
    assert (code.file, code.module) == (None, "mypkg.train")
    assert code.python_path == str(run_dir / "code") and code.script_dir == str(run_dir / "code/mypkg")
    planned, lines = script_code.planned(job, run_dir, snapshot=True)
    assert planned == code and "is copied into RUN_DIR/code/" in lines[0], "the dry run says what submit does"


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
    with pytest.raises(UsageError, match="would copy all of it") as caught:
        script_code.locate(job.script)  # type: ignore[arg-type]
    assert "--no-snapshot" in (caught.value.hint or "")


def test_a_sweeps_record_seen_from_a_trial(tmp_path: Path) -> None:
    record = {"import_root": "code", script_code.SCRIPT_DIR_KEY: "code/proj", "files": 3}
    moved = script_code.for_trial(record, tmp_path, tmp_path / "trial-000")
    assert {key: moved[key] for key in BOTH} == {"import_root": "../code", script_code.SCRIPT_DIR_KEY: "../code/proj"}
    assert moved["files"] == 3

"""The code snapshot: what is copied, what run.json records, and where the entry point is imported from."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hpctrain.contract.rundir import code_dir
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.launch import code_snapshot
from hpctrain.runtime.launcher import load_user_code
from tests.git_helpers import git


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with a src/ layout package, an ignored data folder and a committed HEAD."""
    root = tmp_path / "repo"
    write(root / "src" / "snapcase_git" / "__init__.py", "")
    write(root / "src" / "snapcase_git" / "job.py", "VERSION = 'committed'\ndef main(ctx):\n    return VERSION\n")
    write(root / ".gitignore", "data/\n")
    write(root / "data" / "big.bin", "x" * 1000)
    write(root / "README", "readme\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_git_tree_gives_the_package_with_untracked_files_and_without_ignored_ones(repo: Path, tmp_path: Path) -> None:
    write(repo / "src" / "snapcase_git" / "new_module.py", "X = 1\n")  # not added yet
    write(repo / "src" / "snapcase_git" / "cache.bin", "y")
    write(repo / ".gitignore", "data/\n*.bin\n")
    source = code_snapshot.locate("snapcase_git.job:main", [str(repo / "src")])
    assert source is not None and source.git_root == repo.resolve()

    run_dir = tmp_path / "run"
    snap = code_snapshot.take(source, run_dir)

    copied = {p.relative_to(code_dir(run_dir)).as_posix() for p in code_dir(run_dir).rglob("*") if p.is_file()}
    assert copied == {"snapcase_git/__init__.py", "snapcase_git/job.py", "snapcase_git/new_module.py"}
    assert snap.import_root == "code" and snap.packages == ["snapcase_git"]
    assert snap.git_commit == git(repo, "rev-parse", "HEAD")
    assert snap.git_dirty is True  # the untracked module
    assert snap.files == 3 and snap.bytes == sum((code_dir(run_dir) / name).stat().st_size for name in copied)
    assert snap.left_out_count == 1  # cache.bin, which git ignores


def test_clean_tree_is_not_dirty_and_the_copy_holds_what_was_on_disk(repo: Path, tmp_path: Path) -> None:
    source = code_snapshot.locate("snapcase_git.job:main", [str(repo / "src")])
    snap = code_snapshot.take(source, tmp_path / "run")
    assert snap.git_dirty is False
    assert "committed" in (tmp_path / "run" / snap.import_root / "snapcase_git" / "job.py").read_text()


def test_package_outside_git_is_copied_alone(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    write(lib / "snapcase_plain" / "__init__.py", "")
    write(lib / "snapcase_plain" / "sub" / "mod.py", "Y = 2\n")
    write(lib / "snapcase_plain" / "__pycache__" / "mod.cpython-311.pyc", "junk")
    write(lib / "unrelated.py", "")
    source = code_snapshot.locate("snapcase_plain.sub.mod:f", [str(lib)])
    assert source is not None
    if source.git_root is not None:
        pytest.skip("tmp_path lies inside a git work tree on this machine")
    snap = code_snapshot.take(source, tmp_path / "run")
    copied = sorted(
        p.relative_to(code_dir(tmp_path / "run")).as_posix() for p in code_dir(tmp_path / "run").rglob("*.py")
    )
    assert copied == ["snapcase_plain/__init__.py", "snapcase_plain/sub/mod.py"]
    assert snap.import_root == "code" and snap.git_commit is None


def test_single_module_file(tmp_path: Path) -> None:
    write(tmp_path / "lib" / "snapcase_single.py", "def main(ctx):\n    return 1\n")
    source = code_snapshot.locate("snapcase_single:main", [str(tmp_path / "lib")])
    if source.git_root is not None:
        pytest.skip("tmp_path lies inside a git work tree on this machine")
    code_snapshot.take(source, tmp_path / "run")
    assert (code_dir(tmp_path / "run") / "snapcase_single.py").is_file()


def test_nothing_to_copy_for_hpctrain_installed_or_missing_code(tmp_path: Path) -> None:
    assert code_snapshot.locate("hpctrain.examples.allreduce_check:main") is None
    assert code_snapshot.locate("no_such_module_anywhere:main", [str(tmp_path)]) is None
    site = tmp_path / "site-packages"
    write(site / "snapcase_installed" / "__init__.py", "")
    assert code_snapshot.locate("snapcase_installed:main", [str(site)]) is None


@pytest.mark.parametrize("entrypoint", ["json:main", "os:getcwd", "json.tool:main", "_json:make_scanner"])
def test_a_standard_library_entry_point_is_neither_copied_nor_put_first_on_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entrypoint: str
) -> None:
    """A copy of json/ first on the nodes' sys.path would shadow their own Python's json (issue 19)."""
    monkeypatch.chdir(tmp_path)
    assert code_snapshot.locate(entrypoint) is None
    stdlib = Path(__import__("sysconfig").get_paths()["stdlib"])
    assert code_snapshot.in_environment(stdlib) and code_snapshot.in_environment(stdlib / "json")
    assert not code_snapshot.in_environment(tmp_path)


def test_a_users_package_named_like_a_standard_module_is_still_copied(tmp_path: Path) -> None:
    """Where it lies decides, not its name: the user's own code/ package in the tree is theirs."""
    write(code_dir(tmp_path / "tree") / "__init__.py", "def main(ctx):\n    return 1\n")
    source = code_snapshot.locate("code:main", [str(tmp_path / "tree")])
    assert source is not None and source.import_dir == (tmp_path / "tree").resolve()


def test_a_huge_tree_is_refused_with_the_way_out(repo: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(code_snapshot, "MAX_SNAPSHOT_BYTES", 10)
    source = code_snapshot.locate("snapcase_git.job:main", [str(repo / "src")])
    with pytest.raises(UsageError) as caught:
        code_snapshot.take(source, tmp_path / "run")
    assert "--no-snapshot" in caught.value.hint


def test_recorded_import_root_must_stay_inside_the_run(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    code_dir(run).mkdir(parents=True)
    assert code_snapshot.import_root(run, {"import_root": "code"}) == code_dir(run).resolve()
    assert code_snapshot.import_root(run, {"import_root": "../../elsewhere"}) is None
    assert code_snapshot.import_root(run, None) is None
    assert code_snapshot.import_root(run, {"import_root": 3}) is None
    trial = run / "trial-000"
    assert code_snapshot.import_root(trial, {"import_root": "../code"}) == code_dir(run).resolve()


def test_entry_point_is_imported_from_the_copy_not_the_live_tree(repo: Path, tmp_path: Path, monkeypatch) -> None:
    source = code_snapshot.locate("snapcase_git.job:main", [str(repo / "src")])
    snap = code_snapshot.take(source, tmp_path / "run")
    write(repo / "src" / "snapcase_git" / "job.py", "VERSION = 'edited'\ndef main(ctx):\n    return VERSION\n")
    monkeypatch.syspath_prepend(str(repo / "src"))  # the live tree is importable too
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in sys.modules if n.startswith("snapcase_git")]:
        monkeypatch.delitem(sys.modules, name)

    main = load_user_code("snapcase_git.job:main", str(tmp_path / "run" / snap.import_root))
    assert main(None) == "committed"


def test_a_missing_copy_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HpctrainError) as caught:
        load_user_code("snapcase_gone.job:main", str(code_dir(tmp_path / "run")))
    assert "snapshot" in caught.value.message and "--no-snapshot" in caught.value.hint


# -- hostile trees: what the entry point needs, nothing outside its import directory -----------------------------
@pytest.fixture
def dotfiles_home(tmp_path: Path) -> Path:
    """A $HOME kept under git (dotfiles), the user's package and a helper module in it, secrets beside them."""
    home = tmp_path / "home"
    write(home / ".bashrc", "export X=1\n")
    write(home / ".ssh" / "id_rsa", "-----BEGIN OPENSSH PRIVATE KEY-----\n")
    write(home / ".ssh" / "config", "Host *\n")
    write(home / "notes.txt", "private notes\n")
    write(home / "other_project" / "__init__.py", "")
    write(home / "mytrain" / "__init__.py", "")
    write(
        home / "mytrain" / "job.py", "import os\nimport helpers\nfrom mytrain import model\ndef main(ctx):\n    pass\n"
    )
    write(home / "mytrain" / "model.py", "import importlib\nimportlib.import_module('plugins.extra')\n")
    write(home / "mytrain" / "config.yaml", "lr: 0.1\n")  # package data travels with the package
    write(home / "mytrain" / ".env", "TOKEN=secret\n")
    write(home / "helpers.py", "import numpy\n")
    write(home / "plugins" / "__init__.py", "")
    write(home / "plugins" / "extra.py", "")
    git(home, "init", "-q")
    git(home, "add", ".bashrc", ".ssh/config", "mytrain", "helpers.py", "plugins", "other_project")
    git(home, "commit", "-q", "-m", "dotfiles")  # .ssh/id_rsa and notes.txt: untracked, not ignored
    return home


def copied_files(run_dir: Path) -> set[str]:
    code = run_dir / "code"
    return {p.relative_to(code).as_posix() for p in code.rglob("*") if p.is_file() or p.is_symlink()}


def test_a_dotfiles_home_gives_the_entry_points_imports_and_no_secret(dotfiles_home: Path, tmp_path: Path) -> None:
    source = code_snapshot.locate("mytrain.job:main", [str(dotfiles_home)])
    assert source is not None and source.git_root == dotfiles_home.resolve()
    snap = code_snapshot.take(source, tmp_path / "run")
    assert copied_files(tmp_path / "run") == {
        "mytrain/__init__.py",
        "mytrain/job.py",
        "mytrain/model.py",
        "mytrain/config.yaml",
        "helpers.py",  # imported by job.py, beside the package
        "plugins/__init__.py",  # imported by name through importlib
        "plugins/extra.py",
    }
    assert snap.packages == ["mytrain", "helpers", "plugins"]
    assert snap.left_out_count >= 1  # mytrain/.env, hidden
    assert not (tmp_path / "run" / "code" / ".ssh").exists()


def test_symlinks_out_of_the_import_directory_are_never_followed(tmp_path: Path) -> None:
    outside = write(tmp_path / "elsewhere" / "secret.txt", "not yours to copy\n")
    tree = tmp_path / "tree"
    write(tree / "mypkg" / "__init__.py", "")
    write(tree / "mypkg" / "job.py", "def main(ctx):\n    pass\n")
    write(tree / "shared.py", "VALUE = 1\n")
    (tree / "mypkg" / "shadow.py").symlink_to("/etc/shadow")
    (tree / "mypkg" / "secret.txt").symlink_to(outside)
    (tree / "mypkg" / "etc").symlink_to("/etc", target_is_directory=True)
    (tree / "mypkg" / "alias.py").symlink_to(tree / "shared.py")  # inside the import directory: its content
    (tree / "mypkg" / "loop").symlink_to(tree / "mypkg", target_is_directory=True)
    (tree / "mypkg" / "broken.py").symlink_to(tree / "nowhere.py")
    os.mkfifo(tree / "mypkg" / "queue.py")  # would hang a copy
    (tree / "mypkg" / "evil\x1b[2J.py").symlink_to("/etc/passwd")  # its name is said inert
    source = code_snapshot.locate("mypkg.job:main", [str(tree)])
    assert source is not None
    if source.git_root is not None:
        pytest.skip("tmp_path lies inside a git work tree on this machine")
    snap = code_snapshot.take(source, tmp_path / "run")
    assert copied_files(tmp_path / "run") == {"mypkg/__init__.py", "mypkg/job.py", "mypkg/alias.py"}
    assert (tmp_path / "run" / "code" / "mypkg" / "alias.py").read_text() == "VALUE = 1\n"
    assert not (tmp_path / "run" / "code" / "mypkg" / "alias.py").is_symlink()
    left = "\n".join(snap.left_out)  # escaped already: they are printed as they are
    root = tree.resolve()
    assert f"mypkg/shadow.py: a symlink to /etc/shadow, outside {root}" in left
    assert f"mypkg/secret.txt: a symlink to {outside.resolve()}, outside {root}" in left
    assert f"mypkg/etc: a symlink to /etc, outside {root}" in left
    assert "mypkg/loop: a symlink loop" in left and "mypkg/broken.py: a broken symlink" in left
    assert "mypkg/queue.py: not a regular file" in left
    assert "mypkg/evil\\x1b[2J.py: a symlink to /etc/passwd" in left and "\x1b" not in left
    assert snap.left_out_count == 7


def test_submit_says_what_was_left_out(dotfiles_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.jobspec.load import load_job
    from hpctrain.launch.dry_run import snapshot_plan
    from hpctrain.launch.plan import code_line

    (dotfiles_home / "mytrain" / "shadow.py").symlink_to("/etc/shadow")
    monkeypatch.chdir(dotfiles_home)
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    write(tmp_path / "job.yaml", "name: x\ncluster: local\nentrypoint: mytrain.job:main\n")
    lines = snapshot_plan(load_job(tmp_path / "job.yaml"), snapshot=True)
    assert lines[0].startswith(f"# code: mytrain, helpers, plugins from {dotfiles_home.resolve()} (git ")
    assert "7 files are copied" in lines[0]
    assert lines[1].startswith("# code: left out: mytrain/shadow.py: a symlink to /etc/shadow")
    assert "1 hidden file or folder" in lines[1]
    snap = code_snapshot.take(code_snapshot.locate("mytrain.job:main"), tmp_path / "run")  # type: ignore[arg-type]
    line = code_line(snap)
    assert line == (
        "7 files of mytrain, helpers, plugins copied into RUN_DIR/code/; left out 2: mytrain/shadow.py: a symlink "
        f"to /etc/shadow, outside {dotfiles_home.resolve()}; 1 hidden file or folder"
    )


def test_an_entry_point_package_that_leads_into_a_hidden_home_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    write(home / ".ssh" / "id_rsa", "key\n")
    write(home / ".ssh" / "stolen" / "__init__.py", "")
    write(home / ".ssh" / "stolen" / "job.py", "import id_rsa\ndef main(ctx):\n    pass\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "mypkg").symlink_to(home / ".ssh" / "stolen", target_is_directory=True)
    with pytest.raises(UsageError, match="hidden folder") as caught:
        code_snapshot.locate("mypkg.job:main", [str(tree)])
    assert "--no-snapshot" in (caught.value.hint or "")


def test_loops_in_an_entry_points_package_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``submit --dry-run`` of such a package says so, never a traceback (the message once resolved again)."""
    from cli_helpers import in_process

    tree = tmp_path / "tree"
    write(tree / "mypkg" / "__init__.py", "")
    write(tree / "mypkg" / "job.py", "def main(ctx):\n    pass\n")
    (tree / "mypkg" / "l1").symlink_to(tree / "mypkg" / "l2")
    (tree / "mypkg" / "l2").symlink_to(tree / "mypkg" / "l1")
    (tree / "mypkg" / "sub").symlink_to("sub")
    write(tree / "job.yaml", "name: x\ncluster: local\nresources: {gpus_per_node: 0}\nentrypoint: mypkg.job:main\n")
    monkeypatch.chdir(tree)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    source = code_snapshot.locate("mypkg.job:main", [str(tree)])
    assert source is not None
    snap = code_snapshot.take(source, tmp_path / "run")
    assert snap.files == 2 and {"mypkg/l1: a symlink loop", "mypkg/sub: a symlink loop"} <= set(snap.left_out)
    done = in_process(capsys, "submit", "job.yaml", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "mypkg/l1: a symlink loop" in done.stdout and "Traceback" not in done.stderr

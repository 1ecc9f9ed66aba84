"""An entry point that cannot be called as ``function(ctx, **entrypoint_args)`` is refused at validate and
submit from its source (never imported), and in the job with a message naming it (contract/entrypoint.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpctrain.cli.main import main
from hpctrain.contract.entrypoint import module_source, source_problem, source_signature
from hpctrain.errors import HpctrainError

# Importing any of these modules would fail: the login node must judge them from their source alone.
NOT_ON_LOGIN_NODE = 'raise RuntimeError("imported on the login node")\nimport torch\n'


@pytest.fixture
def tree(tmp_path: Path, isolated: Path) -> Path:
    """A user's package in the submit directory whose __init__ must not run either."""
    package = tmp_path / "mytrain"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text(NOT_ON_LOGIN_NODE)
    (package / "sub" / "__init__.py").write_text("")
    return tmp_path


def write_entry(tree: Path, source: str, module: str = "mytrain/sub/entry.py") -> None:
    (tree / module).write_text(NOT_ON_LOGIN_NODE + source)


def spec(tree: Path, entrypoint: str = "mytrain.sub.entry:main", args: str = "{}") -> Path:
    path = tree / "job.yaml"
    path.write_text(
        f"name: ep\ncluster: local\noutput_dir: {tree / 'runs'}\nentrypoint: {entrypoint}\nentrypoint_args: {args}\n"
    )
    return path


@pytest.mark.parametrize(
    ("source", "args", "reason"),
    [
        ("def main():\n    pass\n", "{}", "too many positional arguments"),
        ("def main(*, ctx):\n    pass\n", "{}", "too many positional arguments"),
        ("def main(ctx, lr):\n    pass\n", "{}", "missing a required argument: 'lr'"),
        ("def main(ctx):\n    pass\n", "{steps: 3}", "got an unexpected keyword argument 'steps'"),
        ("def main(ctx, /, *, lr):\n    pass\n", "{}", "missing a required argument: 'lr'"),
        ("async def main(ctx):\n    pass\n", "{}", "is a coroutine function"),
        ("def other(ctx):\n    pass\n", "{}", "defines no function 'main'"),
    ],
)
def test_validate_refuses_what_the_job_could_not_call(
    tree: Path, capsys: pytest.CaptureFixture[str], source: str, args: str, reason: str
) -> None:
    write_entry(tree, source)
    assert main(["validate", str(spec(tree, args=args))]) == 2
    err = capsys.readouterr().err
    assert "entrypoint:" in err and reason in err, err
    assert str(tree / "mytrain" / "sub" / "entry.py") in err
    assert "define `def main(ctx, **kwargs)`" in err
    assert "mytrain" not in sys.modules  # judged from the source: nothing was imported


@pytest.mark.parametrize(
    ("source", "args"),
    [
        ("def main(ctx, **kwargs):\n    pass\n", "{steps: 3}"),
        ("def main(ctx, steps=1, *, lr=0.1):\n    pass\n", "{steps: 3, lr: 0.2}"),
        ("def main(*args, **kwargs):\n    pass\n", "{}"),
        ("def main(context, /):\n    pass\n", "{}"),
    ],
)
def test_validate_accepts_what_fits(tree: Path, capsys: pytest.CaptureFixture[str], source: str, args: str) -> None:
    write_entry(tree, source)
    assert main(["validate", str(spec(tree, args=args))]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "source",
    [
        "import functools\n@functools.lru_cache\ndef main():\n    pass\n",  # a decorator may change the signature
        "from os import getcwd as main\n",  # bound by an import
        "from elsewhere import *\n",  # may be bound by the star import
        "if True:\n    def main():\n        pass\n",  # conditional
        "def main():\n    pass\ndef main(ctx):\n    pass\n",  # rebound
        "def __getattr__(name):\n    return print\n",
    ],
)
def test_what_the_source_cannot_settle_is_left_to_the_task(tree: Path, source: str) -> None:
    write_entry(tree, source)
    assert source_problem("mytrain.sub.entry:main", {}, [str(tree)]) is None


def test_a_module_not_found_here_is_left_to_the_nodes(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert module_source("not_installed_here.entry", [str(tree)]) is None
    assert source_signature("mytrain.sub.missing", "main", [str(tree)]) is None
    assert main(["validate", str(spec(tree, "not_installed_here.entry:main"))]) == 0


def test_submit_refuses_before_anything_is_written(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_entry(tree, "def main():\n    pass\n")
    assert main(["submit", str(spec(tree)), "--local"]) == 2
    assert "too many positional arguments" in capsys.readouterr().err
    assert not list((tree / "runs").glob("*/*"))


def test_the_task_names_the_entry_point_instead_of_a_raw_type_error(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decorated function passes the login node unjudged; the task reads its real signature."""
    from hpctrain.programs.launcher import load_user_code

    (tree / "jobcode.py").write_text(
        "import functools\n\ndef keep(f):\n    @functools.wraps(f)\n    def inner(*a, **k):\n"
        "        return f(*a, **k)\n    return inner\n\n@keep\ndef main():\n    return 1\n\n"
        "async def coro(ctx):\n    return 1\n\ndef good(ctx, steps=1):\n    return steps\n"
    )
    monkeypatch.syspath_prepend(str(tree))
    assert source_problem("jobcode:main", {}, [str(tree)]) is None  # decorated: not judged here
    with pytest.raises(HpctrainError) as caught:
        load_user_code("jobcode:main", None, {})
    message = caught.value.message
    assert message.startswith("entrypoint 'jobcode:main': hpctrain calls it as main(ctx), but its signature ()")
    assert "too many positional arguments" in message
    with pytest.raises(HpctrainError, match="unexpected keyword argument 'lr'"):
        load_user_code("jobcode:good", None, {"lr": 0.1})
    with pytest.raises(HpctrainError, match="coroutine function"):
        load_user_code("jobcode:coro", None, {})
    assert load_user_code("jobcode:good", None, {"steps": 2})(object(), steps=2) == 2

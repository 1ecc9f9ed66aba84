"""Fixtures shared by the unit tests: an isolated user, an environment for the real command, a small dataset.

``isolated``: no developer's own cluster profiles, job registry or home, and
relative paths resolve in ``tmp_path`` (a module that needs it everywhere says
``pytestmark = pytest.mark.usefixtures("isolated")``). ``env``: the same for a
command run in a fresh interpreter (``cli_helpers.hpctrain``). ``root``: one
small generated ImageFolder per module, for the input pipeline's tests.
``task_local``: a fresh ``hpctrain.task`` session as plain Python sees it (no
launcher's variables), run directory ``tmp_path``, signal handlers restored.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_helpers import isolated_env

# One BLAS thread for numpy (read when numpy loads OpenBLAS, so before any test imports it): see one_torch_thread.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Every unit test's torch ops on one thread. CI runs this tier at nice 10 beside the Slurm legs on two cores:
    a second intra-op thread that waits, spinning, for one the scheduler took away burned 2.5-6x the CPU of one
    thread (efficientnet_b0's forward 44 s of wall time in CI #51); no unit test's assertion is about threads."""
    torch = sys.modules.get("torch")  # a test that has not imported torch does not get it imported here
    threads = torch.get_num_threads() if torch is not None else None
    if torch is not None and threads != 1:
        torch.set_num_threads(1)
    yield
    if torch is not None and threads != 1 and torch.get_num_threads() == 1:
        torch.set_num_threads(threads)  # type: ignore[arg-type]


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as a user with nothing of their own: the config folder it uses (empty)."""
    config = tmp_path / "config"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(config))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return config


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a command run as that user (``cli_helpers.hpctrain(..., env=env)``)."""
    return isolated_env(tmp_path)


@pytest.fixture
def task_local(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """``hpctrain.task`` outside any launcher, in ``tmp_path``; whatever a test registered is forgotten after."""
    from hpctrain.contract import script_env
    from hpctrain.runtime.context import register_context
    from hpctrain.task import session

    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
    for name in (*launcher, *script_env.HPCTRAIN_VARS, "SLURM_JOB_ID", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR1)}
    hook = sys.excepthook
    exits: list[Callable[[], object]] = []
    monkeypatch.setattr(session.atexit, "register", exits.append)  # a script's last heartbeat: run below
    session.reset()
    yield
    for at_exit in exits:  # while tmp_path and the test's streams still exist, not at pytest's exit
        at_exit()
    session.reset()
    register_context(None)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    sys.excepthook = hook


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated ImageFolder (3 classes, 8 train and 5 val JPEGs each, 40 px), one per test module."""
    from hpctrain.dataset.generate import make_dataset

    out = tmp_path_factory.mktemp("data") / "ds"
    make_dataset(out, classes=3, per_class=8, val_per_class=5, image_size=40)
    return out

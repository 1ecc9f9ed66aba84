"""remote/stages.py: which shipped folders ``hpctrain remote prune`` removes, and that it is safe (issue 39).

The policy is a pure function over a ``Stage``; the survey and the removal
run on real folders in tmp_path (the login node's home): links, another
user's folders, fifos and names hpctrain never made are left alone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from cli_helpers import hpctrain

from hpctrain.errors import UsageError
from hpctrain.remote import stages
from hpctrain.remote.stages import Stage, fate_of

DAY = 86400.0


def one(**facts: object) -> Stage:
    base = dict(
        path=Path("t"), age_s=10 * DAY, claimed=True, ended=True, alive=False, has_tree=True, referenced_by=None
    )
    return Stage(**{**base, **facts})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "action"),
    [
        ({}, "drop-tree"),  # answered, old: the project copy goes, the record stays for a late retry
        ({"age_s": DAY}, "keep"),  # recent
        ({"age_s": 40 * DAY}, "drop"),  # the record too
        ({"ended": False, "alive": True, "age_s": 40 * DAY}, "keep"),  # still running
        ({"referenced_by": "/runs/a", "age_s": 40 * DAY}, "keep"),  # a --no-snapshot run runs from it
        ({"claimed": False, "ended": False}, "drop"),  # shipped, never run
        ({"has_tree": False}, "keep"),  # only the record left
        ({"ended": False, "alive": False}, "drop-tree"),  # died before it ended: the record says so to a retry
        ({"report": True, "referenced_by": None}, "drop"),
        ({"report": True, "age_s": 60.0}, "keep"),
    ],
)
def test_the_policy(facts: dict, action: str) -> None:
    assert fate_of(one(**facts), 7 * DAY).action == action


def test_older_than_zero_still_keeps_what_is_running_or_referenced() -> None:
    assert fate_of(one(ended=False, alive=True, age_s=0), 0).action == "keep"
    assert fate_of(one(referenced_by="/r", age_s=0), 0).action == "keep"
    assert fate_of(one(age_s=0), 0).action == "drop-tree", "a record stays 30 days whatever --older-than says"


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 7 * DAY), ("12h", 43200), ("30m", 1800), ("0", 0), ("2w", 14 * DAY)]
)
def test_ages(text: str, seconds: float) -> None:
    assert stages.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["7", "3x", "-1d", "", "d"])
def test_a_wrong_age_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        stages.parse_age(text)


def stage(root: Path, token: str, *, rc: str | None = "0\n", out: str = "", age_s: float = 10 * DAY) -> Path:
    path = root / token
    (path / "tree" / "code").mkdir(parents=True)
    (path / "tree" / "code" / "train.py").write_text("print(1)\n")
    (path / "claim").mkdir()
    (path / "out").write_text(out)
    if rc is not None:
        (path / "rc").write_text(rc)
        os.utime(path / "rc", (time.time() - age_s,) * 2)
    os.utime(path, (time.time() - age_s,) * 2)
    return path


def test_prune_on_real_folders_keeps_a_referenced_run_and_never_follows_links(tmp_path: Path) -> None:
    home = tmp_path / "home"
    root = home / stages.STAGES_DIR
    old = stage(root, "a" * 24)
    ancient = stage(root, "b" * 24, age_s=40 * DAY)
    recent = stage(root, "c" * 24, age_s=60)
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job_ids": ["1"]}))  # no code_snapshot: it runs from the tree
    referenced = stage(root, "d" * 24, age_s=40 * DAY, out=f"submitted job 1\n  run dir: {run_dir}\n")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    (old / "tree" / "code" / "escape").symlink_to(precious)  # a link inside: the link goes, never its target
    (root / ("e" * 24)).symlink_to(precious)  # a stage that is a link: left alone
    (root / "notes").mkdir()  # not a name hpctrain makes
    fifo_stage = stage(root, "f" * 24)
    (fifo_stage / "out").unlink()
    os.mkfifo(fifo_stage / "out")  # read without blocking: a fifo is never opened through

    dry = stages.prune(7 * DAY, dry_run=True, home=home)
    assert {d.stage.path.name[0]: d.action for d in dry.decisions} == {
        "a": "drop-tree", "b": "drop", "c": "keep", "d": "keep", "f": "drop-tree"
    }  # fmt: skip
    assert (old / "tree").is_dir() and ancient.is_dir(), "a dry run removes nothing"
    assert any("not a folder hpctrain made" in s for s in dry.skipped)
    assert any("a link" in s for s in dry.skipped)

    done = stages.prune(7 * DAY, home=home)
    assert not done.failed
    assert not (old / "tree").exists() and (old / "rc").read_text() == "0\n" and (old / "claim").is_dir()
    assert not ancient.exists() and (recent / "tree").is_dir() and (referenced / "tree").is_dir()
    assert (precious / "keep.txt").read_text() == "mine" and (root / ("e" * 24)).is_symlink()
    assert (root / "notes").is_dir()


@pytest.mark.parametrize("answer", ["printed", "json", "study"])
def test_a_no_snapshot_run_keeps_its_stage_however_the_submit_answered(tmp_path: Path, answer: str) -> None:
    home = tmp_path / "home"
    study = tmp_path / "runs" / "st"
    run_dir = study / "nodes-1"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job_ids": ["1"]}))
    out = {
        "printed": f"submitted job 1\n  run dir: {run_dir}\n",
        "json": json.dumps({"job_id": "1", "run_dir": str(run_dir)}) + "\n",
        "study": f"submitted study st: 1 jobs\n  study dir: {study}\n",
    }[answer]
    kept = stage(home / stages.STAGES_DIR, "a" * 24, age_s=40 * DAY, out=out)
    [decision] = stages.prune(7 * DAY, home=home).decisions
    assert decision.action == "keep" and str(run_dir) in decision.why and (kept / "tree").is_dir()
    (run_dir / "run.json").write_text(json.dumps({"code_snapshot": {"files": 1}}))  # its own copy: not needed
    assert stages.prune(7 * DAY, home=home).decisions[0].action == "drop"


def test_another_users_stage_is_left_alone(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    home = tmp_path / "home"
    theirs = stage(home / stages.STAGES_DIR, "a" * 24, age_s=40 * DAY)
    os.chown(theirs, 12345, 12345)
    done = stages.prune(0, home=home)
    assert theirs.is_dir() and not done.decisions and "another user's" in done.skipped[0]


def test_the_verb_dry_run_and_a_wrong_age(tmp_path: Path, env: dict) -> None:
    stage(Path(env["HOME"]) / stages.STAGES_DIR, "a" * 24)
    dry = hpctrain("remote", "prune", "--dry-run", env=env)
    assert dry.returncode == 0 and "would drop its tree" in dry.stdout and "would free 1" in dry.stdout, dry.stdout
    assert (Path(env["HOME"]) / stages.STAGES_DIR / ("a" * 24) / "tree").is_dir()
    wrong = hpctrain("remote", "prune", "--older-than", "soon", env=env)
    assert wrong.returncode == 2 and "--older-than" in wrong.stderr and "Traceback" not in wrong.stderr

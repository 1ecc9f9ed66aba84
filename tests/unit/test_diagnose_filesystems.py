"""``doctor``'s file-rate measurement: bounded on a generated tree, a fake clock for the time box,
the verdict with given numbers, the probe's report and the login-node row."""

from __future__ import annotations

import json
import os
import random
import threading
from pathlib import Path

import pytest

from hpctrain.diagnose import filesystems, path_checks
from hpctrain.diagnose.filesystems import FIRST_BLOCK, FileRate, measure_file_rate
from hpctrain.diagnose.probe import Measure, probe_command, report
from hpctrain.jobspec.load import load_job

MOUNTS = "overlay / overlay rw 0 0\nserver:/data /data nfs4 rw 0 0\n"


pytestmark = pytest.mark.usefixtures("isolated")


def make_tree(split: Path, classes: int, per_class: int, size: int = 100) -> int:
    """``classes`` folders of ``per_class`` files; returns the bytes a first-block read sees per file."""
    for c in range(classes):
        folder = split / f"c{c:03d}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            (folder / f"{i:04d}.jpg").write_bytes(b"x" * size)
    return min(size, FIRST_BLOCK)


def hostile_entries(split: Path) -> None:
    """What a tree may hold besides images: none of it is measured, none of it hangs or recurses."""
    (split / "loop").symlink_to(split)  # a class folder that is the split itself
    (split / "c000" / "self").symlink_to(split / "c000" / "self")  # a file link that loops
    (split / "c000" / "dangling.jpg").symlink_to(split / "nowhere")
    os.mkfifo(split / "c000" / "pipe.jpg")  # opening it for reading would block
    (split / "c000" / "nested").mkdir()


def test_every_regular_file_of_a_small_tree_is_measured_once(tmp_path: Path) -> None:
    split = tmp_path / "train"
    block = make_tree(split, classes=6, per_class=7, size=100_000)
    hostile_entries(split)
    rate = measure_file_rate(split, max_files=1000, max_s=60, threads=3, mounts_text=MOUNTS)
    assert rate.stats + rate.opens == 42 and rate.stopped_by == "tree"
    assert rate.bytes_read == rate.opens * block  # the first block, not the whole file
    assert rate.classes == 7 and rate.files_estimate >= 42  # "loop" counts as a (file-less) class folder
    assert rate.fstype == "overlay" and rate.threads == 3
    assert rate.stats_per_s > 0 and rate.opens_per_s > 0
    assert 0 < rate.samples_per_s < min(rate.stats_per_s, rate.opens_per_s)
    assert rate.open_ms[0] <= rate.open_ms[1]


def test_files_and_folders_listed_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = tmp_path / "train"
    make_tree(split, classes=12, per_class=30)
    monkeypatch.setattr(filesystems, "SAMPLE_CLASS_FOLDERS", 4)
    monkeypatch.setattr(filesystems, "ENTRIES_PER_FOLDER", 10)
    listed: list[str] = []
    real_scandir = os.scandir

    def spy(path: str | Path = ".") -> object:
        listed.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(filesystems.os, "scandir", spy)
    rate = measure_file_rate(split, max_files=20, max_s=60, threads=2, rng=random.Random(1))
    assert rate.stats + rate.opens == 20 and rate.stopped_by == "files"
    assert len(listed) == 1 + 4  # the split, then 4 class folders of the 12
    assert rate.files_estimate == 12 * 10  # 10 names read per folder at most: a lower bound


def test_random_samples_differ_between_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = tmp_path / "train"
    make_tree(split, classes=10, per_class=20)
    touched: list[set[str]] = []
    real_stat = os.stat
    for seed in (1, 2):
        seen: set[str] = set()

        def spy(path: str, *args: object, _seen: set[str] = seen, **kwargs: object) -> os.stat_result:
            _seen.add(str(path))
            return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(filesystems.os, "stat", spy)
        measure_file_rate(split, max_files=20, max_s=60, threads=1, rng=random.Random(seed))
        touched.append(seen)
    assert touched[0] != touched[1]


def test_the_time_box_stops_both_phases(tmp_path: Path) -> None:
    split = tmp_path / "train"
    make_tree(split, classes=4, per_class=50)
    ticks, lock = [0.0], threading.Lock()

    def clock() -> float:  # one second per reading: a phase of max_s / 2 = 5 s fits a handful of files
        with lock:
            ticks[0] += 1.0
            return ticks[0]

    rate = measure_file_rate(split, max_files=200, max_s=10, threads=1, clock=clock)
    assert rate.stopped_by == "time"
    assert 0 < rate.stats <= 5 and 0 < rate.opens <= 5
    assert rate.stat_s <= 200 and rate.open_s <= 200  # the untouched files cost one clock reading each


def test_an_unlistable_split_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        measure_file_rate(tmp_path / "missing")


def rate_of(samples_per_s: float, **changes: object) -> FileRate:
    """A FileRate whose stats/s and opens/s are each twice ``samples_per_s`` (one stat + one open each)."""
    per_phase_s = 1000 / (2 * samples_per_s)
    fields: dict = dict(path="/data/train", fstype="nfs4", threads=8, stats=1000, stat_s=per_phase_s, opens=1000,
                        open_s=per_phase_s, bytes_read=1000 * 65536, stat_ms=(0.5, 4.0), open_ms=(1.0, 9.0),
                        classes=1000, files_estimate=1_281_167, stopped_by="files")  # fmt: skip
    return FileRate(**{**fields, **changes})


def test_a_report_survives_json_and_a_hostile_one_is_refused() -> None:
    rate = rate_of(3000.0)
    back = FileRate.from_json(json.loads(json.dumps(rate.as_json())))
    assert back is not None and back.samples_per_s == pytest.approx(3000.0, rel=1e-3)
    assert back.stats_per_s == pytest.approx(6000.0, rel=1e-3) and back.mb_per_s > 0
    for hostile in ("text", None, [], {"path": "/x"}, {**rate.as_json(), "stats": "many"}):
        assert FileRate.from_json(hostile) is None


@pytest.mark.parametrize(
    ("served", "asked", "level"),
    [(1000, None, "ok"), (1000, 1000, "ok"), (1000, 900, "ok"), (1000, 3999, "warning"), (1000, 4001, "error")],
)
def test_verdict_by_numbers(served: float, asked: float | None, level: str) -> None:
    assert path_checks.file_rate_level(served, asked) == level


def hal_job(tmp_path: Path, *sets: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\ncluster: hal\noutput_dir: {tmp_path / 'runs'}\ndata: {{root: /data/imagenet}}\n")
    return load_job(path, ["resources.nodes=4", *sets])


def test_the_row_compares_the_tree_with_the_jobs_demand(tmp_path: Path) -> None:
    job = hal_job(tmp_path)
    asked, how = path_checks.node_demand(job)
    assert asked is not None and "x 4 GPUs" in how and "v100" in how  # 4 V100s per node, from the profile's GRES
    fast = path_checks.check_file_rate(job, rate_of(asked * 1.5), "from n1")
    assert fast.level == "ok" and fast.name == "data.root rate" and "from n1" in fast.detail
    assert "an estimate" in fast.detail and "4 node(s)" in fast.detail
    assert fast.numbers and fast.numbers["job_demand_img_s"] == pytest.approx(asked * 4, rel=1e-3)
    slow = path_checks.check_file_rate(job, rate_of(asked / 2), "from n1")
    assert slow.level == "warning" and "hpctrain pack /data/imagenet" in slow.fix and "docs/data.md" in slow.fix
    assert path_checks.check_file_rate(job, rate_of(asked / 10), "from n1").level == "error"


def test_staging_is_weighed_by_the_trees_file_count(tmp_path: Path) -> None:
    staged = path_checks.check_file_rate(hal_job(tmp_path, "data.stage=node"), rate_of(1000.0), "from n1")
    assert staged.level == "warning" and "1,281,167 training files once per node" in staged.detail  # ~21 min
    assert staged.numbers and staged.numbers["stage_minutes"] == pytest.approx(21.4, abs=0.1)
    quick = path_checks.check_file_rate(hal_job(tmp_path, "data.stage=node"), rate_of(100_000.0), "from n1")
    assert quick.level == "ok"


def test_demand_unknown_still_reports_the_rate(tmp_path: Path) -> None:
    cpu = hal_job(tmp_path, "resources.gpus_per_node=0", "distributed.backend=gloo")
    check = path_checks.check_file_rate(cpu, rate_of(10.0), "on this machine")
    assert check.level == "ok" and "demand unknown" in check.detail and "on this machine" in check.detail


def test_a_probe_that_could_not_measure_is_a_warning(tmp_path: Path) -> None:
    job = hal_job(tmp_path)
    assert path_checks.file_rate_checks(job, None, "from n1") == []
    (said,) = path_checks.file_rate_checks(job, {"error": "cannot list /data/train: Permission denied"}, "from n1")
    assert said.level == "warning" and "Permission denied" in said.detail
    (garbled,) = path_checks.file_rate_checks(job, ["not", "a", "report"], "from n1")
    assert garbled.level == "warning" and "unreadable" in garbled.detail


def test_the_probe_measures_on_the_node(tmp_path: Path) -> None:
    make_tree(tmp_path / "data" / "train", classes=3, per_class=4)
    measure = Measure(str(tmp_path / "data" / "train"), max_files=100, max_s=5, threads=2)
    found = report(str(tmp_path / "data"), str(tmp_path), measure)
    rate = FileRate.from_json(json.loads(json.dumps(found["file_rate"])))
    assert rate is not None and rate.stats + rate.opens == 12
    missing = report(str(tmp_path / "data"), str(tmp_path), Measure(str(tmp_path / "data" / "val")))
    assert "cannot list" in missing["file_rate"]["error"]
    line = probe_command("/py", "/d", "/o", Measure("/data/it's/train", 50, 3.0, 4))
    assert "--measure '/data/it'\"'\"'s/train' --measure-files 50 --measure-seconds 3.0 --measure-threads 4" in line


def test_doctor_measures_here_for_a_local_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hpctrain.cli.main import main

    for split in ("train", "val"):
        make_tree(tmp_path / "data" / split, classes=3, per_class=10)
    spec = tmp_path / "local.yaml"
    spec.write_text(f"name: j\ncluster: local\noutput_dir: {tmp_path / 'runs'}\ndata: {{root: {tmp_path / 'data'}}}\n")
    assert main(["doctor", str(spec), "--json", "--measure-files", "10", "--measure-seconds", "5"]) == 0
    row = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "data.root rate")
    assert row["level"] == "ok" and row["detail"].startswith("on this machine")
    assert row["numbers"]["stats"] + row["numbers"]["opens"] == 10 and row["numbers"]["stopped_by"] == "files"
    with pytest.raises(SystemExit) as refused:
        main(["doctor", str(spec), "--measure-files", "9"])
    assert refused.value.code == 2 and "from 10 to 100,000" in capsys.readouterr().err


def test_a_looping_link_in_the_tree_is_skipped_by_every_sampler(tmp_path: Path) -> None:
    """A link that points at itself makes DirEntry.is_file() raise ELOOP: skipped, not an error."""
    from hpctrain.diagnose.data_bench import image_files

    for split in ("train", "val"):
        make_tree(tmp_path / split, classes=2, per_class=3)
        (tmp_path / split / "aaa").symlink_to(tmp_path / split / "aaa")
        (tmp_path / split / "c000" / "0.jpg").symlink_to(tmp_path / split / "c000" / "0.jpg")
    assert path_checks.check_image_folder(tmp_path, "train", "val").level == "ok"
    assert len(list(image_files(tmp_path / "train", 100))) == 6

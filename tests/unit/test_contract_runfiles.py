"""Hostile run directories: what ``status``, ``report``, ``logs`` and ``cancel`` do with crafted files.

Each command runs as its own process under RLIMIT_AS (1 GiB) with a generous
timeout, so a file read whole or a FIFO that blocks fails the test instead of
taking the machine down or hanging it. The assertions are on behaviour: exit
code, a one-line message, no traceback, the output the user wanted.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import hpctrain, isolated_env

from hpctrain.contract.heartbeat_files import Heartbeat, find_stragglers, straggler_medians
from hpctrain.contract.rundir import (
    checkpoints_dir,
    heartbeat_path,
    metrics_path,
    read_json_object,
    run_info_path,
    spec_path,
    study_file,
    submitit_dir,
    summary_path,
    write_run_info,
)
from hpctrain.contract.runfiles import (
    RunFileError,
    for_rich,
    iter_lines,
    json_safe,
    load_json,
    printable,
    read_bounded,
    tail_lines,
)
from hpctrain.contract.summary import read_summary
from hpctrain.observe.live_status import MetricsTail

REPO = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 1 << 30
HANG_GUARD_S = 120


def cli(*args: str, home: Path, limit: int = MEMORY_LIMIT) -> subprocess.CompletedProcess[str]:
    """``hpctrain ARGS`` in a process that may use at most ``limit`` bytes of address space."""
    return hpctrain(*args, env={**isolated_env(home, state=home), "COLUMNS": "200"}, limit=limit, timeout=HANG_GUARD_S)


def make_run(root: Path, name: str = "run", **info: object) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    write_run_info(run_dir, {"name": "hostile", "job_id": "4242", "backend": "local", "world_size": 2, **info})
    return run_dir


def write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr


# ------------------------------------------------------------------ the reader


def test_open_regular_refuses_a_fifo_and_a_device_without_blocking(tmp_path: Path) -> None:
    fifo = summary_path(tmp_path)
    os.mkfifo(fifo)
    zero = metrics_path(tmp_path)
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        with pytest.raises(RunFileError, match="not a regular file"):
            read_bounded(path)
        with pytest.raises(RunFileError):
            list(iter_lines(path))
    assert read_json_object(fifo) is None and read_summary(tmp_path) is None


def test_a_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text('{"status": "running"}')
    summary_path(tmp_path).symlink_to(tmp_path / "real.json")
    assert read_summary(tmp_path).status == "running"


def test_reads_are_bounded(tmp_path: Path) -> None:
    big = run_info_path(tmp_path)
    with big.open("wb") as handle:
        handle.truncate(100 << 20)
    with pytest.raises(RunFileError, match="larger than"):
        read_bounded(big, 1 << 20)
    lines = tmp_path / "lines"
    lines.write_bytes(b"a" * 5000 + b"\nshort\nlast")
    assert list(iter_lines(lines, max_line_bytes=100)) == [b"a" * 100 + b"\n", b"short\n", b"last"]


def test_tail_lines_reads_from_the_end(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"".join(b"line %d\n" % n for n in range(100_000)))
    data, size = tail_lines(log, 2)
    assert data == b"line 99998\nline 99999\n" and size == log.stat().st_size
    log.write_bytes(b"one\ntwo")
    assert tail_lines(log, 5)[0] == b"one\ntwo"
    assert tail_lines(log, 1)[0] == b"two"


def test_implausible_numbers_become_none_and_json_output_stays_valid() -> None:
    decoded = load_json('{"a": NaN, "b": Infinity, "c": 1e308, "d": ' + "9" * 400 + ', "e": 12, "f": 0.5}')
    assert decoded == {"a": None, "b": None, "c": None, "d": None, "e": 12, "f": 0.5}
    out = json.dumps(json_safe({"x": [float("nan"), 1e300, 10**400, 3]}), allow_nan=False)
    assert json.loads(out) == {"x": [None, None, None, 3]}


def test_printable_and_for_rich_make_file_text_inert() -> None:
    assert printable("n1\x1b[31m\nforged") == "n1\\x1b[31m\\x0aforged"
    assert for_rich("out/[/]") == "out/\\[/]"


# ------------------------------------------------------------------ item 7: files of any type


def dead_pid() -> int:
    """The PID of a process that has just ended (a fixed number may name a live process on the machine)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_status_and_report_of_a_run_whose_files_are_dev_zero_and_fifos(tmp_path: Path) -> None:
    pid = dead_pid()
    run_dir = make_run(tmp_path, job_id=str(pid))
    summary_path(run_dir).symlink_to("/dev/zero")
    metrics_path(run_dir).symlink_to("/dev/zero")
    beat = heartbeat_path(run_dir, 0)
    beat.parent.mkdir()
    os.mkfifo(beat)
    os.mkfifo(heartbeat_path(run_dir, 1))
    status = cli("status", str(run_dir), "--ranks", home=tmp_path)
    no_traceback(status)
    assert status.returncode == 0 and "run_dir" in status.stdout
    watch = subprocess.Popen(  # a local run without a readable summary, whose process is gone: failed
        [sys.executable, "-m", "hpctrain", "status", str(run_dir), "--watch", "--interval", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT)),
    )
    out, err = watch.communicate(timeout=HANG_GUARD_S)
    assert watch.returncode == 1 and f"job {pid} local, process gone" in out and "Traceback" not in err, (out, err)
    report = cli("report", str(run_dir), "--out", str(tmp_path / "r"), home=tmp_path)
    no_traceback(report)
    assert report.returncode == 2 and "nothing to report" in report.stderr
    assert "not a regular file" in report.stderr


def test_run_json_that_is_a_fifo_is_a_one_line_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_info_path(run_dir))
    result = cli("status", str(run_dir), home=tmp_path)
    no_traceback(result)
    assert result.returncode == 2 and "a FIFO, not a regular file" in result.stderr


def test_metrics_tail_skips_a_fifo_and_a_device(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    for name in ("fifo", "zero"):
        tail = MetricsTail(tmp_path / name)
        tail.read()
        assert not tail.steps


def test_report_output_files_that_are_devices_are_not_read_or_overwritten(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_json(summary_path(run_dir), {"status": "completed"})
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").symlink_to("/dev/zero")
    result = cli("report", str(run_dir), "--out", str(out), home=tmp_path)
    no_traceback(result)
    assert result.returncode == 2 and "not written by 'hpctrain report'" in result.stderr


# ------------------------------------------------------------------ item 8: logs


def test_logs_n_2_of_a_huge_log_reads_only_its_end(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    log = submitit_dir(run_dir) / "4242_0_log.out"
    log.parent.mkdir()
    with log.open("wb") as handle:  # 1.5 GB, sparse: nothing is written but the end
        handle.seek(1500 << 20)
        handle.write(b"first\nsecond\nthird\n")
    result = cli("logs", str(run_dir), "-n", "2", home=tmp_path, limit=512 << 20)
    no_traceback(result)
    assert result.returncode == 0 and result.stdout == "second\nthird\n"


def test_logs_do_not_follow_a_submitit_dir_outside_the_run(tmp_path: Path) -> None:
    other = make_run(tmp_path, "other")
    submitit_dir(other).mkdir()
    (submitit_dir(other) / "4242_0_log.out").write_text("another run's secret\n")
    run_dir = make_run(tmp_path, "copy", submitit_dir=str(submitit_dir(other)))
    submitit_dir(run_dir).mkdir()
    (submitit_dir(run_dir) / "4242_0_log.out").write_text("this run's line\n")
    result = cli("logs", str(run_dir), home=tmp_path)
    no_traceback(result)
    assert result.stdout == "this run's line\n" and "outside this run directory" in result.stderr
    assert submitit_dir(run_dir, {"submitit_dir": "submitit"}) == submitit_dir(run_dir)  # relative: inside
    assert submitit_dir(run_dir, {"submitit_dir": "../other/submitit"}) == submitit_dir(run_dir)
    trial = run_dir / "trial-000"
    assert submitit_dir(trial, {"submitit_dir": str(submitit_dir(run_dir))}) == submitit_dir(run_dir)


def test_a_job_id_that_is_a_path_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret_0_log.out"
    secret.write_text("not this run's\n")
    run_dir = make_run(tmp_path, job_id="../../secret")
    submitit_dir(run_dir).mkdir()
    result = cli("logs", str(run_dir), home=tmp_path)
    no_traceback(result)
    assert result.returncode == 2 and "is not a job id" in result.stderr and "not this run" not in result.stdout


def test_logs_follow_a_running_local_run_until_its_summary_is_final(tmp_path: Path) -> None:
    controller = subprocess.Popen(["sleep", "300"])
    try:
        run_dir = make_run(tmp_path, job_id=str(controller.pid))
        write_json(summary_path(run_dir), {"status": "running"})
        log = submitit_dir(run_dir) / f"{controller.pid}_0_log.out"
        log.parent.mkdir()
        log.write_text("start\n")
        env = {"PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
        follow = subprocess.Popen(
            [sys.executable, "-m", "hpctrain", "logs", str(run_dir), "-f"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and follow.poll() is None:
                time.sleep(0.1)
            assert follow.poll() is None, "logs -f returned while the run was still going"
            with log.open("a") as handle:
                handle.write("later\n")
            write_json(summary_path(run_dir), {"status": "completed"})
            out, err = follow.communicate(timeout=HANG_GUARD_S)
        finally:
            if follow.poll() is None:
                follow.kill()
        assert follow.returncode == 0 and out == "start\nlater\n", err
    finally:
        controller.kill()
        controller.wait()


# ------------------------------------------------------------------ item 9: markup and escapes


def test_status_lists_runs_whose_paths_hold_rich_markup(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "out[/]" / "x[bold]", "1")
    registry = tmp_path / "hpctrain" / "jobs.jsonl"
    registry.parent.mkdir()
    registry.write_text(json.dumps({"job_id": "4242", "run_dir": str(run_dir), "time": time.time()}) + "\n")
    result = cli("status", home=tmp_path)
    no_traceback(result)
    assert result.returncode == 0 and "out[/]" in result.stdout.replace("\n", "")


def test_heartbeat_node_and_phase_with_markup_and_escapes_print_inert(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_json(summary_path(run_dir), {"status": "completed", "stop_reason": "done\x1b[2J"})
    write_json(heartbeat_path(run_dir, 0), {"rank": 0, "node": "n1\x1b[31m[/]", "phase": "[bold]x", "time": 1.0})
    write_json(heartbeat_path(run_dir, 1), {"rank": 1, "node": "n2[red]", "phase": "done", "time": 1.0})
    for args in (("status", str(run_dir), "--ranks"), ("status", str(run_dir), "--watch")):
        result = cli(*args, home=tmp_path)
        no_traceback(result)
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout and "\\x1b[31m" in result.stdout.replace("\n", "")
        assert "[bold]x" in result.stdout


# ------------------------------------------------------------------ item 10: numbers


def test_non_finite_and_huge_times_in_registry_and_run_json(tmp_path: Path) -> None:
    runs = [make_run(tmp_path / "out" / "job", str(n), submitted_at=1e308) for n in range(3)]
    lines = [
        '{"job_id": "1", "run_dir": "RUN", "time": NaN}'.replace("RUN", str(runs[0])),
        '{"job_id": "2", "run_dir": "RUN", "time": 1e308}'.replace("RUN", str(runs[1])),
        '{"job_id": "3", "run_dir": "RUN", "time": HUGE}'.replace("RUN", str(runs[2])).replace("HUGE", "9" * 400),
    ]
    (tmp_path / "hpctrain").mkdir()
    (tmp_path / "hpctrain" / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    for args in (("status",), ("status", "--json"), ("status", "--output-dir", str(tmp_path / "out"))):
        result = cli(*args, home=tmp_path)
        no_traceback(result)
        assert result.returncode == 0, result.stderr
    assert all(row["submitted"] == "?" for row in json.loads(cli("status", "--json", home=tmp_path).stdout))


def test_status_json_is_valid_json_whatever_the_summary_holds(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    summary_path(run_dir).write_text(
        '{"status": "running", "val_top1": NaN, "best_val_top1": 1e308, "global_step": %s, "wall_s": Infinity}'
        % ("9" * 400)
    )
    result = cli("status", str(run_dir), "--json", home=tmp_path)
    no_traceback(result)

    def refuse(name: str) -> None:
        raise AssertionError(f"bare {name} in --json output")

    shown = json.loads(result.stdout, parse_constant=refuse)
    assert shown["val_top1"] is None and shown["best_val_top1"] is None and shown["global_step"] is None


def test_report_with_huge_integers_and_absurd_values(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    huge = "9" * 400
    summary = '{"status": "completed", "best_val_top1": 1e308, "restarts": HUGE}'
    summary_path(run_dir).write_text(summary.replace("HUGE", huge))
    spec_path(run_dir).write_text(f"resources: {{nodes: {huge}, gpus_per_node: 4}}\ntrainer: {{desired_acc: 1e308}}\n")
    records = [
        {"kind": "train_step", "epoch": 0, "step": n, "global_step": n, "images_per_s": 100.0, "time": 1000.0 + n}
        for n in range(1, 6)
    ]
    text = "\n".join(json.dumps(r) for r in records)
    text += '\n{"kind": "val", "epoch": 0, "top1": 1e308, "time": 1010.0}'
    text += '\n{"kind": "train_step", "global_step": HUGE, "images_per_s": 1.0, "time": 1011.0}\n'.replace("HUGE", huge)
    metrics_path(run_dir).write_text(text)
    result = cli("report", str(run_dir), "--out", str(tmp_path / "r"), "--json", home=tmp_path)
    no_traceback(result)
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)["table"][0]
    assert row["best_top1"] is None and row["nodes"] is None and row["images_per_s"] == 100.0


# ------------------------------------------------------------------ item 11: study.json


def write_study(study_dir: Path, points: list[dict]) -> None:
    write_json(study_file(study_dir), {"kind": "study", "version": 1, "name": "s", "points": points})


@pytest.mark.parametrize("run_dir", ["../../etc", "/", "/etc", "..", ".", "a/../../b", ""])
def test_study_points_outside_the_study_are_refused_by_status_report_and_cancel(tmp_path: Path, run_dir: str) -> None:
    study = tmp_path / "out" / "s" / "study"
    write_study(study, [{"label": "ok", "run_dir": "ok", "job_id": "1"}, {"label": "x", "run_dir": run_dir}])
    for args in (("status", str(study)), ("report", str(study)), ("cancel", str(study))):
        result = cli(*args, home=tmp_path)
        no_traceback(result)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert (
            "study.json: point 2" in result.stderr and "not followed" in result.stderr or "no run_dir" in result.stderr
        )


def test_a_point_that_links_out_of_the_study_is_refused(tmp_path: Path) -> None:
    study = tmp_path / "study"
    study.mkdir()
    (study / "ok").symlink_to("/etc")
    write_study(study, [{"label": "ok", "run_dir": "ok", "job_id": "1"}])
    result = cli("status", str(study), home=tmp_path)
    assert result.returncode == 2 and "not followed" in result.stderr


def test_a_study_of_a_million_points_is_refused_quickly(tmp_path: Path) -> None:
    study = tmp_path / "big"
    write_study(study, [{"label": f"p{n}", "run_dir": f"p{n}"} for n in range(1_000_000)])
    result = cli("report", str(study), home=tmp_path)
    no_traceback(result)
    assert result.returncode == 2 and "larger than" in result.stderr
    write_study(study, [{"label": f"p{n}", "run_dir": f"p{n}"} for n in range(300)])
    result = cli("status", str(study), home=tmp_path)
    assert result.returncode == 2 and "300 points, but a study has at most 256" in result.stderr


# ------------------------------------------------------------------ item 12: cost


def test_straggler_detection_matches_the_definition_and_scales() -> None:
    rng = random.Random(7)
    for count in (2, 3, 4, 5, 10, 31):
        beats = [Heartbeat(rank=r, step_time_median_s=rng.choice([1.0, 1.0, 1.1, 2.0, 5.0])) for r in range(count)]
        naive = [
            b.rank
            for b in beats
            if (others := statistics.median(o.step_time_median_s for o in beats if o is not b)) > 0
            and b.step_time_median_s > 1.3 * others
        ]
        assert [b.rank for b in find_stragglers(beats)] == naive
    many = [Heartbeat(rank=r, step_time_median_s=2.0 if r == 77 else 1.0) for r in range(16_384)]
    assert [(b.rank, typical) for b, typical in straggler_medians(many)] == [(77, 1.0)]


# ------------------------------------------------------------------ item 13: report.md


def test_report_md_escapes_labels_statuses_and_host_names(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "a|b<script>x", "*run*")
    write_json(summary_path(run_dir), {"status": "completed", "val_top1": 50.0})
    records = [
        {"kind": "train_step", "epoch": 0, "step": n, "global_step": n, "images_per_s": 10.0, "time": 100.0 + n}
        for n in range(1, 4)
    ]
    metrics_path(run_dir).write_text("".join(json.dumps(r) + "\n" for r in records))
    for rank, seconds in enumerate((1.0, 1.0, 9.0)):
        write_json(
            heartbeat_path(run_dir, rank), {"rank": rank, "node": "<b>[n](http://x)", "step_time_median_s": seconds}
        )
    result = cli("report", str(run_dir), "--out", str(tmp_path / "r"), home=tmp_path)
    assert result.returncode == 0, result.stderr
    md = (tmp_path / "r" / "report.md").read_text()
    assert "<script>" not in md and "<b>" not in md and "[n](" not in md
    assert "\\<b\\>\\[n\\](http://x)" in md  # the host name, as text
    assert "a\\|b\\<script\\>x/\\*run\\*" in md
    table = [line for line in md.splitlines() if line.startswith("| a")]
    assert table and table[0].count(" | ") == 11  # 12 cells: the | in the label is not a column


def test_best_json_cannot_point_out_of_the_checkpoints(tmp_path: Path) -> None:
    from hpctrain.contract.checkpoint_listing import best_checkpoint

    write_json(checkpoints_dir(tmp_path) / "best.json", {"dir": "../../elsewhere/step-00000001"})
    assert best_checkpoint(checkpoints_dir(tmp_path)) is None


def test_report_of_a_run_whose_spec_yaml_is_an_alias_bomb(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_json(summary_path(run_dir), {"status": "completed"})
    levels = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    levels += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 10)]
    spec_path(run_dir).write_text("\n".join(levels) + "\n")
    result = cli("report", str(run_dir), "--out", str(tmp_path / "r"), home=tmp_path)
    no_traceback(result)
    assert result.returncode == 0, result.stderr


def test_absurd_finite_values_are_not_shown_as_measurements(tmp_path: Path) -> None:
    from hpctrain.observe.live_status import build_snapshot, read_run
    from hpctrain.observe.live_view import progress_text

    run_dir = make_run(tmp_path)
    write_json(summary_path(run_dir), {"status": "running", "val_top1": 1e17, "best_val_top1": -5.0})
    records = [
        {"kind": "train_step", "global_step": n, "images_per_s": -3.0, "data_wait_fraction": 1e17, "time": 10.0 + n}
        for n in (1, 2)
    ]
    metrics_path(run_dir).write_text("".join(json.dumps(r) + "\n" for r in records))
    tail = MetricsTail(metrics_path(run_dir))
    snap = build_snapshot(read_run(run_dir, {}, tail), "RUNNING", 20.0, final=False)
    assert snap.val_top1 is None and snap.best_val_top1 is None
    assert snap.images_per_s is None and snap.data_wait_fraction is None
    assert "e+" not in progress_text(snap) and "100000" not in progress_text(snap)


# ------------------------------------------------------------------ one rule: nothing is followed out of the run


def linked_out_run(tmp_path: Path) -> tuple[Path, Path]:
    """A run whose folders and files are symlinks into another user's folder, which holds plausible files."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "submitit").mkdir(parents=True)
    (elsewhere / "submitit" / "4242_0_log.out").write_text("someone else's secret\n")
    (elsewhere / "submitit" / "4242_0_log.err").write_text("srun: error: n9: task 7: Killed\n")
    write_json(elsewhere / "summary.json", {"status": "completed", "global_step": 999})
    write_json(elsewhere / "heartbeats" / "rank-00000.json", {"rank": 0, "node": "evil", "time": time.time()})
    (elsewhere / "metrics.jsonl").write_text(json.dumps({"kind": "train_step", "global_step": 5, "loss": 1.0}) + "\n")
    (elsewhere / "spec.yaml").write_text("name: planted\n")
    run_dir = make_run(tmp_path / "runs")
    for name in ("submitit", "heartbeats", "summary.json", "metrics.jsonl", "spec.yaml"):
        (run_dir / name).symlink_to(elsewhere / name)
    return run_dir, elsewhere


def test_logs_do_not_follow_a_submitit_symlink_out_of_the_run(tmp_path: Path) -> None:
    run_dir, elsewhere = linked_out_run(tmp_path)
    result = cli("logs", str(run_dir), home=tmp_path)
    no_traceback(result)
    assert result.returncode == 2 and "secret" not in result.stdout
    assert f"leads to {elsewhere}/submitit/4242_0_log.out, outside the run directory {run_dir}" in result.stderr
    assert "not followed" in result.stderr


def test_no_reader_follows_a_symlink_out_of_the_run(tmp_path: Path) -> None:
    """status, report, heartbeats, metrics, summary and checkpoints: the same rule, one mechanism."""
    from hpctrain.contract.checkpoint_listing import latest_checkpoint_step
    from hpctrain.contract.heartbeat_files import read_heartbeats

    run_dir, elsewhere = linked_out_run(tmp_path)
    assert read_summary(run_dir) is None and read_heartbeats(run_dir) == []
    tail = MetricsTail(run_dir / "metrics.jsonl", within=run_dir)
    tail.read()
    assert not tail.steps
    with pytest.raises(RunFileError, match="outside the run directory"):
        list(iter_lines(run_dir / "metrics.jsonl", within=run_dir))
    status = cli("status", str(run_dir), "--json", home=tmp_path)
    no_traceback(status)
    assert "999" not in status.stdout and "n9" not in status.stdout and "evil" not in status.stdout
    report = cli("report", str(run_dir), "--out", str(tmp_path / "report"), home=tmp_path)
    no_traceback(report)
    assert report.returncode == 2 and "nothing to report" in report.stderr
    assert "metrics.jsonl not read" in report.stderr and "not followed" in report.stderr
    # a checkpoint reached through a symlink out of the run is not the run's
    step = elsewhere / "checkpoints" / "step-00000005"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"x" * 10)
    write_json(step / "meta.json", {"format_version": 1, "global_step": 5, "files": {"state.pt": {"size": 10}}})
    (run_dir / "checkpoints").symlink_to(elsewhere / "checkpoints")
    assert latest_checkpoint_step(run_dir) is None
    (run_dir / "checkpoints").unlink()
    (run_dir / "checkpoints" / "step-00000005").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-00000005" / "meta.json").symlink_to(step / "meta.json")
    (run_dir / "checkpoints" / "step-00000005" / "state.pt").write_bytes(b"x" * 10)
    assert latest_checkpoint_step(run_dir) is None


def test_a_cancel_marker_a_symlink_leads_to_does_not_stop_the_run(tmp_path: Path) -> None:
    from hpctrain.contract.cancel_marker import cancel_marker, marker_applies

    run_dir = make_run(tmp_path / "runs")
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "cancel-requested").write_text('{"job_ids": ["4242"]}')
    (run_dir / ".hpctrain").symlink_to(tmp_path / "planted")
    assert not marker_applies(cancel_marker(run_dir), ["4242"])
    (run_dir / ".hpctrain").unlink()
    (run_dir / ".hpctrain").mkdir()
    (run_dir / ".hpctrain" / "cancel-requested").write_text('{"job_ids": ["4242"]}')
    assert marker_applies(cancel_marker(run_dir), ["4242"])


# ------------------------------------------------------------------ round 4: every JSON reader

BOMB = "[" * 100_000 + "]" * 100_000  # 200 KB of brackets: RecursionError in json.loads
DEEP_OBJECT = '{"status": ' * 5_000 + '"completed"' + "}" * 5_000


def test_load_json_refuses_deep_nesting_before_parsing_and_keeps_ordinary_depth() -> None:
    for text in (BOMB, DEEP_OBJECT, "[" * 100_000, '{"a": "' + "[" * 1000 + '"}'):
        if text.startswith('{"a"'):  # brackets inside a string are not nesting
            assert load_json(text) == {"a": "[" * 1000}
            continue
        with pytest.raises(ValueError, match="nested"):
            load_json(text)
        with pytest.raises(ValueError, match="nested"):
            load_json(text.encode(), raw_numbers=True)
    ordinary = {"node_failures": [{"nodes": ["n1", "n2"], "step": 4}], "spec": {"a": {"b": {"c": [1, [2, [3]]]}}}}
    assert load_json(json.dumps(ordinary)) == ordinary


def test_deeply_nested_files_in_a_run_cost_one_file_each_never_a_traceback(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "out", "deep")
    (run_dir / "summary.json").write_text(DEEP_OBJECT)
    heartbeat_path(run_dir, 0).parent.mkdir()
    heartbeat_path(run_dir, 0).write_text(BOMB)
    write_json(heartbeat_path(run_dir, 1), {"rank": 1, "node": "n-good", "phase": "train", "time": time.time()})
    good = {"kind": "train_step", "epoch": 0, "step": 7, "global_step": 7, "images_per_s": 10.0, "time": 100.0}
    (run_dir / "metrics.jsonl").write_text(BOMB + "\n" + json.dumps(good) + "\n")
    (run_dir / "submitit").mkdir()
    (run_dir / "submitit" / "4242_0_log.out").write_text("a log line\n")
    (tmp_path / "hpctrain").mkdir()
    line = json.dumps({"job_id": "4242", "run_dir": str(run_dir), "time": time.time()})
    (tmp_path / "hpctrain" / "jobs.jsonl").write_text(BOMB + "\n" + line + "\n")
    for args in (
        ("status",),
        ("status", "--json"),
        ("status", str(run_dir), "--ranks"),
        ("status", str(run_dir), "--json"),
        ("logs", str(run_dir)),
        ("report", str(run_dir), "--out", str(tmp_path / "r")),
    ):
        result = cli(*args, home=tmp_path)
        no_traceback(result)
        assert "RecursionError" not in result.stderr + result.stdout, args
        assert result.returncode in (0, 2) and (result.returncode == 0 or "nothing to report" in result.stderr), (
            args,
            result.stderr,
        )
    assert "deep" in cli("status", home=tmp_path).stdout  # the good registry line is still listed
    assert "n-good" in cli("status", str(run_dir), "--ranks", home=tmp_path).stdout
    assert cli("logs", str(run_dir), home=tmp_path).stdout == "a log line\n"


def test_a_deeply_nested_run_json_or_study_json_is_a_one_line_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(BOMB)
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.json").write_text('{"kind": "study", "points": ' + BOMB + "}")
    for args in (
        ("status", str(run_dir)),
        ("status", str(run_dir), "--watch"),
        ("logs", str(run_dir)),
        ("report", str(run_dir)),
        ("status", str(study)),
        ("report", str(study)),
    ):
        result = cli(*args, home=tmp_path)
        no_traceback(result)
        assert result.returncode == 2 and "RecursionError" not in result.stderr, (args, result.stderr)


def test_the_guardian_reads_a_deeply_nested_supervisor_record_as_none(tmp_path: Path) -> None:
    from hpctrain.contract.cancel_marker import marker_applies
    from hpctrain.contract.rundir import supervisor_record_path

    record = supervisor_record_path(tmp_path)
    record.parent.mkdir(parents=True)
    record.write_text(BOMB)
    assert read_json_object(record) is None
    marker = tmp_path / "cancel.json"
    marker.write_text('{"job_ids": ' + BOMB + "}")
    assert marker_applies(marker, ["1"])  # unreadable, but it exists: someone meant to cancel


def test_one_malformed_node_failure_costs_only_itself_in_status_watch_and_report(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, job_id=str(dead_pid()))
    lost = {"node": "n2", "step": 5, "reason": "its slurmd does not answer", "action": "continue"}
    bad = [5, "n7", None, [1], {"node": {"x": 1}, "step": True, "reason": 3}]
    write_json(run_dir / "summary.json", {"status": "completed", "node_failures": [*bad, lost], "excluded_nodes": [3]})
    expected = "n2 at step 5 (its slurmd does not answer): continue"
    status = cli("status", str(run_dir), home=tmp_path)
    report = cli("report", str(run_dir), "--out", str(tmp_path / "r"), home=tmp_path)
    for result in (status, report):
        no_traceback(result)
        assert result.returncode == 0, result.stderr
    assert f"lost_nodes: {expected}" in status.stdout.replace("\n", " ")
    assert expected in (tmp_path / "r" / "report.md").read_text()
    from hpctrain.observe.live_status import build_snapshot, read_run
    from hpctrain.observe.live_view import plain_changes

    watched = build_snapshot(read_run(run_dir, {}, MetricsTail(run_dir / "metrics.jsonl")), "RUNNING", 1.0, final=False)
    assert any(line.endswith(f"lost nodes: {expected}") for line in plain_changes(None, watched))
    summary = read_summary(run_dir)
    assert summary is not None and summary.node_failures is not None and summary.node_failures[-1] == lost


def test_real_path_never_raises_on_a_loop(tmp_path: Path) -> None:
    from hpctrain.contract.runfiles import real_path

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "c").symlink_to(tmp_path / "real")
    assert real_path(tmp_path / "a" / "x").name == "x"
    assert real_path(tmp_path / "c") == tmp_path.resolve() / "real"
    with pytest.raises(RuntimeError):  # what every resolve() of a user's path did (a traceback)
        (tmp_path / "a").resolve()


def test_no_user_path_is_resolved_with_pathlib() -> None:
    """The category of the loop crash: every resolve in hpctrain/ goes through runfiles.real_path
    (``Path(__file__).resolve()`` of hpctrain's own files aside)."""
    import re

    hpctrain_dir = Path(__file__).resolve().parents[2] / "hpctrain"
    offenders = []
    for path in sorted(hpctrain_dir.rglob("*.py")):
        name = path.relative_to(hpctrain_dir).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"\.resolve\(", code) and "__file__" not in code and "``" not in code:
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "use contract.runfiles.real_path:\n" + "\n".join(offenders)

"""``hpctrain report``: the files it writes (PNGs, report.md, self-contained report.html), --json, and bad input."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from PIL import Image
from report_helpers import make_study, simulate_run

from hpctrain.cli.main import main
from hpctrain.contract import rundir
from hpctrain.contract.rundir import metrics_path, run_info_path
from hpctrain.observe.report import plots


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report") / "study"
    make_study(root, {1: 1.0, 2: 0.85, 4: 0.65}, desired_acc=60.0, restart_at=None)
    simulate_run(root / "nodes-2-requeued", nodes=2, restart_at=(1, 10))  # not a point: reported on its own
    return root


@pytest.fixture(scope="module")
def report_dir(study: Path) -> Path:
    assert main(["report", str(study), "--baseline", "hal"]) == 0
    return rundir.report_dir(study)


def test_pngs_decode_and_are_not_blank(report_dir: Path) -> None:
    pngs = sorted(report_dir.glob("*.png"))
    assert [p.name for p in pngs] == ["run-nodes-1.png", "run-nodes-2.png", "run-nodes-4.png", "scaling.png"]
    for png in pngs:
        with Image.open(png) as image:
            image.load()
            assert image.width >= 800 and image.height >= 300
            colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
            assert colours is not None and len(colours) > 50, png.name


def test_html_embeds_every_image_and_loads_nothing_from_outside(report_dir: Path) -> None:
    page = (report_dir / "report.html").read_text()
    sources = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    assert len(sources) == len(list(report_dir.glob("*.png")))
    assert all(src.startswith("data:image/png;base64,") for src in sources)
    assert not re.search(r'(src|href)\s*=\s*"(?!data:)', page)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert "richardkxu/distributed-pytorch" in page  # the baseline's source is cited


def test_markdown_links_the_images_and_has_the_table(report_dir: Path) -> None:
    text = (report_dir / "report.md").read_text()
    for png in report_dir.glob("*.png"):
        assert f"]({png.name})" in text
    assert "| nodes-4 | 4 | 8 GPUs |" in text
    assert "| 64 | 13312 | 33,080.03 |" in text  # HAL at 64 GPUs


@pytest.fixture
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip drawing where a test checks only numbers (drawing is the slow part)."""
    monkeypatch.setattr(plots, "available", lambda: False)


@pytest.mark.usefixtures("no_plots")
def test_json_table_matches_the_runs(study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(study), "--out", str(tmp_path / "r"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    table = {row["label"]: row for row in data["table"]}
    assert table["nodes-1"]["efficiency"] == pytest.approx(1.0)
    assert table["nodes-2"]["efficiency"] == pytest.approx(0.85)
    assert table["nodes-4"]["efficiency"] == pytest.approx(0.65)
    assert table["nodes-4"]["images_per_s"] == pytest.approx(table["nodes-4"]["images_per_s_per_device"] * 8)
    assert {run["label"] for run in data["runs"]} == set(table)


@pytest.mark.usefixtures("no_plots")
def test_requeued_run_reports_its_restart(study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(study / "nodes-2-requeued"), "--out", str(tmp_path), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["restarts"] == 1 and len(run["restart_times"]) == 1


def test_without_matplotlib_the_report_still_has_md_and_html(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(plots, "available", lambda: False)
    assert main(["report", str(study), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.md"]
    assert "pip install 'hpctrain[plots]'" in capsys.readouterr().err
    assert "pip install 'hpctrain\\[plots\\]'" in (tmp_path / "report.md").read_text()  # markdown-escaped


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "hint:" in err
    return err


def test_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in _error(capsys)


def test_directory_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    assert main(["report", str(tmp_path)]) == 2
    assert "not an hpctrain run directory" in _error(capsys)


def test_run_without_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_info_path(tmp_path).write_text(json.dumps({"job_id": "5", "job_ids": ["5"]}))
    assert main(["report", str(tmp_path)]) == 2
    assert "no metrics.jsonl yet" in _error(capsys)
    assert not rundir.report_dir(tmp_path).exists()


def test_damaged_metrics_give_a_partial_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    simulate_run(tmp_path / "run")
    metrics = metrics_path(tmp_path / "run")
    metrics.write_text("garbage\n" + metrics.read_text() + '{"kind": "train_st')
    assert main(["report", str(tmp_path / "run")]) == 0
    assert "skipped 1 unreadable line" in capsys.readouterr().err
    assert "skipped 1 unreadable line" in (rundir.report_dir(tmp_path / "run") / "report.md").read_text()


def test_several_runs_need_out(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(study / "nodes-1"), str(study / "nodes-2")]) == 2
    assert "--out" in _error(capsys)


@pytest.mark.usefixtures("no_plots")
def test_never_overwrites_a_file_it_did_not_write(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "report.md").write_text("my notes\n")
    assert main(["report", str(study / "nodes-1"), "--out", str(tmp_path)]) == 2
    assert "not overwriting" in _error(capsys)
    assert (tmp_path / "report.md").read_text() == "my notes\n"
    (tmp_path / "report.md").unlink()
    assert main(["report", str(study / "nodes-1"), "--out", str(tmp_path)]) == 0
    assert main(["report", str(study / "nodes-1"), "--out", str(tmp_path)]) == 0  # its own files: replaced


def test_a_full_report_never_imports_torch(study: Path, tmp_path: Path) -> None:
    """The login-node rule on the success path too (plots included), not only on the error path."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-X", "importtime", "-m", "hpctrain", "report", str(study / "nodes-1")]
    result = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    imports = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert any("matplotlib" in line for line in imports)
    assert not [line for line in imports if "torch" in line]


def test_a_figure_that_cannot_be_drawn_costs_only_that_figure(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object) -> None:
        raise ValueError("odd data")

    monkeypatch.setattr(plots, "plot_scaling", broken)
    monkeypatch.setattr(plots, "plot_run", broken)
    assert main(["report", str(study), "--out", str(tmp_path)]) == 0
    assert "could not draw the scaling plot: ValueError: odd data" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.png")) and "<img" not in (tmp_path / "report.html").read_text()


def test_an_out_dir_that_cannot_be_written(study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["report", str(study / "nodes-1"), "--out", str(tmp_path / "file" / "sub")]) == 2
    assert "cannot create" in _error(capsys)


def test_a_huge_loss_range_gets_a_log_axis_and_unused_panels_say_so() -> None:
    """The quickstart's first validation loss (291,586) over a training loss of 2 flattened the training curve."""
    plt = plots._pyplot()
    fig, (huge, mild, empty) = plt.subplots(1, 3)
    huge.plot([1, 2, 3], [2.3, 1.9, 1.5])
    huge.plot([1, 2, 3], [291586.0, 40.0, 1.7])
    mild.plot([1, 2, 3], [2.3, 0.9, 0.4])
    assert plots._log_if_huge(huge) and huge.get_yscale() == "log"
    assert not plots._log_if_huge(mild) and mild.get_yscale() == "linear"
    plots._unused(empty, "learning rate")
    assert not empty.axison and "learning rate:\nnot in metrics.jsonl" in [t.get_text() for t in empty.texts]
    plt.close(fig)


def test_the_console_tells_a_huge_validation_loss_once_and_readably(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from hpctrain.trainer.reporting import Reporter, loss_text

    assert (loss_text(291586.1234), loss_text(1.23456)) == ("2.92e+05", "1.2346")
    reporter = Reporter(tmp_path, enabled=True, static={})
    val = {"top1": 10.0, "top5": 50.0, "loss": 291586.0}
    reporter.epoch_end(epoch=0, global_step=19, values={"loss": 2.3, "top1": 10.0, "top5": 50.0})
    reporter.validation(epoch=0, global_step=19, values=val, best_top1=10.0)
    reporter.validation(epoch=0, global_step=19, values=val, best_top1=10.0)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "loss 2.92e+05 best 10.00  (val loss far above the train loss" in text
    assert text.count("far above the train loss") == 1

"""``hpctrain plan`` and ``hpctrain report``'s what-if read the same step_split records with the same model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.step_split import LABELS, PARTS
from hpctrain.jobspec.load import load_job
from hpctrain.observe.report.explain import explain
from hpctrain.observe.report.load import load_targets
from hpctrain.observe.report.table import scaling_table
from hpctrain.planning.plan import COLUMNS, plan, shape_cells
from tests.fake_slurm import FakeSlurm, nowhere
from tests.unit.cli_helpers import in_process

pytestmark = pytest.mark.usefixtures("isolated")

# What a window's ranks measured at 1 node (2 CPU processes) and 2 nodes (4): the same work per rank,
# communication 10 -> 25 ms, the first window of each epoch slow (the loader starting; both leave it out).
ONE_NODE = {"forward": 0.030, "backward": 0.060, "optimizer": 0.004, "data": 0.004, "comm": 0.010, "straggler": 0.002}
TWO_NODES = {**ONE_NODE, "comm": 0.025, "straggler": 0.003}


def spec_file(folder: Path) -> Path:
    spec = folder / "whatif.yaml"
    spec.write_text(
        f"name: whatif\ncluster: slurm\noutput_dir: {folder / 'out'}\n"
        "resources:\n  nodes: 1\n  tasks_per_node: 2\n  time: '02:00:00'\n"
        f"trainer:\n  arch: resnet18\n  epochs: 3\n  batch_size: 16\ndata:\n  root: {folder / 'images'}\n"
    )
    (folder / "images").mkdir(exist_ok=True)
    return spec


def run_at(spec: Path, nodes: int, parts: dict[str, float], *, splits: bool = True) -> Path:
    """A finished run at ``nodes`` whose metrics.jsonl has train_step records and (``splits``) step_split ones."""
    job = load_job(spec, [f"resources.nodes={nodes}"])
    run_dir = spec.parent / "out" / "whatif" / f"20261129-07000{nodes}"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(json.dumps(job.spec.model_dump(mode="json")))
    world = nodes * 2
    summary = {"status": "completed", "num_nodes": nodes, "world_size": world, "device": "cpu"}
    summary |= {"global_batch_size": job.spec.global_batch_size, "steps_per_epoch": 40, "total_steps": 120}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    records: list[dict[str, Any]] = []
    clock = 1_000.0  # the wall clock a run logs its steps at: 10 steps a window, step_s each
    for epoch in range(2):
        for window in range(4):
            step = epoch * 40 + (window + 1) * 10
            jitter = 0.001 * (window % 2)  # windows differ a little; the mean is what both use
            measured = {p: parts.get(p, 0.0) + (jitter if p == "forward" else 0.0) for p in PARTS}
            if window == 0:
                measured["data"] = 0.400
            step_s = sum(measured.values())
            clock += 10 * step_s
            t = clock
            records.append({"kind": "train_step", "epoch": epoch, "step": step % 40, "global_step": step,
                            "step_s": step_s, "time": t})  # fmt: skip
            if splits:
                split = {f"{p}_s": v for p, v in measured.items()}
                records.append({"kind": "step_split", "epoch": epoch, "global_step": step, "ranks": world,
                                "steps": 10, "step_s": step_s, "time": t + 0.5, **split})  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


@pytest.fixture
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeSlurm().install(monkeypatch, which=nowhere)


def test_plan_gives_the_reports_what_if_step_for_the_same_shape(tmp_path: Path, no_slurm: None) -> None:
    spec = spec_file(tmp_path)
    runs = [run_at(spec, 1, ONE_NODE), run_at(spec, 2, TWO_NODES)]
    loaded = load_targets(runs)
    report = explain(loaded, scaling_table(loaded))
    at4, at8 = report.predictions  # 2x and 4x the largest measured scale: 8 and 16 processes
    assert (at4.devices, at8.devices) == (8, 16)
    made = plan(spec, nodes=(1, 2, 4, 8), steps=1000)
    shapes = {shape.nodes: shape for shape in made.shapes}
    for nodes, predicted in ((4, at4), (8, at8)):
        step = shapes[nodes].step_time
        assert step is not None and step.model == "step split" and step.extrapolated
        assert step.seconds == pytest.approx(predicted.step_s, rel=1e-9)
        assert step.dominant == LABELS[predicted.dominant] == "exposed communication"
        assert step.dominant_loss == pytest.approx(predicted.dominant_loss, rel=1e-9)
    # the number itself: the mean of each epoch's windows 2-4 (forward +1, +0, +1 ms), comm 25 ms + 15 ms a doubling
    local = 0.030 + 0.002 / 3 + 0.060 + 0.004 + 0.004 + 0.003
    assert at4.step_s == pytest.approx(local + 0.040) and at8.step_s == pytest.approx(local + 0.055)
    assert at8.dominant_loss == pytest.approx((0.055 - 0.010) / (local + 0.055))
    measured = shapes[2].step_time
    assert measured is not None and measured.model == "measured"
    assert any("the report's what-if model over the step_split records of 2 earlier run(s)" in n for n in made.notes)
    cells = dict(zip(COLUMNS, shape_cells(shapes[8])))
    assert cells["dominates"] == "exposed communication 29 %"
    assert cells["step time"].endswith("(extrap.)") and "step-split model" in cells["source"]


def test_without_step_split_records_plan_falls_back_to_the_fit(tmp_path: Path, no_slurm: None) -> None:
    spec = spec_file(tmp_path)
    run_at(spec, 1, ONE_NODE, splits=False)
    run_at(spec, 2, TWO_NODES, splits=False)
    four = {s.nodes: s for s in plan(spec, nodes=(4,), steps=1000).shapes}[4].step_time
    assert four is not None and four.model == "fit" and "log2(n), fitted to 1, 2 nodes" in four.source
    assert four.dominant is None


def test_json_and_table_say_which_model_and_what_dominates(
    tmp_path: Path, no_slurm: None, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_file(tmp_path)
    run_at(spec, 1, ONE_NODE)
    run_at(spec, 2, TWO_NODES)
    shown = in_process(capsys, "plan", str(spec), "--nodes", "2,8", "--steps", "1000", "--json")
    assert shown.returncode == 0, shown.stderr
    two, eight = json.loads(shown.stdout)["shapes"]
    assert (two["step_model"], eight["step_model"]) == ("measured", "step split")
    assert eight["dominant"] == "exposed communication" and eight["dominant_loss"] == pytest.approx(0.29, abs=0.005)
    table = in_process(capsys, "plan", str(spec), "--nodes", "2,8", "--steps", "1000")
    assert table.returncode == 0, table.stderr
    assert "dominates" in table.stdout and "exposed communication 29 %" in table.stdout

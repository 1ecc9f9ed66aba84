"""RUN/.hpctrain/estimates.json: the estimates a run was given, kept for report and watch to check."""

from __future__ import annotations

from pathlib import Path

from hpctrain.contract.estimates import MAX_ESTIMATES, read_estimates, record_estimate


def test_a_damaged_estimates_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / ".hpctrain").mkdir()
    for text in ("{", "[]", '{"estimates": 3}', '{"estimates": [1, "x"]}'):
        (tmp_path / ".hpctrain" / "estimates.json").write_text(text)
        assert read_estimates(tmp_path) == []
    assert read_estimates(tmp_path / "missing") == []


def test_the_record_keeps_the_first_estimate_and_the_newest(tmp_path: Path) -> None:
    for number in range(MAX_ESTIMATES + 5):
        record_estimate(tmp_path, {"made_at": number})
    kept = [entry["made_at"] for entry in read_estimates(tmp_path)]
    assert len(kept) == MAX_ESTIMATES and kept[0] == 0 and kept[-1] == MAX_ESTIMATES + 4

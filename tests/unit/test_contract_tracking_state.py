"""A run's tracking id and its sync cursors (contract/tracking_state.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.contract.tracking_state import TRACKING_ID, Cursor, read_cursor, tracking_id, write_cursor
from hpctrain.errors import RunDirError


def test_the_id_is_run_jsons_else_one_chosen_once_for_an_older_run(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"tracking_id": "0123456789abcdef"}))
    assert tracking_id(tmp_path) == "0123456789abcdef"
    (tmp_path / "run.json").write_text(json.dumps({"tracking_id": "../../etc"}))  # not an id: not used
    chosen = tracking_id(tmp_path)
    assert TRACKING_ID.match(chosen) and tracking_id(tmp_path) == chosen  # the same at every sync


def test_a_cursor_round_trips_and_a_fresh_one_starts_before_the_first_step(tmp_path: Path) -> None:
    assert read_cursor(tmp_path, "mlflow") == Cursor("mlflow")
    cursor = Cursor("mlflow", run_ref="r1", sent_step=40, sent_bytes=123, events=["restart-1"], tags={"a": "b"})
    write_cursor(tmp_path, cursor)
    assert read_cursor(tmp_path, "mlflow") == cursor
    assert not list((tmp_path / ".hpctrain" / "tracking").glob(".*.tmp"))  # written atomically


@pytest.mark.parametrize("text", ["[]", "{", '{"tracker": "mlflow", "sent_step": "40"}', '{"tracker": "wandb"}'])
def test_a_damaged_cursor_is_an_error_with_the_fix_never_a_silent_resend(tmp_path: Path, text: str) -> None:
    path = tmp_path / ".hpctrain" / "tracking" / "mlflow.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(RunDirError) as caught:
        read_cursor(tmp_path, "mlflow")
    assert "remove it" in caught.value.hint

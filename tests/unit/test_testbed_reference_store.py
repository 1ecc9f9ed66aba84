"""The Slurm tier's store of uninterrupted reference runs (tests/slurm/reference_store.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.slurm import reference_store
from tests.slurm.reference_store import reference_key, stored_weights

SPEC = "jobs/smoke_2x2_cpu.yaml"


def dataset(folder: Path, byte: bytes = b"\xff\xd8jpeg") -> Path:
    for split in ("train", "val"):
        (folder / split / "class_00").mkdir(parents=True)
        (folder / split / "class_00" / "a.jpg").write_bytes(byte)
    return folder


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "store"
    monkeypatch.setenv(reference_store.STORE_ENV, str(folder))
    return folder


def test_the_key_is_what_is_trained_not_where_or_under_which_name(tmp_path: Path) -> None:
    one, two = dataset(tmp_path / "one"), dataset(tmp_path / "two")
    key = reference_key(SPEC, [f"data.root={one}", f"output_dir={tmp_path}/a", "name=x", "trainer.epochs=3"], one)
    same = reference_key(SPEC, [f"data.root={two}", f"output_dir={tmp_path}/b", "name=y", "trainer.epochs=3"], two)
    assert key == same
    (two / "hpctrain_index.json").write_text("{}")  # what a run leaves beside the images
    assert reference_key(SPEC, [f"data.root={two}", "trainer.epochs=3"], two) == key


def test_other_sets_or_other_images_are_another_reference(tmp_path: Path) -> None:
    one, other = dataset(tmp_path / "one"), dataset(tmp_path / "other", b"\xff\xd8other")
    key = reference_key(SPEC, [f"data.root={one}", "trainer.epochs=3"], one)
    assert reference_key(SPEC, [f"data.root={one}", "trainer.epochs=4"], one) != key
    assert reference_key(SPEC, [f"data.root={other}", "trainer.epochs=3"], other) != key


def test_a_reference_is_trained_once_even_by_two_sessions_at_once(store: Path) -> None:
    trained: list[int] = []
    answers: list[str] = []

    def train() -> str:
        trained.append(1)
        return "ab" * 32

    threads = [threading.Thread(target=lambda: answers.append(stored_weights("k", train))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert trained == [1]
    assert answers == ["ab" * 32] * 4
    assert stored_weights("k", train) == "ab" * 32
    assert trained == [1]  # read from the store, not trained again


def test_a_failed_training_stores_nothing(store: Path) -> None:
    def fail() -> str:
        raise AssertionError("the reference run failed")

    with pytest.raises(AssertionError):
        stored_weights("k", fail)
    trained: list[int] = []
    assert stored_weights("k", lambda: trained.append(1) or "cd" * 32) == "cd" * 32
    assert trained == [1]  # trained after the failure, not read
    assert [p.name for p in store.iterdir() if p.suffix == ".json"] == ["k.json"]

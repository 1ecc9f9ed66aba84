"""What a sync sends, from metrics.jsonl and a cursor: each settled step once, with its last value."""

from __future__ import annotations

import json

from hpctrain.contract.starts import Start
from hpctrain.contract.summary import parse_summary
from hpctrain.tracking.plan import (
    flat_params,
    late_events,
    plan_batch,
    read_history,
    run_events,
    run_tags,
    settled_step,
)
from tests.tracking_helpers import first_loss, last_loss, metric_line


def lines_of(text: str) -> list[bytes]:
    return [line.encode() for line in text.splitlines(keepends=True)]


def restarted() -> list[bytes]:
    """Attempt 1: steps 1-10; attempt 2 (from the checkpoint at 6): 7-15."""
    text = "".join(metric_line(s, first_loss(s), 1000.0 + s) for s in range(1, 11))
    text += "".join(metric_line(s, last_loss(s), 2000.0 + s) for s in range(7, 16))
    return lines_of(text)


def test_the_last_value_of_each_step_counts_and_restarts_are_found() -> None:
    history = read_history(restarted())
    assert sorted(history.steps) == list(range(1, 16))
    assert {s: e.values["train/loss"] for s, e in history.steps.items()} == {s: last_loss(s) for s in range(1, 16)}
    assert history.steps[8].time == 2008.0  # the time of the line that counts
    later = read_history([*restarted(), metric_line(8, 0.25, 2099.0, kind="step_split").encode()])
    assert later.steps[8].time == 2008.0, "a later line of the step leaves the step's own time"
    assert (later.steps[8].time_of("train/loss"), later.steps[8].time_of("split/loss")) == (2008.0, 2099.0)
    assert [(r.number, r.step, r.redone) for r in history.restarts] == [(1, 7, 4)]
    assert history.max_step == 15


def test_steps_settle_at_the_checkpoint_while_the_run_goes_on_and_all_at_its_end() -> None:
    history = read_history(restarted())
    assert settled_step(history, None, False) is None  # no checkpoint yet: a restart could redo anything
    assert settled_step(history, 6, False) == 6
    assert settled_step(history, 20, False) == 15  # a checkpoint past the last line logged
    assert settled_step(history, 6, True) == 15


def test_a_batch_holds_the_settled_steps_after_the_cursor_once() -> None:
    history = read_history(restarted())
    first = plan_batch(history, [], after_step=-1, settled=6, sent=[])
    assert [e.step for e in first.steps] == [1, 2, 3, 4, 5, 6] and first.through == 6
    later = read_history(restarted(), after_step=6)
    assert sorted(later.steps) == list(range(7, 16))  # the cursor's steps are not even kept
    second = plan_batch(later, [], after_step=6, settled=15, sent=[])
    assert [e.step for e in second.steps] == list(range(7, 16))
    assert [e.values["train/loss"] for e in second.steps] == [last_loss(s) for s in range(7, 16)]
    assert plan_batch(later, [], after_step=15, settled=15, sent=[]).steps == []


def test_a_line_being_written_waits_for_its_newline() -> None:
    lines = restarted()
    lines[-1] = lines[-1].rstrip(b"\n")
    history = read_history(lines)
    assert history.max_step == 14 and history.size == sum(len(line) for line in lines[:-1])


def test_events_go_with_their_step_once_and_late_ones_are_kept_apart() -> None:
    summary = parse_summary({"status": "running", "node_failures": [{"node": "c2", "step": 9}], "evictions": []})
    history = read_history(restarted())
    events = run_events(history, summary)
    assert {(e.key, e.step, e.metric, e.value) for e in events} == {
        ("restart-1", 7, "hpctrain/restart", 1.0),
        ("redone-1", 7, "hpctrain/redone_steps", 4.0),
        ("node-lost-0", 9, "hpctrain/node_lost", 1.0),
    }
    batch = plan_batch(history, events, after_step=6, settled=15, sent=["restart-1"])
    assert {e.key for e in batch.events} == {"redone-1", "node-lost-0"}
    assert batch.steps[2].values["hpctrain/node_lost"] == 1.0 and batch.steps[2].step == 9
    assert [e.key for e in late_events(events, after_step=8, sent=["restart-1", "redone-1"])] == []
    assert [e.key for e in late_events(events, after_step=10, sent=["restart-1", "redone-1"])] == ["node-lost-0"]


def test_every_start_is_a_restart_event_at_its_first_step_also_one_that_redid_nothing() -> None:
    """A requeue and a preemption that resumed exactly (no step repeated in metrics.jsonl) are restarts 1
    and 2 at their first steps; the hard kill's relaunch that redid steps 7-10 is restart 3."""
    starts = [
        Start(100.0, "5", None, 110.0, 1, first=True),
        Start(200.0, "5", 3, 210.0, 4),  # the requeue: resumed at step 4
        Start(300.0, "5", 5, None, None),  # the preemption's restart: no first step recorded (yet)
        Start(400.0, "5", 10, 410.0, 7),  # after the lost node: from the checkpoint at 6
    ]
    events = run_events(read_history(restarted()), None, starts)
    assert sorted((e.key, e.step, e.value) for e in events if e.metric == "hpctrain/restart") == [
        ("restart-1", 4, 1.0),
        ("restart-2", 6, 2.0),
        ("restart-3", 7, 3.0),
    ]
    assert [(e.key, e.step, e.value) for e in events if e.metric == "hpctrain/redone_steps"] == [("redone-1", 7, 4.0)]
    # only the newest lines of a long starts file: the repeats in the metric lines, as without one
    partial = run_events(read_history(restarted()), None, starts[2:])
    assert [(e.key, e.step) for e in partial if e.metric == "hpctrain/restart"] == [("restart-1", 7)]


def test_steps_redone_after_they_were_sent_are_counted_not_sent_again() -> None:
    lines = restarted()
    sent_bytes = sum(len(line) for line in lines)
    lines += lines_of(metric_line(5, 77.0, 4000.0))  # a restart from an older checkpoint redid step 5
    history = read_history(lines, after_step=15, sent_bytes=sent_bytes)
    assert history.late == [5] and history.steps == {}
    assert run_tags(None, history, history.late)["hpctrain.late_redone_steps"] == "[5]"


def test_the_runs_facts_become_tags() -> None:
    summary = parse_summary(
        {"status": "stopped", "stop_reason": "preempted", "restarts": 2, "node_failures": [{"node": "c2", "step": 9}],
         "evictions": [{"node": "c3", "step": 12}]}
    )  # fmt: skip
    tags = run_tags(summary, read_history(restarted()), [])
    assert tags == {
        "hpctrain.restarts": "2",
        "hpctrain.status": "stopped",
        "hpctrain.stop_reason": "preempted",
        "hpctrain.lost_nodes": "c2",
        "hpctrain.evicted_nodes": "c3",
    }


def test_garbage_and_foreign_lines_are_skipped() -> None:
    lines = lines_of('not json\n{"kind": "mine", "global_step": 3}\n[1]\n') + restarted()
    lines += lines_of(json.dumps({"kind": "train_step", "global_step": 16, "loss": "NaN", "time": 1.0}) + "\n")
    history = read_history(lines)
    assert sorted(history.steps) == list(range(1, 16))  # step 16 held nothing plausible to send


def test_the_spec_becomes_flat_parameters() -> None:
    params = flat_params({"name": "x", "trainer": {"lr": 0.1, "step_epochs": [30, 60]}, "env": {}, "s": None})
    assert params == {"name": "x", "trainer.lr": "0.1", "trainer.step_epochs": "[30, 60]", "env": "{}", "s": "null"}


def test_a_step_split_record_is_sent_under_split_and_a_kind_without_a_prefix_is_not() -> None:
    """The trainer's per-window step split (contract/step_split.py) beside its train_step at the same step;
    a sync of a run with one failed with a KeyError before (the CI rehearsal of 2026-11-29)."""
    split = {"kind": "step_split", "global_step": 2, "time": 5.0, "ranks": 2, "forward_s": 0.25, "data_s": 0.5}
    lines = lines_of(metric_line(2, 1.5, 4.0) + json.dumps(split) + "\n")
    history = read_history(lines)
    assert history.steps[2].values == {
        "train/loss": 1.5,
        "split/ranks": 2.0,
        "split/forward_s": 0.25,
        "split/data_s": 0.5,
    }

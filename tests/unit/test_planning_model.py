"""The planner's pure model (hpctrain/planning/: work, step_time, timeline) on plain data."""

from __future__ import annotations

import math

import pytest

from hpctrain.errors import UsageError
from hpctrain.planning.step_time import Measurement, fit, step_times
from hpctrain.planning.timeline import Timeline, chunk_count, duration, recommend, timeline, with_hold
from hpctrain.planning.work import NoStepCount, Work, work_of

# ------------------------------------------------------------------ work


def test_steps_follow_the_global_batch_of_each_shape() -> None:
    work = Work(epochs=90, samples_per_epoch=1_281_167)
    assert work.steps_at(256) == 90 * 5005  # ceil(1281167 / 256)
    assert work.steps_at(512) == 90 * 2503  # twice the nodes: half the steps


def test_max_steps_per_epoch_caps_each_epoch() -> None:
    assert Work(epochs=3, samples_per_epoch=10_000, max_steps_per_epoch=5).steps_at(100) == 15
    assert Work(epochs=3, max_steps_per_epoch=5).steps_at(100) == 15


def test_a_fixed_total_is_the_same_at_every_shape() -> None:
    work = work_of(spec_name="s", runs_trainer=False, epochs=1, max_steps_per_epoch=None, steps=1000)
    assert work.steps_at(8) == work.steps_at(800) == 1000
    assert "--steps" in work.source


def test_work_names_its_source_best_first() -> None:
    common = dict(spec_name="s", runs_trainer=True, epochs=2, max_steps_per_epoch=None)
    mine = work_of(**common, samples_per_epoch=100, measured_samples=(5000, "runs/x/1"))
    assert mine.samples_per_epoch == 100 and "--samples-per-epoch" in mine.source
    measured = work_of(**common, measured_samples=(5000, "runs/x/1"))
    assert measured.samples_per_epoch == 5000 and "runs/x/1" in measured.source
    capped = work_of(**{**common, "max_steps_per_epoch": 7})
    assert capped.steps_at(64) == 14 and "cap" in capped.source


def test_no_step_count_says_what_is_missing() -> None:
    with pytest.raises(NoStepCount) as caught:
        work_of(spec_name="jobs/x.yaml", runs_trainer=True, epochs=90, max_steps_per_epoch=None)
    assert "jobs/x.yaml" in caught.value.message and "trainer.epochs is 90" in caught.value.message
    assert "--samples-per-epoch" in (caught.value.hint or "")
    assert caught.value.exit_code == 2
    with pytest.raises(NoStepCount) as script:
        work_of(spec_name="jobs/s.yaml", runs_trainer=False, epochs=1, max_steps_per_epoch=None)
    assert "--steps" in (script.value.hint or "")


def test_a_script_takes_its_total_from_an_earlier_run() -> None:
    work = work_of(
        spec_name="s", runs_trainer=False, epochs=1, max_steps_per_epoch=None, measured_total_steps=(400, "runs/y")
    )
    assert work.steps_at(1) == 400 and "runs/y" in work.source


# ------------------------------------------------------------------ step time


def test_measured_shapes_use_their_median_and_say_so() -> None:
    times = step_times([1, 2], [Measurement(1, 0.5, 40, "runs/a"), Measurement(2, 0.6, 30, "runs/b")])
    assert times[1] is not None and times[1].seconds == 0.5 and not times[1].extrapolated
    assert "runs/a" in times[1].source and "measured" in times[1].source


def test_unmeasured_shapes_are_extrapolated_with_the_model_stated() -> None:
    times = step_times([1, 2, 8], [Measurement(1, 0.5, 40, "runs/a"), Measurement(2, 0.6, 30, "runs/b")])
    eight = times[8]
    assert eight is not None and eight.extrapolated
    assert eight.seconds == pytest.approx(0.5 + 0.1 * 3)  # a + b log2(n) through both points
    assert "log2" in eight.source and "1, 2 nodes" in eight.source


def test_one_measured_shape_extrapolates_as_perfect_weak_scaling() -> None:
    times = step_times([4], [Measurement(1, 0.5, 40, "runs/a")])
    assert times[4] is not None and times[4].seconds == 0.5 and times[4].extrapolated
    assert "perfect weak scaling" in times[4].source


def test_a_faster_step_on_more_nodes_is_not_extrapolated_into_a_speed_up() -> None:
    model = fit({1: 0.6, 4: 0.5})
    assert model is not None and model.b == 0 and model.at(64) == pytest.approx(0.55)


def test_the_most_logged_measurement_of_a_shape_wins() -> None:
    times = step_times([2], [Measurement(2, 9.0, 3, "runs/short"), Measurement(2, 0.4, 300, "runs/long")])
    assert times[2] is not None and times[2].seconds == 0.4


def test_the_users_step_time_fills_in_where_nothing_was_measured() -> None:
    times = step_times([2, 4], [], user_step_s=0.3, user_nodes=2)
    assert times[2] is not None and times[2].source == "--step-time (yours)" and not times[2].extrapolated
    assert times[4] is not None and times[4].extrapolated and "your --step-time" in times[4].source
    assert step_times([2], []) == {2: None}


def test_a_measurement_beats_the_users_number_at_its_shape() -> None:
    times = step_times([2], [Measurement(2, 0.4, 30, "runs/a")], user_step_s=9.0, user_nodes=2)
    assert times[2] is not None and times[2].seconds == 0.4


# ------------------------------------------------------------------ timeline


def test_a_run_within_its_limit_is_one_chunk() -> None:
    line = timeline(
        steps=1000, step_s=1.0, nodes=2, gpus_per_node=4, limit_s=3600, stop_s=90, start_in_s=600, restart_s=120
    )
    assert line.chunks == 1
    assert line.held_s == 1120 and line.finish_in_s == 600 + 1120
    assert line.node_hours == pytest.approx(2 * 1120 / 3600) and line.gpu_hours == pytest.approx(8 * 1120 / 3600)


def test_a_run_longer_than_its_limit_pays_restart_stop_and_queue_each_chunk() -> None:
    # 10 h of training, 4 h chunks: each trains 4 h - 120 s - 90 s, so 3 chunks
    line = timeline(
        steps=36_000, step_s=1.0, nodes=1, gpus_per_node=0, limit_s=14_400, stop_s=90, start_in_s=1800, restart_s=120
    )
    useful = 14_400 - 210
    assert line.chunks == math.ceil(36_000 / useful) == 3
    last = 36_000 - 2 * useful
    assert line.held_s == 2 * 14_400 + 120 + last
    assert line.finish_in_s == 1800 + line.held_s + 2 * 1800  # each later chunk queues as long as the first
    assert line.gpu_hours is None  # a CPU job


def test_an_unknown_start_leaves_the_finish_unknown() -> None:
    line = timeline(steps=10, step_s=1.0, nodes=1, gpus_per_node=1, limit_s=3600, stop_s=0, start_in_s=None)
    assert line.start_in_s is None and line.finish_in_s is None and line.held_s > 0


def test_a_chunk_too_short_to_train_is_refused() -> None:
    with pytest.raises(UsageError, match="trains not at all"):
        chunk_count(100, limit_s=200, restart_s=120, stop_s=90)


def _line(finish: float | None, gpu_hours: float) -> Timeline:
    return Timeline(1, 0, 0, 0 if finish is not None else None, finish, gpu_hours / 4, gpu_hours)


def test_recommend_the_earliest_finish() -> None:
    choice = recommend([(2, _line(10_000, 40)), (4, _line(6_000, 48)), (8, _line(30_000, 50))])
    assert choice.nodes == 4 and "4 nodes finishes first" in choice.reason


def test_recommend_the_cheapest_within_the_margin() -> None:
    choice = recommend([(2, _line(6_300, 30)), (4, _line(6_000, 48))], margin=0.10)
    assert choice.nodes == 2
    assert (
        "4 nodes finishes first" in choice.reason
        and "within 10%" in choice.reason
        and "38% fewer GPU-hours" in choice.reason
    )


def test_nothing_is_recommended_on_guessed_starts() -> None:
    choice = recommend([(2, _line(None, 30)), (4, _line(None, 48))])
    assert choice.nodes is None and "no shape has a known finish" in choice.reason


def test_durations_read_in_two_units() -> None:
    assert [duration(s) for s in (40, 720, 18_600, 273_600)] == ["40 s", "12 min", "5 h 10 min", "3 d 4 h"]


def test_each_later_chunk_waits_out_slurms_requeue_hold() -> None:
    # 300 s of training in chunks of 120 s that train 120 - 10 - 20 = 90 s: 4 chunks, three of them requeued
    line = timeline(steps=300, step_s=1.0, nodes=1, gpus_per_node=0, limit_s=120, stop_s=20, start_in_s=5.0,
                    restart_s=10.0, requeue_hold_s=120.0)  # fmt: skip
    plain = timeline(steps=300, step_s=1.0, nodes=1, gpus_per_node=0, limit_s=120, stop_s=20, start_in_s=5.0,
                     restart_s=10.0)  # fmt: skip
    assert (line.chunks, plain.chunks) == (4, 4)
    assert line.finish_in_s == plain.finish_in_s + 3 * 120  # type: ignore[operator]
    assert line.held_s == plain.held_s  # the hold is waiting, not allocated time
    assert with_hold(plain, 120.0) == line  # the same, added once the chunks are known

"""The LR schedule and its continuation when a resume changes max_steps (no jump, a documented rule)."""

from __future__ import annotations

import pytest

from training.trainer.schedule import MIN_LR_RATIO, Schedule, lr_factor, warmup_for


def test_a_schedule_without_continuation_is_the_plain_warmup_cosine():
    schedule = Schedule(20, 4)
    assert [schedule.factor(s) for s in range(25)] == [lr_factor(s, 4, 20) for s in range(25)]


def test_raising_max_steps_of_a_finished_run_continues_at_the_floor():
    finished = Schedule(20, 4)
    assert finished.factor(20) == pytest.approx(MIN_LR_RATIO)
    longer = finished.continued_to(40, 20)
    assert [longer.factor(s) for s in range(20, 41)] == pytest.approx([MIN_LR_RATIO] * 21)
    assert [longer.factor(s) for s in range(20)] == [finished.factor(s) for s in range(20)]


def test_raising_max_steps_mid_decay_continues_from_the_rate_reached_to_the_floor_at_the_new_end():
    schedule = Schedule(100, 10)
    longer = schedule.continued_to(300, 50)
    assert longer.factor(50) == pytest.approx(schedule.factor(50))  # no jump
    decay = [longer.factor(s) for s in range(50, 301)]
    assert all(a >= b for a, b in zip(decay, decay[1:], strict=False))
    assert decay[-1] == pytest.approx(MIN_LR_RATIO)
    again = longer.continued_to(400, 200)  # a second raise repeats the rule from there
    assert again.factor(200) == pytest.approx(longer.factor(200)) and again.factor(400) == pytest.approx(
        MIN_LR_RATIO
    )
    assert [again.factor(s) for s in range(200)] == [longer.factor(s) for s in range(200)]  # history kept
    restored = Schedule.from_state_dict(again.state_dict())
    assert restored == again


def test_raising_max_steps_inside_the_warmup_keeps_the_warmup():
    schedule = Schedule(50, 10).continued_to(100, 5)
    assert schedule == Schedule(100, 10)
    assert Schedule(50, 10).continued_to(50, 30) == Schedule(50, 10)


def test_a_warmup_as_long_as_the_run_is_shortened_with_a_note():
    assert warmup_for(100, 1000) == (100, None)
    steps, note = warmup_for(100, 50)
    assert steps == 5 and "lr_warmup_steps=100 is not below max_steps=50" in note
    assert warmup_for(10, 5)[0] == 0

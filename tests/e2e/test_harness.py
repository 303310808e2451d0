"""The harness itself: a scenario's label names every field (two scenarios never share a run
directory), and a comparison restricted to some fields checks those fields on every rank."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest

from .harness import Outcome, Scenario

BASE = Scenario(world_size=2)


def another(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, tuple):
        return (*value, ("verify", False))
    return 1  # None


@pytest.mark.parametrize("name", [field.name for field in fields(Scenario)])
def test_a_scenario_differing_in_any_one_field_has_another_label(name: str) -> None:
    value = "stream" if name == "data" else another(getattr(BASE, name))  # the data is one of data_setups.SETUPS
    changed = replace(BASE, **{name: value})
    assert changed.label() != BASE.label(), name


def step(ids: list[int], loss: str = "0x1p0") -> dict[str, Any]:
    return {"epoch": 0, "batch": 0, "ids": ids, "loss": loss}


def test_a_restricted_comparison_checks_every_rank_in_those_fields() -> None:
    """It once narrowed its fields to the first rank's differing ones, and missed a later rank's."""
    full = {0: [step([0]), step([1])], 1: [step([2]), step([3])]}
    stopped = {0: [step([0])], 1: [step([2])]}
    resumed = {0: [step([1], loss="0x1p1")], 1: [step([9])]}
    problems = Outcome(BASE, full, stopped, resumed).stream_mismatches(fields=("ids", "loss"))
    assert [problem.split(":")[0] for problem in problems] == [
        "rank 0 step 1 differs in ['loss']",
        "rank 1 step 1 differs in ['ids']",
    ]


def test_losses_on_three_processes_may_differ_in_their_last_bits_and_nothing_else_may() -> None:
    """DDP reduces a resumed run's first step to other bits on three or more processes (test_ddp_first_step)."""
    full = {rank: [step([rank], loss=0.0334327295422554)] for rank in range(3)}
    stopped = {rank: [] for rank in range(3)}

    def outcome(world_size: int, loss: float, ids: int = 0) -> Outcome:
        resumed = {rank: [step([rank + ids], loss=loss)] for rank in range(3)}
        return Outcome(replace(BASE, world_size=world_size), full, {**stopped}, resumed)

    last_bit = 0.0334327258169651  # measured: one float32 ulp away
    assert outcome(3, last_bit).differing_fields() == set()
    assert outcome(2, last_bit).differing_fields() == {"loss"}, "bit for bit on two processes"
    assert outcome(3, 0.0335).differing_fields() == {"loss"}, "a wrong step is still told apart"
    assert outcome(3, last_bit, ids=1).differing_fields() == {"ids"}


def test_a_long_label_is_cut_with_a_digest_that_keeps_two_scenarios_apart() -> None:
    """A run directory is named by its scenario's label (a soak's case of 265 characters could not make one)."""
    long = Scenario(
        world_size=2, num_workers=1, data="wds", shuffle_buffer=3, wds_form="batched-before", resume_world_size=1,
        resume_num_workers=2, resume_batch_size=4, evaluate_before_resume=True, extra_saves_every=1,
        manual_optimization=True, val_loader="shuffled", start_method="default:spawn",
        callback_options=(("seed_steps", False),),
    )  # fmt: skip
    other = replace(long, val_loader="batch_sampler")  # differs past the cut
    assert len(long.label()) == len(other.label()) == 200
    assert long.label()[:120] == other.label()[:120] and long.label() != other.label()
    assert Scenario(world_size=2).label() == "W2-workers0-DataLoader-shuffle-keeplast-batch_end", (
        "short labels as before"
    )

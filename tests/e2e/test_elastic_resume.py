"""End to end: a 2-process run stopped mid-epoch resumes on 3 processes and on 1.

The interrupted epoch, before and after the stop, trains every sample once (plus the documented
DistributedSampler-style padding of the remainder on the new world size), every new rank trains the
same number of batches, and the following epochs equal an uninterrupted run on the new world size.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from .harness import Records, Runner, Scenario

STOPPED_ON_TWO = Scenario(world_size=2, stop_kind="batch_end")


def ids_in_epoch(records: Records, epoch: int) -> list[int]:
    return [i for rank_records in records.values() for r in rank_records if r["epoch"] == epoch for i in r["ids"]]


def steps_after_epoch(records: Records, epoch: int) -> dict[int, list[dict[str, object]]]:
    return {rank: [r for r in rank_records if r["epoch"] > epoch] for rank, rank_records in records.items()}


@pytest.mark.parametrize("new_world_size", [3, 1])
def test_resume_on_another_world_size_trains_each_sample_of_the_epoch_once(runner: Runner, new_world_size: int) -> None:
    scenario = replace(STOPPED_ON_TWO, resume_world_size=new_world_size)
    epoch, size = scenario.stop_epoch, scenario.dataset_size
    before = ids_in_epoch(runner.stopped(scenario), epoch)
    resumed = runner.resumed(scenario)
    after = ids_in_epoch(resumed, epoch)

    remaining = size - len(before)
    padding = math.ceil(remaining / new_world_size) * new_world_size - remaining
    assert len(before) == (scenario.stop_batch + 1) * scenario.batch_size * scenario.world_size
    assert set(before + after) == set(range(size)), "every sample of the interrupted epoch is trained"
    assert len(before) + len(after) == size + padding, "no repeats beyond the padding"
    batches_per_rank = {len([r for r in records if r["epoch"] == epoch]) for records in resumed.values()}
    assert len(batches_per_rank) == 1, f"new ranks trained different numbers of batches: {batches_per_rank}"

    fresh_on_new_size = runner.full(replace(scenario, world_size=new_world_size, resume_world_size=None))
    assert steps_after_epoch(resumed, epoch) == steps_after_epoch(fresh_on_new_size, epoch)

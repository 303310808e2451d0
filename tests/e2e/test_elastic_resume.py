"""End to end: a 2-process run stopped mid-epoch resumes on 3 processes and on 1, and with another batch size.

The interrupted epoch, before and after the stop, trains every sample once (plus the documented
DistributedSampler-style padding of the remainder on the new world size), each with the augmentation
it had in the uninterrupted run on 2 processes, every new rank trains the same number of batches,
and the following epochs read what an uninterrupted run on the new world size reads. Losses after a
world-size change cannot equal any uninterrupted run's, but they are deterministic: the same elastic
resume run twice gives bit-identical records.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from .harness import Runner, Scenario, augmentation_by_id, data_after_epoch, global_order, ids_in_epoch

STOPPED_ON_TWO = Scenario(world_size=2, stop_kind="batch_end")


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
    assert data_after_epoch(resumed, epoch) == data_after_epoch(fresh_on_new_size, epoch)


@pytest.mark.parametrize("new_world_size", [3, 1])
def test_resume_on_another_world_size_keeps_every_samples_augmentation(runner: Runner, new_world_size: int) -> None:
    scenario = replace(STOPPED_ON_TWO, resume_world_size=new_world_size)
    epoch = scenario.stop_epoch
    uninterrupted = augmentation_by_id(runner.full(scenario), epoch=epoch)
    interrupted = augmentation_by_id(runner.stopped(scenario), runner.resumed(scenario), epoch=epoch)
    assert all(len(values) == 1 for values in uninterrupted.values()), "38 samples on 2 ranks: no padding"
    assert set(interrupted) == set(uninterrupted)
    padding_ids = [sample for sample, values in interrupted.items() if len(values) > 1]
    assert len(padding_ids) == (1 if new_world_size == 3 else 0)
    for sample, values in interrupted.items():
        assert values[0] == uninterrupted[sample][0], f"sample {sample} lost its augmentation"
    for sample in padding_ids:
        assert interrupted[sample][1] != interrupted[sample][0], "a padded repeat draws its own augmentation"


def test_the_same_elastic_resume_twice_is_bit_identical(runner: Runner) -> None:
    scenario = replace(STOPPED_ON_TWO, resume_world_size=1)
    first = runner.resumed(scenario)
    assert runner.resumed(scenario, attempt=2) == first


def test_a_bucketing_sampler_resumed_on_one_process_trains_each_sample_of_the_epoch_once(runner: Runner) -> None:
    """Variable-size batches: the remaining global batches go to the one new rank, every sample once."""
    scenario = Scenario(world_size=2, num_workers=2, sampler="bucketing", resume_world_size=1)
    epoch = scenario.stop_epoch
    before = ids_in_epoch(runner.stopped(scenario), epoch)
    after = ids_in_epoch(runner.resumed(scenario), epoch)
    assert before and after
    assert sorted(before + after) == list(range(scenario.dataset_size))


@pytest.mark.parametrize(("new_world_size", "new_batch_size"), [(2, 6), (2, 2), (1, 6)])
def test_a_resume_with_another_batch_size_goes_on_from_the_same_global_position(
    runner: Runner, new_world_size: int, new_batch_size: int
) -> None:
    """A batch-size ramp (4 -> 6) or a smaller batch that fits another GPU (4 -> 2), on the same world size or on
    one process: the interrupted epoch's samples are the uninterrupted run's, in its global order, from the
    position the checkpoint holds, each with its augmentation; Lightning counts the epoch's batches on from the
    checkpoint's; the next epochs are an uninterrupted run's with the new batch size."""
    resize = {"resume_world_size": new_world_size} if new_world_size != 2 else {}
    scenario = replace(STOPPED_ON_TWO, resume_batch_size=new_batch_size, **resize)  # type: ignore[arg-type]
    epoch, stop = scenario.stop_epoch, scenario.stop_batch
    stopped, resumed = runner.stopped(scenario), runner.resumed(scenario)
    assert global_order(stopped, epoch) + global_order(resumed, epoch) == global_order(runner.full(scenario), epoch)
    uninterrupted = augmentation_by_id(runner.full(scenario), epoch=epoch)
    assert augmentation_by_id(stopped, resumed, epoch=epoch) == uninterrupted

    rest = scenario.dataset_size - (stop + 1) * scenario.batch_size * scenario.world_size
    per_rank = math.ceil(rest / new_world_size)
    expected_batches = list(range(stop + 1, stop + 1 + math.ceil(per_rank / new_batch_size)))
    assert sorted(resumed) == list(range(new_world_size))
    for rank, records in resumed.items():
        assert [r["batch"] for r in records if r["epoch"] == epoch] == expected_batches, f"rank {rank}"
        assert all(len(r["ids"]) <= new_batch_size for r in records)

    fresh = runner.full(
        replace(
            scenario,
            world_size=new_world_size,
            batch_size=new_batch_size,
            resume_batch_size=None,
            resume_world_size=None,
        )
    )
    assert data_after_epoch(resumed, epoch) == data_after_epoch(fresh, epoch)

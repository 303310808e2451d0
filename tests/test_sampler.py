"""ResumableSampler: DistributedSampler's layout, started at any global position, on any world size."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from lightning_resumable import IncompatibleStateError, ResumableSampler


def batches_of(indices: list[int], batch_size: int, drop_last: bool) -> list[list[int]]:
    batches = [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    return [b for b in batches if len(b) == batch_size] if drop_last else batches


@pytest.mark.parametrize("size", [10, 11, 13, 64])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_stream_is_distributed_samplers_stream(size: int, world_size: int, drop_last: bool) -> None:
    for rank in range(world_size):
        expected = list(DistributedSampler(range(size), world_size, rank, shuffle=False, drop_last=drop_last))
        sampler = ResumableSampler(range(size), world_size, rank, shuffle=False, drop_last=drop_last)
        assert list(sampler) == expected
        assert len(sampler) == len(expected)


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_partition_each_epoch_and_epochs_differ(drop_last: bool) -> None:
    size, world_size = 103, 4
    orders = []
    for epoch in range(3):
        per_rank = []
        for rank in range(world_size):
            sampler = ResumableSampler(range(size), world_size, rank, seed=5, drop_last=drop_last)
            sampler.set_epoch(epoch)
            per_rank.append(list(sampler))
        counts = Counter(i for stream in per_rank for i in stream)
        if drop_last:
            assert len(counts) == size // world_size * world_size and set(counts.values()) == {1}
        else:
            assert set(counts) == set(range(size))
            assert sum(counts.values()) == -(-size // world_size) * world_size
        orders.append(per_rank)
    assert orders[0] != orders[1] != orders[2]


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 300),
    batch_size=st.integers(1, 9),
    world_size=st.integers(1, 5),
    drop_last=st.booleans(),
    epoch=st.integers(0, 5),
    stop_fraction=st.floats(0, 1),
)
def test_same_world_size_resume_continues_every_rank_exactly(
    size: int, batch_size: int, world_size: int, drop_last: bool, epoch: int, stop_fraction: float
) -> None:
    num_batches = len(ResumableSampler(range(size), world_size, 0, drop_last=drop_last)) // batch_size
    consumed = int(stop_fraction * num_batches)
    state = None
    full_streams = []
    for rank in range(world_size):
        sampler = ResumableSampler(range(size), world_size, rank, seed=77, drop_last=drop_last, batch_size=batch_size)
        sampler.set_epoch(epoch)
        full_streams.append(list(sampler))
        state = sampler.state_dict(consumed) if state is None else state
        assert sampler.state_dict(consumed) == state, "every rank writes the same global state"
    assert state is not None
    for rank in range(world_size):
        restored = ResumableSampler(range(size), world_size, rank, seed=0, drop_last=drop_last, batch_size=batch_size)
        restored.load_state_dict(json.loads(json.dumps(state)))
        restored.set_epoch(epoch)  # the trainer's set_epoch for the same epoch keeps the position
        if state["position"] >= size:
            assert list(restored) == [], "a finished epoch restores to its empty rest"
            assert list(restored) == full_streams[rank], "and the pass after it is the epoch's order again"
            continue
        assert list(restored) == full_streams[rank][consumed * batch_size :]
        assert len(restored) == len(full_streams[rank])


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 300),
    batch_size=st.integers(1, 9),
    world_size=st.integers(1, 5),
    new_world_size=st.integers(1, 5),
    drop_last=st.booleans(),
    stop_fraction=st.floats(0, 1),
)
def test_elastic_resume_consumes_every_sample_once_per_epoch(
    size: int, batch_size: int, world_size: int, new_world_size: int, drop_last: bool, stop_fraction: float
) -> None:
    def sampler(world: int, rank: int) -> ResumableSampler:
        return ResumableSampler(range(size), world, rank, seed=3, drop_last=drop_last, batch_size=batch_size)

    per_rank = len(sampler(world_size, 0))
    consumed = int(stop_fraction * (per_rank // batch_size))
    before: list[int] = []
    for rank in range(world_size):
        before += list(sampler(world_size, rank))[: consumed * batch_size]
    writer = sampler(world_size, 0)
    state = writer.state_dict(consumed)
    if state["position"] >= size:
        restored = sampler(new_world_size, 0)
        restored.load_state_dict(state)
        assert list(restored) == [], "a finished epoch: its empty rest"
        again = list(restored)
        assert restored.epoch == 0 and again == list(sampler(new_world_size, 0)), "then the pass after it"
        return
    after: list[int] = []
    lengths = set()
    for rank in range(new_world_size):
        restored = sampler(new_world_size, rank)
        restored.load_state_dict(state)
        after += list(restored)
        lengths.add(len(restored))
    remaining = size - state["position"]
    assert len(lengths) == 1, "every new rank has the same epoch length, so no rank waits on a collective"
    if drop_last:
        assert len(set(before + after)) == len(before + after), "no sample twice"
        assert len(after) == remaining // new_world_size * new_world_size
    else:
        assert set(before + after) == set(range(size)), "every sample of the epoch"
        assert len(after) == -(-remaining // new_world_size) * new_world_size, "only the documented padding repeats"
        assert lengths == {consumed * batch_size + len(after) // new_world_size}


def test_state_is_global_plain_and_small() -> None:
    sampler = ResumableSampler(range(10**9), num_replicas=8, rank=5, seed=42, batch_size=32)
    sampler.set_epoch(3)
    state = sampler.state_dict(1000)
    assert state["epoch"] == 3 and state["position"] == 1000 * 32 * 8 and state["seed"] == 42
    assert "rank" not in state
    assert len(json.dumps(state)) < 1024


def test_without_declared_consumption_state_counts_indices_handed_out() -> None:
    sampler = ResumableSampler(range(100), num_replicas=2, rank=1, batch_size=5)
    iterator = iter(sampler)
    taken = [next(iterator) for _ in range(10)]
    state = sampler.state_dict()
    assert (state["position"], state["batches"]) == (20, 2)
    restored = ResumableSampler(range(100), num_replicas=2, rank=1, batch_size=5)
    restored.load_state_dict(state)
    assert taken + list(restored) == list(ResumableSampler(range(100), num_replicas=2, rank=1, batch_size=5))


def test_set_epoch_starts_a_new_epoch_at_position_zero() -> None:
    sampler = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4)
    restored = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4)
    restored.load_state_dict(sampler.state_dict(2))
    assert len(list(restored)) == 12
    restored.set_epoch(1)
    assert len(list(restored)) == 20


def test_a_restore_applies_to_the_next_pass_only() -> None:
    """A second pass of the same epoch is a whole epoch, of the next cycle."""
    sampler = ResumableSampler(range(40), num_replicas=2, rank=1, batch_size=4)
    sampler.set_epoch(2)
    restored = ResumableSampler(range(40), num_replicas=2, rank=1, batch_size=4)
    restored.load_state_dict(sampler.state_dict(2))
    whole_epoch = list(sampler)
    assert list(restored) == whole_epoch[8:]
    assert list(restored) == list(sampler)  # both in their second cycle now
    assert len(restored) == len(whole_epoch)


def test_each_restart_within_an_epoch_is_a_fresh_cycle_and_restores_as_such() -> None:
    """CombinedLoader's max_size_cycle restarts a short loader: each cycle is another permutation, a
    pure function of (seed, epoch, cycle); a new epoch starts again at cycle 0."""
    sampler = ResumableSampler(range(40), num_replicas=2, rank=0, seed=7, batch_size=4, passes="cycle")
    sampler.set_epoch(1)
    other_rank = ResumableSampler(range(40), num_replicas=2, rank=1, seed=7, batch_size=4, passes="cycle")
    other_rank.set_epoch(1)
    cycles = [list(sampler) for _ in range(3)]
    for cycle in cycles:  # every cycle is a whole permutation, split across the ranks
        assert sorted(cycle + list(other_rank)) == list(range(40))
    assert len({tuple(cycle) for cycle in cycles}) == 3
    assert sampler.data_state().cycle == 2
    sampler.set_epoch(2)
    assert sampler.cycle == 0
    # A restore in the middle of cycle 1 continues that cycle, and the next restart is cycle 2.
    middle = ResumableSampler(range(40), num_replicas=2, rank=0, seed=7, batch_size=4, passes="cycle")
    middle.set_epoch(1)
    list(middle)
    next(iter(middle))  # cycle 1 has started
    restored = ResumableSampler(range(40), num_replicas=2, rank=0, seed=7, batch_size=4, passes="cycle")
    restored.load_state_dict(middle.state_dict(2))
    assert list(restored) == cycles[1][8:]
    assert list(restored) == cycles[2]


def test_an_abandoned_pass_is_not_a_cycle() -> None:
    """A pass left before its end (a discarded iterator) does not advance the cycle."""
    sampler = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4)
    first = iter(sampler)
    next(first)
    assert list(sampler) == list(ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4))


def test_an_iterator_created_but_never_advanced_does_not_use_up_the_restore() -> None:
    """torch's multi-worker iterator calls iter(sampler) twice and iterates only the second."""
    sampler = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4)
    restored = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4)
    restored.load_state_dict(sampler.state_dict(3))
    iter(restored)  # the discarded one
    assert list(iter(restored)) == list(sampler)[12:]


def test_passes_of_one_epoch_repeat_its_order_as_distributed_samplers_do() -> None:
    """Each pass of an epoch once drew a fresh order (the cycle key): list(s) + list(s) was not reproducible."""
    sampler = ResumableSampler(range(40), num_replicas=2, rank=0, seed=7, batch_size=4)
    sampler.set_epoch(1)
    reference = DistributedSampler(range(40), num_replicas=2, rank=0, seed=7)  # type: ignore[arg-type]
    reference.set_epoch(1)
    assert list(reference) == list(reference), "DistributedSampler's contract"
    first = list(sampler)
    assert list(sampler) + list(sampler) == first + first
    assert sampler.data_state().cycle == 0


def test_passes_read_once_yield_nothing_after_one_restored_inside_the_epoch() -> None:
    """A loader among several in max_size mode is read once per epoch: a pass after one restored inside it yields
    nothing; a pass after one begun at the epoch's start reads it again (Lightning's reload makes an iterator it never
    reads, whose workers may prefetch a short loader's whole pass, then the one it trains from)."""
    sampler = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4, passes="once")
    first = list(sampler)
    assert len(first) == 20 and list(sampler) == first
    restored = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4, passes="once")
    restored.load_state_dict(sampler.state_dict(2))
    assert list(restored) == first[8:] and list(restored) == []
    sampler.set_epoch(1)
    assert len(list(sampler)) == 20


@pytest.mark.parametrize("passes", ["repeat", "cycle", "once"])
def test_a_state_saved_after_the_last_sample_restores_to_its_empty_rest_then_the_pass_after_it(passes: str) -> None:
    """As torchdata's StatefulDistributedSampler: the epoch's empty rest, then the same epoch's next pass (a
    cycle, or nothing for a loader read once), or the epoch set_epoch selects. (A fresh sampler's second pass of a
    loader read once reads the epoch again: a pass begun at its start was never read.)"""
    sampler = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4, passes=passes)  # type: ignore[arg-type]
    sampler.set_epoch(2)
    first_pass = list(sampler)
    second_pass = list(sampler)
    saved = sampler.state_dict(5)
    saved["cycle"] = 0  # saved after the first pass
    restored = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4, passes=passes)  # type: ignore[arg-type]
    restored.load_state_dict(saved)
    restored.set_epoch(2)  # a plain loop resuming at the saved epoch
    assert list(restored) == []
    assert list(restored) == ([] if passes == "once" else second_pass)  # once: the rest was its one pass
    assert (second_pass == first_pass) == (passes in ("repeat", "once"))  # once: a pass from the start is read again
    restored.load_state_dict(saved)
    restored.set_epoch(3)
    fresh = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4)
    fresh.set_epoch(3)
    assert list(restored) == list(fresh)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_inside_a_stateful_dataloader_a_state_after_the_epochs_end_restores_to_a_whole_pass(num_workers: int) -> None:
    """The same state, the same stream, whatever the number of workers (0 workers once gave an empty pass)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> StatefulDataLoader:
        sampler = ResumableSampler(range(20), num_replicas=2, rank=0, seed=3, batch_size=2)
        return StatefulDataLoader(list(range(20)), batch_size=2, sampler=sampler, num_workers=num_workers)

    running = loader()
    passes = [[batch.tolist() for batch in running] for _ in range(2)]
    restored = loader()
    restored.load_state_dict(running.state_dict())
    assert passes[0] == passes[1]
    assert [batch.tolist() for batch in restored] == passes[0]


def test_sample_keys_pair_each_index_with_a_seed_of_its_global_position() -> None:
    """The same position gets the same seed on any world size; padded repeats of an index get their own."""
    seeds_by_position: dict[int, tuple[int, int]] = {}
    for world_size in (1, 2, 3):
        for rank in range(world_size):
            keyed = ResumableSampler(range(10), world_size, rank, seed=4, sample_keys=True)
            plain = ResumableSampler(range(10), world_size, rank, seed=4)
            keyed.set_epoch(1)
            plain.set_epoch(1)
            keys = list(keyed)
            assert [index for index, _ in keys] == list(plain)
            for step, key in enumerate(keys):
                position = rank + step * world_size
                assert seeds_by_position.setdefault(position, key) == key
    seeds = [seed for _, seed in seeds_by_position.values()]
    assert len(seeds_by_position) == 12  # 10 positions and the two of W=3's padding
    assert len(set(seeds)) == len(seeds)
    assert seeds_by_position[10][0] == seeds_by_position[0][0]  # padding repeats an index...
    assert seeds_by_position[10][1] != seeds_by_position[0][1]  # ...under another seed


def test_sample_seeds_change_with_the_epoch_and_the_seed() -> None:
    def seeds(seed: int, epoch: int) -> list[int]:
        sampler = ResumableSampler(range(50), 1, 0, seed=seed, shuffle=False, sample_keys=True)
        sampler.set_epoch(epoch)
        return [key[1] for key in sampler]

    assert seeds(1, 0) == seeds(1, 0)
    assert not set(seeds(1, 0)) & set(seeds(1, 1))
    assert not set(seeds(1, 0)) & set(seeds(2, 0))
    assert all(0 <= seed < 2**63 for seed in seeds(1, 0))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"shuffle": False}, "shuffle"), ({"drop_last": True}, "drop_last"), ({"batch_size": 8}, "batch_size")],
)
def test_incompatible_setup_is_refused(kwargs: dict[str, object], named: str) -> None:
    state = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4).state_dict()
    restored = ResumableSampler(range(40), num_replicas=2, rank=0, **{"batch_size": 4, **kwargs})  # type: ignore[arg-type]
    with pytest.raises(IncompatibleStateError, match=named):
        restored.load_state_dict(state)


def test_dataset_of_another_size_is_refused() -> None:
    state = ResumableSampler(range(40), num_replicas=2, rank=0).state_dict()
    with pytest.raises(IncompatibleStateError, match="dataset_size: checkpoint 40, now 41"):
        ResumableSampler(range(41), num_replicas=2, rank=0).load_state_dict(state)


def test_consumed_batches_before_the_restored_position_are_refused() -> None:
    sampler = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4)
    restored = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4)
    restored.load_state_dict(sampler.state_dict(3))
    with pytest.raises(ValueError, match="cannot be fewer than the restored"):
        restored.data_state(2)


def test_start_at_the_end_of_a_billion_samples_is_cheap() -> None:
    size = 10**9
    sampler = ResumableSampler(range(size), num_replicas=4, rank=3, seed=1, batch_size=32)
    restored = ResumableSampler(range(size), num_replicas=4, rank=3, seed=1, batch_size=32)
    restored.load_state_dict(sampler.state_dict(size // (32 * 4) - 10))
    tail = list(restored)
    assert len(tail) == 10 * 32
    assert all(0 <= index < size for index in tail)
    assert torch.tensor(tail).unique().numel() == len(tail)


def test_an_empty_dataset_yields_nothing() -> None:
    sampler = ResumableSampler(range(0), num_replicas=2, rank=1)
    assert list(sampler) == [] and len(sampler) == 0


def test_a_dataset_beyond_two_to_the_forty_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="up to 2\\*\\*40"):
        ResumableSampler(range(2**40 + 1), num_replicas=1, rank=0)


@pytest.mark.parametrize("sample_keys", [False, True])
def test_batch_indices_are_what_the_pass_hands_out_near_the_frontier_and_far_behind(sample_keys: bool) -> None:
    """Read from the pass's recent chunks where it can, computed from the stream where it cannot."""
    sampler = ResumableSampler(range(5000), num_replicas=3, rank=1, seed=3, batch_size=7, sample_keys=sample_keys)
    sampler.set_epoch(2)
    handed_out = list(sampler)  # the whole pass: early chunks are no longer kept
    indices = [key[0] for key in handed_out] if sample_keys else handed_out
    for batch in (0, 1, 100, len(indices) // 7 - 1, len(indices) // 7):
        assert sampler.batch_indices(batch) == indices[batch * 7 : (batch + 1) * 7]


def test_the_index_path_runs_on_one_thread_and_gives_the_callers_threads_back() -> None:
    """Many small tensor ops paid for intra-op parallelism when loader workers and ranks hold the cores."""
    sampler = ResumableSampler(range(1000), num_replicas=2, rank=0, seed=5, batch_size=4, sample_keys=True)
    seen_threads = []

    class Recording:
        def __init__(self, draws: Any) -> None:
            self.draws = draws

        def __call__(self, *args: Any) -> Any:
            seen_threads.append(torch.get_num_threads())
            return self.draws(*args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.draws, name)

    sampler.draws = Recording(sampler.draws)  # type: ignore[assignment]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        indices = list(sampler)
        sampler.batch_indices(3)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert seen_threads and set(seen_threads) == {1}
    assert [index for index, _ in indices] == list(ResumableSampler(range(1000), 2, 0, seed=5, batch_size=4))


def test_the_anchor_is_where_the_world_size_took_over_and_a_handed_out_count_has_none() -> None:
    """Saved after 3 batches of 4 on 2 processes (position 24) and restored on 1: 2 batches later the
    position is 24 + 2 * 4 and the anchor (24, 3); restored on 2 again, the anchor is kept; a new epoch
    starts from (0, 0). A count of handed-out indices may end inside a batch: it records no anchor."""
    writer = ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=4)
    resized = ResumableSampler(range(40), num_replicas=1, rank=0, batch_size=4)
    resized.load_state_dict(writer.state_dict(3))
    state = resized.data_state(5)
    assert (state.position, state.anchor_position, state.anchor_batches) == (32, 24, 3)
    same = ResumableSampler(range(40), num_replicas=1, rank=0, batch_size=4)
    same.restore(state)
    assert (same.data_state(6).position, same.data_state(6).anchor_position) == (36, 24)
    assert len(list(same)) == 8  # the restored pass
    same.set_epoch(1)
    assert (same.data_state(1).position, same.data_state(1).anchor_position) == (4, 0)
    iterator = iter(same)
    next(iterator)
    assert (same.data_state().position, same.data_state().anchor_position) == (1, None)


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_plain_loop_that_saves_at_the_epochs_last_sample_trains_nothing_twice(world_size: int) -> None:
    """A DistributedSampler loop: iterate to the epoch's last sample (the iterator not exhausted), save,
    restore, ``set_epoch`` of the same epoch: the rest of the epoch is empty, as with torchdata's
    StatefulDistributedSampler (the whole epoch again before: a loop saving after every step trained it twice)."""
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    for make in (ResumableSampler, StatefulDistributedSampler):
        for rank in range(world_size):
            sampler = make(range(12), num_replicas=world_size, rank=rank, seed=5)  # type: ignore[operator]
            sampler.set_epoch(1)
            iterator = iter(sampler)
            taken = [next(iterator) for _ in range(len(sampler))]
            assert len(taken) == 12 // world_size
            state = sampler.state_dict()
            restored = make(range(12), num_replicas=world_size, rank=rank, seed=5)  # type: ignore[operator]
            restored.load_state_dict(state)
            restored.set_epoch(1)  # the loop's epoch (ours is in the state too: state["epoch"] == 1)
            assert list(restored) == [], f"{make.__name__} rank {rank}: the epoch's rest is empty"


@pytest.mark.parametrize("new_batch_size", [6, 3, 1])
def test_a_state_restored_with_another_batch_size_reads_the_rest_of_the_epoch_from_its_global_position(
    new_batch_size: int,
) -> None:
    """Where the owner allows it (a single map-style loader): the same global stream, split as before across the
    ranks, in batches of the new size; the trainer's count goes on from the saved one."""
    saving = [ResumableSampler(range(40), num_replicas=2, rank=rank, seed=3, batch_size=4) for rank in (0, 1)]
    order = [index for pair in zip(*(list(sampler) for sampler in saving), strict=True) for index in pair]
    state = saving[0].data_state(batches=3)  # 3 batches of 4 on 2 ranks: global position 24
    assert state.position == 24
    resumed = [
        ResumableSampler(range(40), num_replicas=2, rank=rank, seed=0, batch_size=new_batch_size) for rank in (0, 1)
    ]
    for sampler in resumed:
        sampler.restore(state, batch_size_may_change=True)
    rest = [list(sampler) for sampler in resumed]
    assert [index for pair in zip(*rest, strict=True) for index in pair] == order[24:]
    assert len(resumed[0]) == 3 * new_batch_size + 8  # the 3 batches before, in the new units, and 8 samples left
    after_one = resumed[0].data_state(batches=4)
    assert (after_one.position, after_one.batch_size) == (24 + 2 * new_batch_size, new_batch_size)
    assert (after_one.anchor_position, after_one.anchor_batches) == (24, 3)
    with pytest.raises(IncompatibleStateError, match=f"batch_size: checkpoint 4, now {new_batch_size}"):
        ResumableSampler(range(40), num_replicas=2, rank=0, batch_size=new_batch_size).load_state_dict(state.to_dict())

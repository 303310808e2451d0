"""The standard samplers' distributions, drawn counter-based, so any position restores in O(1)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

from lightning_resumable import IncompatibleStateError, ResumableSampler
from lightning_resumable.core.draws import (
    Draws,
    Permutation,
    RepeatedPermutation,
    SubsetPermutation,
    UniformDraws,
    WeightedDraws,
)
from lightning_resumable.readers.build import make_resumable

CHI_SQUARE_999: dict[int, float] = {4: 18.47, 5: 20.52, 9: 27.88}
"""The chi-square distribution's 99.9% quantile by degrees of freedom: a correct sampler exceeds it
in 1 run of 1,000, and the seeds here are fixed, so the test is not flaky."""


def stream(draws: Draws, epoch: int = 0, seed: int = 11) -> list[int]:
    return draws(seed, epoch, torch.arange(draws.length)).tolist()


def chi_square(counts: Counter[int], probabilities: dict[int, float], total: int) -> float:
    return sum((counts[index] - total * p) ** 2 / (total * p) for index, p in probabilities.items())


def test_uniform_draws_with_replacement_are_uniform() -> None:
    draws = UniformDraws(10, 100_000)
    counts = Counter(stream(draws))
    assert set(counts) == set(range(10))
    assert chi_square(counts, dict.fromkeys(range(10), 0.1), 100_000) < CHI_SQUARE_999[9]
    assert len(set(stream(draws)[:20])) < 20, "with replacement, repeats happen"


def test_weighted_draws_follow_the_weights_and_never_draw_a_zero_weight() -> None:
    weights = [0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0]
    counts = Counter(stream(WeightedDraws(weights, 100_000)))
    assert set(counts) == {1, 2, 4, 5}, "zero-weight samples are never drawn"
    expected = {index: weight / 10 for index, weight in enumerate(weights) if weight}
    assert chi_square(counts, expected, 100_000) < CHI_SQUARE_999[4]


def test_weighted_draws_without_replacement_draw_each_positive_weight_once_first_by_weight() -> None:
    weights = [5.0, 0.0, 1.0, 3.0, 0.0, 1.0]
    draws = WeightedDraws(weights, 4, replacement=False)
    firsts = Counter()
    for epoch in range(4000):
        order = stream(draws, epoch)
        assert sorted(order) == [0, 2, 3, 5]
        firsts[order[0]] += 1
    expected = {0: 0.5, 2: 0.1, 3: 0.3, 5: 0.1}  # the first draw is proportional to the weight
    assert chi_square(firsts, expected, 4000) < CHI_SQUARE_999[4]


def test_without_replacement_more_draws_than_positive_weights_is_refused() -> None:
    with pytest.raises(ValueError, match="need as many positive weights"):
        WeightedDraws([1.0, 0.0, 1.0], 3, replacement=False)


def test_a_subset_is_permuted_each_epoch_and_nothing_outside_it_is_drawn() -> None:
    subset = [3, 17, 4, 99, 50]
    draws = SubsetPermutation(subset, dataset_size=100)
    orders = [stream(draws, epoch) for epoch in range(5)]
    assert all(sorted(order) == sorted(subset) for order in orders)
    assert len({tuple(order) for order in orders}) > 1


def test_num_samples_without_replacement_are_whole_permutations_then_the_head_of_one() -> None:
    order = stream(RepeatedPermutation(7, 17))
    assert sorted(order[:7]) == sorted(order[7:14]) == list(range(7)) and order[:7] != order[7:14]
    assert len(set(order[14:])) == 3


DRAWS = [
    Permutation(23),
    Permutation(23, shuffle=False),
    RepeatedPermutation(23, 40),
    UniformDraws(23, 31),
    WeightedDraws([float(i % 4) for i in range(23)], 29),
    WeightedDraws([float(i % 4) for i in range(23)], 12, replacement=False),
    SubsetPermutation(list(range(0, 23, 2)), dataset_size=23),
]


@settings(max_examples=60, deadline=None)
@given(
    kind=st.integers(0, len(DRAWS) - 1),
    world_size=st.integers(1, 4),
    new_world_size=st.integers(1, 4),
    stop_fraction=st.floats(0, 0.99),
    epoch=st.integers(0, 3),
)
def test_a_restore_at_any_position_continues_the_global_stream(
    kind: int, world_size: int, new_world_size: int, stop_fraction: float, epoch: int
) -> None:
    """On any world size, the ranks' restored streams together are the rest of the global stream."""
    draws = DRAWS[kind]
    global_stream = stream(draws, epoch, seed=5)
    writer = ResumableSampler(range(23), world_size, 0, seed=5, batch_size=2, draws=draws)
    writer.set_epoch(epoch)
    consumed = int(stop_fraction * (len(writer) // 2))
    state = writer.state_dict(consumed)
    position = state["position"]
    rest: dict[int, int] = {}
    for rank in range(new_world_size):
        restored = ResumableSampler(range(23), new_world_size, rank, seed=0, batch_size=2, draws=draws)
        restored.load_state_dict(state)
        for step, index in enumerate(restored):
            rest.setdefault(position + rank + step * new_world_size, index)
    assert [rest[p] for p in range(position, draws.length)] == global_stream[position:]


def test_the_sampler_takes_its_shuffle_from_the_draws() -> None:
    assert ResumableSampler(range(9), 1, 0, shuffle=False, draws=UniformDraws(9, 9)).shuffle is True
    assert ResumableSampler(range(9), 1, 0, draws=Permutation(9, shuffle=False)).shuffle is False


def test_a_checkpoint_of_other_weights_is_refused() -> None:
    state = ResumableSampler(range(4), 1, 0, draws=WeightedDraws([1.0, 2.0, 3.0, 4.0], 8)).state_dict()
    restored = ResumableSampler(range(4), 1, 0, draws=WeightedDraws([1.0, 2.0, 3.0, 5.0], 8))
    with pytest.raises(IncompatibleStateError, match=r"draws: checkpoint 'weighted-with-replacement\(num_samples=8"):
        restored.load_state_dict(state)


@pytest.mark.parametrize(
    ("sampler", "expected"),
    [
        (RandomSampler(range(10), replacement=True, num_samples=25), "uniform-with-replacement(num_samples=25)"),
        (RandomSampler(range(10), num_samples=25), "repeated-permutation(num_samples=25)"),
        (RandomSampler(range(10)), "permutation"),
        (WeightedRandomSampler([1.0] * 10, 6, replacement=False), "weighted-without-replacement(num_samples=6"),
        (SubsetRandomSampler([1, 5, 7]), "subset-permutation(size=3"),
    ],
)
def test_the_mixin_converts_each_standard_sampler(sampler: Any, expected: str) -> None:
    loader = make_resumable(DataLoader(range(10), batch_size=2, sampler=sampler), seed=1, num_replicas=2, rank=0)
    assert isinstance(loader.sampler, ResumableSampler)
    assert loader.sampler.draws.describe().startswith(expected)
    assert loader.sampler.stream_length == len(sampler)

"""The epoch order is a well-mixed bijection that is a pure function of (seed, epoch)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_resumable import EpochOrder
from lightning_resumable.core.order import MAX_SIZE, orders_at, round_keys


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 5000), seed=st.integers(-(2**63), 2**63 - 1), epoch=st.integers(0, 10**6))
def test_order_is_a_bijection_of_the_dataset(size: int, seed: int, epoch: int) -> None:
    indices = EpochOrder(size, seed, epoch)(torch.arange(size))
    assert sorted(indices.tolist()) == list(range(size))


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 255, 256, 257, 65535, 65536, 65537])
def test_order_is_a_bijection_at_square_and_power_of_two_boundaries(size: int) -> None:
    indices = EpochOrder(size, seed=3, epoch=1)(torch.arange(size))
    assert torch.equal(indices.sort().values, torch.arange(size))


def test_order_is_a_pure_function_of_seed_and_epoch() -> None:
    positions = torch.arange(1000)
    assert torch.equal(EpochOrder(1000, 5, 2)(positions), EpochOrder(1000, 5, 2)(positions))
    assert not torch.equal(EpochOrder(1000, 5, 2)(positions), EpochOrder(1000, 5, 3)(positions))
    assert not torch.equal(EpochOrder(1000, 5, 2)(positions), EpochOrder(1000, 6, 2)(positions))


def test_any_slice_of_positions_matches_the_whole_order() -> None:
    order = EpochOrder(10_007, seed=11, epoch=4)
    whole = order(torch.arange(10_007))
    assert torch.equal(order(torch.arange(5000, 6000, 3)), whole[5000:6000:3])
    assert order.index_at(9999) == int(whole[9999])


def test_unshuffled_order_is_the_identity() -> None:
    assert EpochOrder(50, seed=1, epoch=7, shuffle=False)(torch.arange(50)).tolist() == list(range(50))


def test_largest_size_maps_into_range_without_overflow() -> None:
    order = EpochOrder(MAX_SIZE, seed=1, epoch=0)
    positions = torch.tensor([0, 1, MAX_SIZE // 2, MAX_SIZE - 1])
    indices = order(positions)
    assert bool(((indices >= 0) & (indices < MAX_SIZE)).all())
    assert len(set(indices.tolist())) == 4


@pytest.mark.parametrize("size", [0, MAX_SIZE + 1])
def test_size_outside_the_supported_range_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="between 1 and 2"):
        EpochOrder(size, seed=0, epoch=0)


def chi_square(counts: list[int]) -> float:
    expected = sum(counts) / len(counts)
    return sum((count - expected) ** 2 / expected for count in counts)


def test_position_of_a_fixed_element_is_uniform_across_seeds() -> None:
    """Chi-square over 4000 seeds, 20 positions: 19 degrees of freedom, p = 0.001 critical value 43.8."""
    size, seeds = 20, 4000
    counts = [0] * size
    for seed in range(seeds):
        indices = EpochOrder(size, seed, epoch=0)(torch.arange(size))
        counts[int((indices == 0).nonzero())] += 1
    assert chi_square(counts) < 43.8


def test_element_at_a_fixed_position_is_uniform_across_epochs() -> None:
    size, epochs = 37, 3700
    counts = [0] * size
    for epoch in range(epochs):
        counts[EpochOrder(size, seed=9, epoch=epoch).index_at(5)] += 1
    assert chi_square(counts) < 73.4  # 36 degrees of freedom, p = 0.001


def test_adjacent_positions_are_not_correlated() -> None:
    size = 100_000
    indices = EpochOrder(size, seed=123, epoch=0)(torch.arange(size)).double()
    correlation = torch.corrcoef(torch.stack([indices[:-1], indices[1:]]))[0, 1].item()
    # For independent draws the correlation is about N(0, 1/sqrt(n)): 5 sigma is 0.016.
    assert abs(correlation) < 5 / math.sqrt(size)
    steps = (indices[1:] - indices[:-1]).abs()
    # |U1 - U2| of two independent uniforms has mean 1/3 of the range.
    assert abs(steps.mean().item() / size - 1 / 3) < 0.01


@pytest.mark.parametrize("size", [1000, 123_457])
def test_differences_of_adjacent_indices_are_uniform(size: int) -> None:
    """An affine-like order (index = a * position + b) has constant differences; a shuffle does not."""
    indices = EpochOrder(size, seed=8, epoch=2)(torch.arange(size))
    differences = (indices[1:] - indices[:-1]) % size
    buckets = torch.bincount(differences * 20 // size, minlength=20).tolist()
    assert chi_square(buckets) < 43.8  # 19 degrees of freedom, p = 0.001


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 2**40), st.integers(0, 2**63 - 1), st.integers(0, 50)), min_size=1, max_size=12)
)
def test_many_orders_in_one_pass_equal_each_epoch_order(orders: list[tuple[int, int, int]]) -> None:
    """`orders_at` (a mixture's passes, every source at once) draws what each `EpochOrder` draws alone."""
    sizes = [size for size, _, _ in orders] + [1, 4, 9, 10**12]  # a single sample; squares; a large one
    seeds = [seed for _, seed, _ in orders] + [3, 5, 7, 11]
    epochs = [epoch for _, _, epoch in orders] + [0, 1, 2, 3]
    positions = [(seed * 7919 + epoch) % size for size, seed, epoch in zip(sizes, seeds, epochs, strict=True)]
    keys = torch.tensor([round_keys(seed, epoch) for seed, epoch in zip(seeds, epochs, strict=True)])
    drawn = orders_at(torch.tensor(positions), torch.tensor(sizes), keys).tolist()
    each = [
        EpochOrder(size, seed, epoch).index_at(position)
        for size, seed, epoch, position in zip(sizes, seeds, epochs, positions, strict=True)
    ]
    assert drawn == each

"""The interleave of a mixture's sources: exact realised weights, Tijdeman's bounds, O(1) counts equal to a replay."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_resumable import MixtureError
from lightning_resumable.core.interleave import MAX_PERIOD, Interleave, prefix_bound, realised_parts, window_bound

from .helpers import replayed_interleave


def worst_prefix(parts: list[int], order: list[int]) -> Fraction:
    period, counts, worst = sum(parts), [0] * len(parts), Fraction(0)
    for offset, source in enumerate(order, start=1):
        counts[source] += 1
        worst = max(worst, *(abs(counts[i] - Fraction(parts[i] * offset, period)) for i in range(len(parts))))
    return worst


def worst_window(parts: list[int], order: list[int]) -> float:
    period, sources = sum(parts), torch.tensor(order)
    worst = 0.0
    for i, part in enumerate(parts):
        cumulative = torch.cat([torch.zeros(1), torch.cumsum((sources == i).double(), 0)])
        for length in range(1, len(order) + 1):
            counts = cumulative[length:] - cumulative[:-length]
            worst = max(worst, float((counts - part * length / period).abs().max()))
    return worst


parts_strategy = st.lists(st.integers(0, 40), min_size=1, max_size=8).filter(lambda parts: sum(parts) > 0)


@settings(max_examples=150, deadline=None)
@given(parts_strategy, st.integers(0, 500))
def test_the_table_names_the_replayed_source_and_its_count_at_any_offset(parts: list[int], start: int) -> None:
    period = sum(parts)
    order = replayed_interleave(parts, start + 2 * period)
    table = Interleave(parts)
    offsets = torch.arange(start, start + 2 * period)
    sources, before = table.at(offsets)
    assert sources.tolist() == order[start:]
    pairs = zip(offsets.tolist(), order[start:], strict=True)
    assert before.tolist() == [order[:offset].count(source) for offset, source in pairs]
    assert table.counts(start) == [order[:start].count(i) for i in range(len(parts))]


@settings(max_examples=150, deadline=None)
@given(parts_strategy)
def test_every_prefix_keeps_tijdemans_bound(parts: list[int]) -> None:
    """Periodic: one period holds every prefix there is."""
    order = Interleave(parts).sources.tolist()
    assert worst_prefix(parts, order) <= Fraction(prefix_bound(sum(1 for part in parts if part))).limit_denominator()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=6).filter(lambda parts: sum(parts) > 0))
def test_every_window_keeps_twice_the_bound(parts: list[int]) -> None:
    order = Interleave(parts).sources.tolist() * 2  # every window of the periodic sequence starts in one period
    assert worst_window(parts, order) <= window_bound(sum(1 for part in parts if part)) + 1e-9


def test_two_sources_are_within_one_in_every_window() -> None:
    for parts in itertools.product(range(1, 12), repeat=2):
        assert worst_window(list(parts), Interleave(parts).sources.tolist() * 2) <= 1 + 1e-9, parts


def test_within_one_in_every_window_is_impossible_for_weights_8_2_1() -> None:
    """Why the bound for three sources or more is under 2 and not 1: no sequence of ten draws from weights
    8/11, 2/11, 1/11 keeps every source within 1 of its share in every window (exhaustive search)."""
    weights = [Fraction(8, 11), Fraction(2, 11), Fraction(1, 11)]

    def extendable(sequence: list[int]) -> bool:
        if len(sequence) == 10:
            return True
        for source in range(3):
            grown = [*sequence, source]
            if all(
                abs(grown[start:].count(i) - weights[i] * (len(grown) - start)) <= 1
                for start in range(len(grown))
                for i in range(3)
            ) and extendable(grown):
                return True
        return False

    assert not extendable([])
    assert worst_window([8, 2, 1], Interleave([8, 2, 1]).sources.tolist() * 2) <= window_bound(3)


def test_weights_are_realised_exactly_where_a_small_denominator_holds_them() -> None:
    assert realised_parts([("web", 0.6), ("code", 0.3), ("books", 0.1)]) == ((6, 3, 1), 10)
    assert realised_parts([("a", 5), ("b", 3), ("c", 2)]) == ((5, 3, 2), 10)
    assert realised_parts([("a", 1), ("b", 1), ("c", 1)]) == ((1, 1, 1), 3)
    assert realised_parts([("a", 1 / 3), ("b", 1 / 3), ("c", 1 / 3)]) == ((1, 1, 1), 3)
    assert realised_parts([("a", 0.7), ("b", 0), ("c", 0.3)]) == ((7, 0, 3), 10)


def test_weights_without_a_small_denominator_are_rounded_to_the_longest_period() -> None:
    weights = [("a", math.pi), ("b", math.e), ("c", 1e-9), ("d", 1.0)]
    parts, period = realised_parts(weights)
    total = sum(weight for _, weight in weights)
    assert period == MAX_PERIOD and sum(parts) == period
    assert parts[2] == 1, "a positive weight keeps a part"
    for (_, weight), part in zip(weights[:2] + weights[3:], parts[:2] + parts[3:], strict=True):
        assert abs(part / period - weight / total) <= 1 / period


@pytest.mark.parametrize(
    ("weight", "message"),
    [(-1, "must not be negative"), (float("nan"), "must be finite"), (float("inf"), "must be finite"), ("x", "number")],
)
def test_a_weight_that_is_not_a_non_negative_number_is_refused(weight: object, message: str) -> None:
    with pytest.raises(MixtureError, match=message):
        realised_parts([("a", 1), ("bad", weight)])


def test_no_positive_weight_is_refused() -> None:
    with pytest.raises(MixtureError, match="positive weight"):
        realised_parts([("a", 0), ("b", 0.0)])


def test_the_longest_period_with_eight_sources_returns_every_count_to_its_part() -> None:
    """A table is built once per weights and process; the largest holds 16384 offsets (its cost: benchmarks/)."""
    table = Interleave([MAX_PERIOD // 8] * 7 + [MAX_PERIOD - 7 * (MAX_PERIOD // 8)])
    assert table.period == MAX_PERIOD and table.counts(MAX_PERIOD) == list(table.parts)

"""The window shuffle of `lightning_resumable.core.window_shuffle`: every sample once, a resume from the
place after any sample continues the same order, and re-reads at most one window."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_resumable import IncompatibleStateError
from lightning_resumable.core.window_shuffle import fresh_place, read_shuffled, window_order


class Shard:
    """A list read in order, counting what it reads; its position is the index of the next item."""

    def __init__(self, items: list[int]) -> None:
        self.items, self.next, self.reads = items, 0, 0

    def open(self, position: Any) -> Iterator[int]:
        self.next = 0 if position is None else position
        while self.next < len(self.items):
            self.reads += 1
            self.next += 1
            yield self.items[self.next - 1]

    def position(self) -> Any:
        return self.next


def shards_of(sizes: list[int]) -> list[Shard]:
    first = [sum(sizes[:n]) for n in range(len(sizes))]
    return [Shard(list(range(start, start + size))) for start, size in zip(first, sizes, strict=True)]


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 30), min_size=1, max_size=5), size=st.integers(1, 12), key=st.integers(0, 2**63))
def test_every_cut_resumes_the_same_order_reading_at_most_one_window(sizes: list[int], size: int, key: int) -> None:
    place = fresh_place(len(sizes))
    full = list(read_shuffled(shards_of(sizes), size, key, place))
    assert sorted(full) == list(range(sum(sizes)))
    for cut in range(len(full) + 1):
        place = fresh_place(len(sizes))
        reader = read_shuffled(shards_of(sizes), size, key, place)
        head = [next(reader) for _ in range(cut)]
        saved = copy.deepcopy(place)
        resumed = shards_of(sizes)
        tail = list(read_shuffled(resumed, size, key, saved))
        assert head + tail == full
        re_read = sum(shard.reads for shard in resumed) - len(tail)
        assert 0 <= re_read <= size - 1, "a restore reads at most the window's samples already yielded"


def test_shards_are_read_side_by_side_and_windows_permuted() -> None:
    place = fresh_place(2)
    order = list(read_shuffled(shards_of([8, 8]), 4, 1, place))
    windows = [order[n : n + 4] for n in range(0, 16, 4)]
    assert [sorted(window) for window in windows] == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    assert windows != [sorted(window) for window in windows], "a window's order is permuted"
    assert window_order(1, 0, 4) != window_order(1, 1, 4) or window_order(1, 0, 4) != window_order(2, 0, 4)


def test_a_place_over_another_number_of_sources_is_refused_unless_at_the_start() -> None:
    """A pass's start is the same over any number of sources (a worker that had not read when its state was
    taken holds the start as its dataset was built, before its shards were known)."""
    assert len(list(read_shuffled(shards_of([4, 4]), 4, 1, fresh_place(3)))) == 8
    with pytest.raises(IncompatibleStateError, match="reads 3 groups of shards side by side, this stream 2"):
        next(read_shuffled(shards_of([4, 4]), 4, 1, {**fresh_place(3), "window": 1}))

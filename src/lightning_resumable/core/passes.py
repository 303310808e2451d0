"""A sampler's pass over its indices, with torchdata's iterator protocol.

torchdata's ``StatefulDataLoader`` restores a sampler, then at once makes a pass and loads the same
state into it; if the saved iterator had run out, it drops that pass and makes another. A pass that
knows its restore tells the two end-of-epoch states apart: the restored pass yields the rest of the
epoch (nothing, after its last batch), a pass made instead of it starts after it.
"""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

__all__ = ["HandedOut", "SamplerPass"]


class HandedOut:
    """What one pass has handed out: the count, exact to the index and free on the hot path, and its
    last chunks (what the trainer trains now was handed out in one of them: workers prefetch only a
    few batches). A pass has its own: a copy of the sampler (a peek) keeps the old one's."""

    def __init__(self, of: tuple[int, int] | None = None) -> None:
        self.of = of  # (epoch, origin position) of the pass, if it has begun
        self._current: tuple[int, int, Iterator[Any]] = (0, 0, iter(()))  # handed out before it, size, iterator
        self._recent: collections.deque[tuple[int, list[Any]]] = collections.deque(maxlen=3)

    def add(self, chunk: list[Any]) -> Iterator[Any]:
        """The iterator that hands out ``chunk``, the pass's next."""
        before, size, _ = self._current
        iterator = iter(chunk)
        self._current = (before + size, len(chunk), iterator)
        self._recent.append((before + size, chunk))
        return iterator

    def count(self) -> int:
        before, size, iterator = self._current
        return before + size - operator.length_hint(iterator)

    def end(self) -> int:
        """The elements of all chunks so far, handed out or not."""
        before, size, _ = self._current
        return before + size

    def cut(self, end: int) -> None:
        """Hand out nothing from the ``end``-th element of the pass on (its chunk was computed before the
        stream changed there; the pass computes the rest anew). Elements handed out already stay."""
        before, size, iterator = self._current
        if not self.count() <= end < before + size:
            raise ValueError(f"cannot cut the pass at {end}: {self.count()} handed out, {before + size} computed")
        del self._recent[-1][1][end - before :]  # the current chunk, whose iterator reads on to its new end
        self._current = (before, end - before, iterator)

    def find(self, first: int, size: int) -> list[Any] | None:
        """The ``size`` elements handed out from the ``first``-th on, if a recent chunk holds them all."""
        for before, chunk in self._recent:
            start = first - before
            if start >= 0 and start + size <= len(chunk):
                return chunk[start : start + size]
        return None


class SamplerPass(itertools.chain[Any]):
    """One pass's indices, handed out at C speed: the chain drains the chunk iterators its sampler
    computes one at a time (so the sampler's count of indices handed out stays exact).

    Args:
        chunks: the pass's chunks of indices.
        state_dict: the sampler's state (a pass has none of its own).
        restore_this_pass: restores the sampler to a state for this pass only.
    """

    _state_dict: Callable[[], dict[str, Any]]
    _restore_this_pass: Callable[[Mapping[str, Any]], None]

    def __new__(
        cls,
        chunks: Iterator[Iterator[Any]],
        state_dict: Callable[[], dict[str, Any]],
        restore_this_pass: Callable[[Mapping[str, Any]], None],
    ) -> SamplerPass:
        made = cast(SamplerPass, super().from_iterable(chunks))  # from_iterable makes a cls
        made._state_dict, made._restore_this_pass = state_dict, restore_this_pass
        return made

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state."""
        return self._state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the sampler to ``state`` for this pass: a pass made after it starts after the restored one."""
        self._restore_this_pass(state)

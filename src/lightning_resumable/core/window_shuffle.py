"""A stream's shuffle that resumes from a few integers: shards read side by side, windows permuted.

Promise: the order a worker yields its stream in is a pure function of (key, the samples its shards
hold): ``k`` sequential sources (groups of shards) are read round-robin, the interleaved stream is cut
into windows of ``size`` samples, and each window is yielded in a keyed permutation. The place in a
pass (`WindowPlace`) is the window's number, the samples of it yielded, the round-robin cursor and each
source's position at the window's start: a restore re-reads at most one window (``size`` samples),
never more, and holds no sample.

This replaces a shuffle buffer (Hugging Face's ``.shuffle(seed, buffer_size)``, WebDataset's
``.shuffle(n)``), whose contents a resume would need: with ``k >= 2`` the order mixes at least as
well as the buffer of the same size (benchmarks/stream_shuffle.py; docs/performance.md): a sample
moves across shards, not ``size`` places, and neighbours come from one shard about ``1/k`` of the time.
Samples read into a window are seeded by their place in it (``seed_reads``), so what a ``map`` draws
before the shuffle is the same when a restore reads the window again.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any, Protocol

import torch

from lightning_resumable.core import randomness
from lightning_resumable.core.order import EpochOrder
from lightning_resumable.errors import IncompatibleStateError
from lightning_resumable.format._keys import Domain, domain_key

__all__ = [
    "INTERLEAVED_SOURCES",
    "SequentialSource",
    "fresh_place",
    "read_shuffled",
    "shuffled_windows",
    "window_order",
]

INTERLEAVED_SOURCES = 4
"""Groups of shards a worker reads side by side: neighbours share a shard about 1/4 of the time."""


class SequentialSource(Protocol):
    """A group of shards read in order, whose position can be taken between samples and opened again."""

    def open(self, position: Any) -> Iterator[Any]:
        """Its samples from ``position`` (``None``: from its start)."""
        ...

    def position(self) -> Any:
        """Where it stands after the samples its open iterator yielded (a small picklable value)."""
        ...


def fresh_place(sources: int) -> dict[str, Any]:
    """The place at a pass's start, over ``sources`` sources: the first window, nothing yielded.

    The per-source values are tuples, replaced whole by a load (``datasets`` merges lists item by item
    into the fresh state, which fails on another count of sources before the worker's own is known)."""
    return {"window": 0, "yielded": 0, "cursor": 0, "sources": (None,) * sources, "ended": (False,) * sources}


def is_fresh(place: MutableMapping[str, Any]) -> bool:
    """Whether ``place`` is a pass's start (nothing read yet)."""
    untouched = all(position is None for position in place["sources"]) and not any(place["ended"])
    return untouched and place["window"] == 0 and place["yielded"] == 0


def window_order(key: int, window: int, size: int) -> list[int]:
    """The order window ``window`` of ``size`` samples is yielded in (a keyed bijection of ``range(size)``)."""
    if size <= 1:
        return list(range(size))
    seed = domain_key(key, Domain.WINDOW, window) >> 1
    order: list[int] = EpochOrder(size, seed, 0)(torch.arange(size)).tolist()
    return order


def read_seed(key: int, window: int, place: int) -> int:
    """The seed the ``place``-th sample read into window ``window`` is read under (below 2**63)."""
    return domain_key(key, Domain.WINDOW, window, place + 1) >> 1


def read_shuffled(
    sources: Sequence[SequentialSource],
    size: int,
    key: int,
    place: MutableMapping[str, Any],
    seed_reads: bool = True,
    read_key: int | None = None,
) -> Iterator[Any]:
    """The samples of ``sources`` in windows of ``size``, each permuted by ``key``, from ``place`` on (updated in
    place before each sample is yielded, so it is always the place after the samples yielded); the reads seeded
    by ``read_key`` (``None``: ``key``).

    Raises:
        IncompatibleStateError: ``place`` was taken over another number of sources.
    """
    for ordered, skip, after in shuffled_windows(sources, size, key, place, seed_reads, read_key):
        for number in range(skip, len(ordered)):
            if number + 1 == len(ordered):
                place.update(after)  # at a window's end: a restore reads nothing again
            else:
                place["yielded"] = number + 1
            yield ordered[number]


def shuffled_windows(
    sources: Sequence[SequentialSource],
    size: int,
    key: int,
    place: MutableMapping[str, Any],
    seed_reads: bool = True,
    read_key: int | None = None,
) -> Iterator[tuple[list[Any], int, dict[str, Any]]]:
    """`read_shuffled`'s windows from ``place`` on, whole: each window's samples in the order they are yielded, how
    many of them ``place`` had yielded already (inside its first window), and the place after the window (``place``
    is read, not updated: its caller updates it as it hands the samples out).

    Raises:
        IncompatibleStateError: ``place`` was taken over another number of sources.
    """
    if is_fresh(place):  # a pass's start, whatever the count it was taken over (a worker yet to read)
        place.update(fresh_place(len(sources)))
    if len(place["sources"]) != len(sources):
        raise IncompatibleStateError(
            f"the shuffle's saved place reads {len(place['sources'])} groups of shards side by side, this stream"
            f" {len(sources)}: its shards or workers differ from the saved run's. Resume with the saved setup"
        )
    reads = key if read_key is None else read_key
    window, cursor = int(place["window"]), int(place["cursor"])
    skip = int(place["yielded"])
    # Not in another thread (datasets' interleave_datasets reads its sources ahead in a pool): the generators are
    # the process's, and the thread that fetches the outer sample draws from them meanwhile.
    seed_reads = seed_reads and threading.current_thread() is threading.main_thread()
    ended = list(place["ended"])
    readers: list[Iterator[Any] | None] = [
        None if done else source.open(position)
        for source, position, done in zip(sources, place["sources"], ended, strict=True)
    ]
    while not all(ended):
        live = [number for number in range(len(sources)) if not ended[number]]
        cursor %= len(live)
        samples: list[Any] = []
        with randomness.inner_samples() if seed_reads else contextlib.nullcontext():
            while len(samples) < size and live:
                number = live[cursor]
                reader = readers[number]
                assert reader is not None
                if seed_reads:
                    randomness.begin_sample(read_seed(reads, window, len(samples)), True)
                try:
                    samples.append(next(reader))
                except StopIteration:
                    ended[number], readers[number] = True, None
                    live.remove(number)
                    cursor = cursor % len(live) if live else 0
                    continue
                finally:
                    randomness.end_sample()
                cursor = (cursor + 1) % len(live)
        after = {
            "window": window + 1,
            "yielded": 0,
            "cursor": cursor,
            "sources": tuple(None if ended[n] else source.position() for n, source in enumerate(sources)),
            "ended": tuple(ended),
        }
        order = window_order(key, window, len(samples))
        yield [samples[index] for index in order], skip, after
        skip, window = 0, window + 1

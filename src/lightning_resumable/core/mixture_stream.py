"""A mixture's stream as a pure function of the stream position: its segments, draws and pass orders.

Promise: the mixture's stream is one sequence of positions (samples of all ranks together, across
epochs). Position ``p`` belongs to a `Segment` (a stretch with constant weights, from a weight
change on); the segment's `Interleave` names the source at ``p`` and how many samples that source
gave before it, so the draw is computed, never replayed. A source's draws run through passes: the
``c``-th draw of a source of ``size`` samples is element ``c % size`` of pass ``c // size``, a
permutation keyed by (seed, the source's name, pass), so within a pass no sample repeats and none is
skipped, whatever the weights did meanwhile, and a source that runs out starts a fresh pass.

At a weight change the interleave starts afresh from the change: its bounds hold within each
segment, so a window across a change keeps each part's (`lightning_resumable.core.interleave`). A
change comes from the schedule or is set by the training (`MixtureStream.add_change`, at a position
no loader has read yet); at one position the training's wins.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import torch

from lightning_resumable.core.chunks import ChunkedPass, Chunks
from lightning_resumable.core.interleave import Interleave, interleave, realised_parts
from lightning_resumable.core.order import orders_at, round_keys
from lightning_resumable.core.schedule import StepClock, Weights, WeightSchedule
from lightning_resumable.errors import MixtureError
from lightning_resumable.format._keys import chunked_pass_seed, mixture_pass_seed

__all__ = ["MixtureStream", "Segment", "realise", "source_key"]


@functools.lru_cache(maxsize=1024)
def source_key(name: str) -> int:
    """A source's 64-bit key: its pass orders depend on its name only, not on the other sources."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Segment:
    """A stretch of the stream with constant weights, from stream position ``start`` on.

    Attributes:
        start: the stream position of the segment's first sample.
        period: the interleave's period (the denominator of the realised weights).
        parts: ``(name, parts of the period)`` of each source drawn, by name.
        counts: ``(name, samples given before start)`` of every source known, by name (a source no
            longer drawn, or removed, keeps its count: brought back, it continues its pass).
    """

    start: int
    period: int
    parts: tuple[tuple[str, int], ...]
    counts: tuple[tuple[str, int], ...]

    @property
    def table(self) -> Interleave:
        return interleave(tuple(part for _, part in self.parts))

    def weights(self) -> dict[str, Fraction]:
        """The realised weight of each source drawn."""
        return {name: Fraction(part, self.period) for name, part in self.parts}

    def counts_at(self, position: int) -> dict[str, int]:
        """Every known source's count before stream ``position`` (at or after ``start``)."""
        counts = dict(self.counts)
        for (name, _), drawn in zip(self.parts, self.table.counts(position - self.start), strict=True):
            counts[name] = counts.get(name, 0) + drawn
        return counts

    def same_weights(self, parts: tuple[tuple[str, int], ...], period: int) -> bool:
        return self.parts == parts and self.period == period


def realise(weights: Weights, sources: Sequence[str], where: str) -> tuple[tuple[tuple[str, int], ...], int]:
    """``weights`` as a segment's parts (the sources drawn, by name) and period.

    Raises:
        MixtureError: a weight for a source the mixture does not hold, a source without a weight, or a
            weight that is not a finite non-negative number.
    """
    if not isinstance(weights, Mapping):
        raise MixtureError(f"the weights {where} must be a mapping from source names to numbers, got {weights!r:.80}")
    unknown, missing = sorted(set(weights) - set(sources)), sorted(set(sources) - set(weights))
    if unknown or missing:
        raise MixtureError(
            f"the weights {where} name sources {sorted(weights)} but the mixture holds {sorted(sources)}:"
            f" {'unknown ' + str(unknown) if unknown else ''}{'; ' if unknown and missing else ''}"
            f"{'no weight for ' + str(missing) + ' (give 0 to leave a source out)' if missing else ''}"
        )
    names = sorted(sources)
    parts, period = realised_parts([(name, weights[name]) for name in names])
    return tuple((name, part) for name, part in zip(names, parts, strict=True) if part > 0), period


@dataclass
class MixtureStream:
    """The stream from ``first`` on: its segment, then the schedule's changes after ``changes_after``.

    Args:
        names, sizes: the mixture's sources in its order (a draw's index is its source's offset in
            that order plus its index in the source).
        seed: the run's seed; shuffle: each pass in a permuted order (else in the source's order).
        first: the segment in force at ``changes_after`` (the run's start, or a resume's).
        schedule, clock: where the weights change later (``None``: never), and at which stream positions.
        chunks: each source's chunks, or ``None`` (by place in ``names``; empty: none chunked): a chunked
            source's pass is read window by window (`lightning_resumable.core.chunks`).

    Changes set by the training (`add_change`) merge with the schedule's: the latest change wins, and at
    one position the training's.
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    seed: int
    shuffle: bool
    first: Segment
    schedule: WeightSchedule | None
    clock: StepClock
    changes_after: int
    chunks: tuple[Chunks | None, ...] = ()
    segments: list[Segment] = field(init=False)

    def __post_init__(self) -> None:
        self.segments = [self.first]
        self.offsets = [0]
        for size in self.sizes[:-1]:
            self.offsets.append(self.offsets[-1] + size)
        self._source_ids = {name: index for index, name in enumerate(self.names)}
        self._sizes = torch.tensor(self.sizes, dtype=torch.int64)
        self._offsets = torch.tensor(self.offsets, dtype=torch.int64)
        self._lookups: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._source_keys = [source_key(name) for name in self.names]
        self._pass_keys: dict[tuple[int, int], list[int]] = {}
        self._chunked_passes: dict[tuple[int, int], ChunkedPass] = {}
        self.chunks = self.chunks or (None,) * len(self.names)
        self._online: list[tuple[int, tuple[tuple[str, int], ...], int]] = []  # (position, parts, period)
        self._online_next = 0  # the first of them not applied yet
        self._schedule_from(self.changes_after)

    def _schedule_from(self, position: int) -> None:
        """Read the schedule's changes after ``position`` (those at or before it are applied, or ignored)."""
        self._changes: Iterator[tuple[int, Weights]] = iter(())
        if self.schedule is not None:
            after = self.clock.point_at(position, self.schedule.unit)
            self._changes = iter(self.schedule.changes_after(after))
        self._next: tuple[int, Weights, int] | None = None  # (position, weights, point) of the next change
        self._advance()

    def _advance(self) -> None:
        found = next(self._changes, None)
        if found is None or self.schedule is None:
            self._next = None
            return
        point, weights = found
        self._next = (self.clock.position_of(point, self.schedule.unit), weights, point)

    def extend_to(self, position: int) -> None:
        """Know every segment that starts at or before ``position``."""
        while True:
            online = self._online[self._online_next] if self._online_next < len(self._online) else None
            if self._next is not None and self._next[0] <= position and (online is None or self._next[0] <= online[0]):
                start, weights, point = self._next
                assert self.schedule is not None
                self._begin(start, *realise(weights, self.names, f"at {self.schedule.unit[:-1]} {point}"))
                self._advance()
            elif online is not None and online[0] <= position:
                self._begin(*online)
                self._online_next += 1
            else:
                return

    def _begin(self, start: int, parts: tuple[tuple[str, int], ...], period: int) -> None:
        """A segment from ``start`` on, unless the weights are those in force already."""
        last = self.segments[-1]
        if not last.same_weights(parts, period):
            if last.start == start and len(self.segments) > 1:  # the schedule's change, overridden there
                self.segments.pop()
                self._lookups.pop(len(self.segments), None)
                last = self.segments[-1]
                if last.same_weights(parts, period):
                    return
            counts = tuple(sorted(last.counts_at(start).items()))
            self.segments.append(Segment(start, period, parts, counts))

    def forget_before(self, position: int) -> None:
        """Drop the segments that end at or before ``position``, which will not be read again (weights set
        every step would otherwise keep one segment a step for the whole run)."""
        keep = bisect.bisect_right([each.start for each in self.segments], position) - 1
        if keep > 0:
            del self.segments[:keep]
            self._lookups.clear()

    def add_change(self, position: int, parts: tuple[tuple[str, int], ...], period: int) -> None:
        """The weights ``parts / period`` from stream ``position`` on (a change set by the training).

        The segments from ``position`` on are worked out again (the caller makes sure no loader has read
        there yet); a later change of the schedule still applies at its place.
        """
        if position <= self.segments[0].start:
            raise ValueError(f"a change at stream position {position} is not after the stream's known start")
        self.extend_to(position - 1)  # every change before it applied
        places = [each[0] for each in self._online]
        at = bisect.bisect_left(places, position)
        self._online[at : at + (at < len(places) and places[at] == position)] = [(position, parts, period)]
        while self.segments[-1].start >= position:
            self.segments.pop()
            self._lookups.pop(len(self.segments), None)
        self._online_next = at
        self._schedule_from(position - 1)

    def segment_at(self, position: int) -> Segment:
        """The segment in force at ``position``."""
        self.extend_to(position)
        return self.segments[bisect.bisect_right([each.start for each in self.segments], position) - 1]

    def draws(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The source (its place in ``names``) of each stream position, and that source's count before it."""
        if positions.numel() == 0:
            return positions.clone(), positions.clone()
        if int(positions.min()) < self.segments[0].start:
            raise ValueError(f"stream positions before {self.segments[0].start} are not this stream's (any longer)")
        self.extend_to(int(positions.max()))
        if len(self.segments) == 1 or int(positions.min()) >= self.segments[-1].start:
            return self._draws_in(len(self.segments) - 1, positions)
        starts = torch.tensor([each.start for each in self.segments], dtype=torch.int64)
        where = torch.searchsorted(starts, positions, right=True) - 1
        sources, counts = torch.empty_like(positions), torch.empty_like(positions)
        for number in torch.unique(where).tolist():
            chosen = where == number
            sources[chosen], counts[chosen] = self._draws_in(number, positions[chosen])
        return sources, counts

    def _draws_in(self, number: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`draws` at positions of segment ``number``."""
        segment = self.segments[number]
        if number not in self._lookups:  # the segment's sources (places in names) and counts at its start
            base = dict(segment.counts)
            self._lookups[number] = (
                torch.tensor([self._source_ids[name] for name, _ in segment.parts], dtype=torch.int64),
                torch.tensor([base.get(name, 0) for name, _ in segment.parts], dtype=torch.int64),
            )
        ids, bases = self._lookups[number]
        local, before = segment.table.at(positions - segment.start)
        return ids[local], bases[local] + before

    def indices(self, positions: torch.Tensor) -> torch.Tensor:
        """The mixture's index (source offset plus index in the source) at each stream position: each
        draw's place in its pass, permuted by its pass's order, all orders in one vectorised pass."""
        if positions.numel() == 0:
            return positions.clone()
        sources, counts = self.draws(positions)
        sizes = self._sizes[sources]
        passes = torch.div(counts, sizes, rounding_mode="floor")
        within = counts - passes * sizes
        if self.shuffle:
            count = len(self.names)
            pairs, which = torch.unique(passes * count + sources, return_inverse=True)  # (source, pass) as one key
            keys = torch.tensor([self.pass_keys(pair % count, pair // count) for pair in pairs.tolist()])
            places, within = within, orders_at(within, sizes, keys[which])
            for number, pair in enumerate(pairs.tolist()):
                if self.chunks[pair % count] is not None:
                    chosen = which == number
                    within[chosen] = self.chunked_pass(pair % count, pair // count)(places[chosen])
        return self._offsets[sources] + within

    def chunked_pass(self, source: int, pass_index: int) -> ChunkedPass:
        """The order of pass ``pass_index`` over the chunked source ``source`` (the last few kept)."""
        if (source, pass_index) not in self._chunked_passes:
            if len(self._chunked_passes) >= 2 * len(self.names):
                del self._chunked_passes[next(iter(self._chunked_passes))]
            chunks, key = self.chunks[source], self._source_keys[source]
            assert chunks is not None
            self._chunked_passes[source, pass_index] = ChunkedPass(
                chunks, functools.partial(chunked_pass_seed, self.seed, key, pass_index)
            )
        return self._chunked_passes[source, pass_index]

    def pass_keys(self, source: int, pass_index: int) -> list[int]:
        """The round keys of pass ``pass_index`` over source ``source``: a pure function of seed, name and pass
        (its order is ``EpochOrder(size, mixture_pass_seed(seed, key of the name, pass), 0)``)."""
        if (source, pass_index) not in self._pass_keys:
            seed = mixture_pass_seed(self.seed, self._source_keys[source], pass_index)
            self._pass_keys[source, pass_index] = round_keys(seed, 0)
        return self._pass_keys[source, pass_index]

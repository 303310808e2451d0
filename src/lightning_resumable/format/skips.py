"""Skipped data: the step ranges a user asks to pass over, and the stretches of the stream they became.

Promise: a `StepRange` is what a user writes (``"40701-40900"``, ``[40701, 40900]``, ``40750``), parsed and
checked here (`step_ranges`); a `Skip` is a range as the checkpoint records it: the steps, and the `Hole`
each left in the stream, a stretch of positions (all ranks together) that no rank reads. Holes are
positions, not steps, so a later resume on another world size keeps the stream's order. Plain ints only.

A hole is given in the positions of the stream as the holes before it left it (each skip's holes after the
earlier skips' holes): a position of the stream the run reads maps to the stream without skips by undoing
the holes from the last to the first (`lightning_resumable.core.skips.to_stream`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from lightning_resumable.errors import SkipError, StateFormatError

__all__ = [
    "Hole",
    "Skip",
    "StepRange",
    "StepRanges",
    "from_stream",
    "hole_of",
    "holes_of",
    "position_in_stream",
    "skips_from_list",
    "step_ranges",
]

StepRanges = Union[str, int, Sequence[Union[str, int, Sequence[int]]], None]  # noqa: UP007  # a runtime alias
"""What a user may give: ``"40701-40900"``, ``"40701-40900,41000-41010"``, a step, ``[first, last]``, a list."""

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


@dataclass(frozen=True, order=True)
class StepRange:
    """Steps ``first`` to ``last``, both included, as the run being resumed numbered them (its ``global_step``)."""

    first: int
    last: int

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    @property
    def steps(self) -> int:
        return self.last - self.first + 1


def _one(item: object) -> list[StepRange]:
    if type(item) is int:
        return [StepRange(item, item)] if item >= 0 else _bad(item)
    if isinstance(item, str):
        found = [_RANGE.match(part) for part in item.split(",")]
        if not all(found):
            _bad(item)
        return [StepRange(int(m.group(1)), int(m.group(2) or m.group(1))) for m in found if m is not None]
    if isinstance(item, (list, tuple)) and len(item) == 2 and all(type(step) is int and step >= 0 for step in item):
        return [StepRange(item[0], item[1])]
    return _bad(item)


def _bad(item: object) -> list[StepRange]:
    raise SkipError(
        f"a skipped range must be 'first-last' (steps, e.g. '40701-40900'), a step, or [first, last] of"
        f" non-negative ints; got {item!r:.100}"
    )


def step_ranges(given: StepRanges) -> tuple[StepRange, ...]:
    """The ranges ``given`` names, sorted.

    Raises:
        SkipError: a malformed or empty range (last before first), or two ranges that overlap.
    """
    if given is None:
        return ()
    items: Iterable[object] = [given] if isinstance(given, (str, int)) else given
    if isinstance(given, (list, tuple)) and len(given) == 2 and all(type(step) is int for step in given):
        items = [given]  # one [first, last] pair
    ranges = sorted(each for item in items for each in _one(item))
    for each in ranges:
        if each.last < each.first:
            raise SkipError(f"the skipped range {each.first}-{each.last} is empty: its last step precedes its first")
    for before, after in itertools.pairwise(ranges):
        if after.first <= before.last:
            raise SkipError(f"the skipped ranges {before} and {after} overlap: give each step once")
    return tuple(ranges)


@dataclass(frozen=True)
class Hole:
    """Positions ``start`` to ``start + length`` of ``epoch``'s stream (``None``: a mixture's one stream across
    epochs), in the stream as the earlier holes left it, that no rank reads.

    A stream's position is its readers' state, not a number: its hole counts one rank's batches, read and
    discarded: ``(None, step, batches)`` before they are (at that step), ``(epoch, batch, batches)`` where they
    were (`lightning_resumable.lightning.stream_owner`)."""

    epoch: int | None
    start: int
    length: int

    def to_list(self) -> list[int | None]:
        return [self.epoch, self.start, self.length]


@dataclass(frozen=True)
class Skip:
    """A skipped step range, as the checkpoint records it: the steps (the resumed run's numbering), the step of
    the recovered run at which its data is passed over (``at``: its first step, less the steps of the ranges
    given with it that come before), and its holes."""

    steps: StepRange
    at: int
    holes: tuple[Hole, ...]

    def to_dict(self) -> dict[str, Any]:
        steps = [self.steps.first, self.steps.last]
        return {"steps": steps, "at": self.at, "holes": [hole.to_list() for hole in self.holes]}

    @classmethod
    def from_dict(cls, raw: object) -> Skip:
        """Parse the recorded form, refusing anything else with a `StateFormatError`."""
        if not isinstance(raw, dict) or set(raw) != {"steps", "at", "holes"}:
            raise StateFormatError(f"a skip must be a dict of 'steps', 'at' and 'holes', got {raw!r:.200}")
        steps, holes, at = raw["steps"], raw["holes"], raw["at"]
        if type(at) is not int or at < 0:
            raise StateFormatError(f"a skip's step 'at' must be a non-negative int, got {at!r:.200}")
        if not (isinstance(steps, list) and len(steps) == 2 and all(type(s) is int and s >= 0 for s in steps)):
            raise StateFormatError(f"a skip's steps must be [first, last], got {steps!r:.200}")
        if steps[1] < steps[0] or not isinstance(holes, list):
            raise StateFormatError(f"a skip must name an ordered range and a list of holes, got {raw!r:.200}")
        parsed = []
        for hole in holes:
            if not (isinstance(hole, list) and len(hole) == 3 and (hole[0] is None or type(hole[0]) is int)):
                raise StateFormatError(f"a skip's hole must be [epoch or null, start, length], got {hole!r:.200}")
            if not all(type(value) is int and value >= 0 for value in hole[1:]) or (hole[0] or 0) < 0:
                raise StateFormatError(f"a skip's hole must hold non-negative ints, got {hole!r:.200}")
            parsed.append(Hole(hole[0], hole[1], hole[2]))
        return cls(StepRange(steps[0], steps[1]), at, tuple(parsed))


def hole_of(hole: Hole, epoch: int | None) -> bool:
    """Whether ``hole`` lies in ``epoch``'s stream (a mixture's holes lie in its one stream)."""
    return hole.epoch is None or hole.epoch == epoch


def position_in_stream(holes: Sequence[Hole], epoch: int | None, position: int) -> int:
    """`to_stream` of one position."""
    for hole in reversed(holes):
        if hole_of(hole, epoch) and position >= hole.start:
            position += hole.length
    return position


def from_stream(holes: Sequence[Hole], epoch: int | None, position: int) -> int:
    """The run's position of stream ``position`` (one inside a hole: the run's first position after it)."""
    for hole in holes:
        if hole_of(hole, epoch) and position >= hole.start:
            position = max(hole.start, position - hole.length)
    return position


def holes_of(skips: Sequence[Skip]) -> tuple[Hole, ...]:
    """Every hole of ``skips``, in the order they were made."""
    return tuple(hole for skip in skips for hole in skip.holes)


def skips_from_list(raw: object) -> tuple[Skip, ...]:
    """The envelope's ``skips``: a list of recorded skips."""
    if not isinstance(raw, list) or not raw:
        raise StateFormatError(f"the data state's skips must be a non-empty list, got {raw!r:.200}")
    return tuple(Skip.from_dict(each) for each in raw)

"""A mixture's persisted state: its loader's, and where each source and the weights stand.

Promise: beside the loader's `DataState` (whose position counts the epoch's samples), a
`MixtureRecord` holds the true state of the mixture's stream at the save: the stream position of
the epoch's first sample, the training steps trained before the save (where a schedule by steps
resumes), the segment in force (since which stream position, with which realised weights, and every
source's count at its start), and the size of every source known, removed ones included. Plain ints
and strings only; nothing derived from the world size.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

from lightning_resumable.errors import StateFormatError
from lightning_resumable.format._parsing import Kind, mapping_of, require_keys
from lightning_resumable.format.loader_state import LoaderState

__all__ = ["MIXTURE", "MixtureRecord", "MixtureState", "WeightChange"]

MIXTURE = "mixture"


def _counts(raw: object, what: str, positive: bool = False) -> dict[str, int]:
    values = mapping_of(raw, what)
    if not all(type(value) is int and (value > 0 if positive else value >= 0) for value in values.values()):
        kind = "positive" if positive else "non-negative"
        raise StateFormatError(f"{what} must map source names to {kind} ints: {dict(values)!r:.200}")
    return dict(values)


def _weights(raw: object, what: str) -> tuple[int, dict[str, int]]:
    """Realised weights, ``{"period": n, "parts": {name: part}}``, checked."""
    raw = mapping_of(raw, what)
    require_keys(raw, {"period", "parts"}, set(), what)
    period, parts = raw["period"], _counts(raw["parts"], what, positive=True)
    if type(period) is not int or not parts or sum(parts.values()) != period:
        raise StateFormatError(f"{what}: the parts {parts} do not add up to the period {period!r}")
    return period, parts


@dataclass(frozen=True)
class WeightChange:
    """A change of a mixture's weights set by the training, as it happened.

    Attributes:
        asked: the training step (batches, counted as a schedule by steps counts them) at which it was asked
            (in training, or the last trained: ``-1`` before the run's first).
        step: the step from which the weights are drawn (after the loaders' read-ahead).
        position: the stream position of that step's first sample (all ranks together): where it took effect.
        period, parts: the realised weights, ``parts[name] / period`` (sources drawn only).
    """

    asked: int
    step: int
    position: int
    period: int
    parts: dict[str, int]

    def weights(self) -> dict[str, Fraction]:
        """The realised weight of each source drawn."""
        return {name: Fraction(part, self.period) for name, part in self.parts.items()}

    def to_dict(self) -> dict[str, Any]:
        """The change as the checkpoint holds it (plain ints and strings)."""
        return {
            "asked": self.asked,
            "step": self.step,
            "position": self.position,
            "weights": {"period": self.period, "parts": dict(self.parts)},
        }

    @classmethod
    def from_dict(cls, raw: object) -> WeightChange:
        """A change as the checkpoint holds it, checked.

        Raises:
            StateFormatError: it is not one (steps not ints, taking effect before it was asked, weights that do
                not add up to their period).
        """
        raw = mapping_of(raw, "a mixture's weight change")
        require_keys(raw, {"asked", "step", "position", "weights"}, set(), "a mixture's weight change")
        asked, step, position = raw["asked"], raw["step"], raw["position"]
        ints = all(type(value) is int for value in (asked, step, position))
        if not ints or asked < -1 or position < 0 or step <= asked:  # asked before the run's first step: -1
            raise StateFormatError(
                f"a weight change's steps and position must be ints, taking effect after asked: {raw!r:.200}"
            )
        period, parts = _weights(raw["weights"], "a weight change's weights")
        return cls(raw["asked"], raw["step"], raw["position"], period, parts)


@dataclass(frozen=True)
class MixtureRecord:
    """Where a mixture's stream stands at a save.

    Attributes:
        epoch_start: the stream position of the saved epoch's first sample.
        steps: training steps trained before the save (a schedule by steps counts from here on).
        segment_start: the stream position where the weights in force took effect.
        period, parts: the realised weights in force, ``parts[name] / period`` (sources drawn only).
        counts: every known source's samples given before ``segment_start``.
        sizes: every known source's size, a removed one's too.
        chunks: the chunk layout (`lightning_resumable.core.chunks.Chunks.digest`) of every known source
            read chunk by chunk, by name (a source absent is read by a global permutation).
        changes: every change of the weights the training set, in the order they take effect (those
            after the save too: asked before it, they take effect on a resume as in the run).
        scheduled: with changes, the weights the schedule gave at the save, ``(period, parts)``: a resume
            whose schedule gives others there changes the weights there (else the ones in force go on).
    """

    epoch_start: int
    steps: int
    segment_start: int
    period: int
    parts: dict[str, int]
    counts: dict[str, int]
    sizes: dict[str, int]
    chunks: dict[str, str] = field(default_factory=dict)
    changes: tuple[WeightChange, ...] = ()
    scheduled: tuple[int, dict[str, int]] | None = None

    def weights(self) -> dict[str, Fraction]:
        return {name: Fraction(part, self.period) for name, part in self.parts.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch_start": self.epoch_start,
            "steps": self.steps,
            "segment": {"start": self.segment_start, "period": self.period, "parts": dict(self.parts)},
            "counts": dict(self.counts),
            "sizes": dict(self.sizes),
            **({"chunks": dict(self.chunks)} if self.chunks else {}),
            **({"changes": [change.to_dict() for change in self.changes]} if self.changes else {}),
            **(
                {"scheduled": {"period": self.scheduled[0], "parts": dict(self.scheduled[1])}}
                if self.scheduled is not None
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, raw: object) -> MixtureRecord:
        raw = mapping_of(raw, "a mixture's record")
        optional = {"chunks", "changes", "scheduled"}
        require_keys(raw, {"epoch_start", "steps", "segment", "counts", "sizes"}, optional, "a mixture's record")
        segment = mapping_of(raw["segment"], "a mixture's segment")
        require_keys(segment, {"start", "period", "parts"}, set(), "a mixture's segment")
        numbers = (raw["epoch_start"], raw["steps"], segment["start"], segment["period"])
        if not all(type(value) is int and value >= 0 for value in numbers) or segment["period"] < 1:
            raise StateFormatError(f"a mixture's positions, steps and period must be non-negative ints: {raw!r:.200}")
        parts = _counts(segment["parts"], "a mixture's weights", positive=True)
        counts = _counts(raw["counts"], "a mixture's counts")
        sizes = _counts(raw["sizes"], "a mixture's sizes", positive=True)
        if not parts or sum(parts.values()) != segment["period"]:
            raise StateFormatError(f"a mixture's weights {parts} do not add up to their period {segment['period']}")
        if not set(parts) <= set(sizes) or set(counts) != set(sizes):
            raise StateFormatError(
                f"a mixture's record names sources {sorted(sizes)} by size, {sorted(counts)} by count and"
                f" {sorted(parts)} by weight: every source needs a size and a count, and a weight only if drawn"
            )
        chunks = dict(mapping_of(raw.get("chunks", {}), "a mixture's chunks"))
        if not all(isinstance(value, str) for value in chunks.values()) or not set(chunks) <= set(sizes):
            raise StateFormatError(f"a mixture's chunks must map known sources to their layouts: {chunks!r:.200}")
        changes = tuple(
            WeightChange.from_dict(each) for each in _list_of(raw.get("changes", []), "a mixture's changes")
        )
        if any(before.position >= after.position for before, after in itertools.pairwise(changes)):
            raise StateFormatError(
                f"a mixture's weight changes are not in the order they take effect: {raw['changes']!r:.200}"
            )
        if any(not set(change.parts) <= set(sizes) for change in changes):
            raise StateFormatError("a mixture's weight change names a source the record does not know")
        scheduled = _weights(raw["scheduled"], "a mixture's scheduled weights") if "scheduled" in raw else None
        return cls(
            raw["epoch_start"],
            raw["steps"],
            segment["start"],
            segment["period"],
            parts,
            counts,
            sizes,
            chunks,
            changes,
            scheduled,
        )


def _list_of(raw: object, what: str) -> list[Any]:
    if not isinstance(raw, list):
        raise StateFormatError(f"{what} must be a list, got {type(raw).__name__}")
    return raw


@dataclass(frozen=True)
class MixtureState:
    """A `Mixture`'s loader: its loader's state and its mixture's record."""

    kind: ClassVar[Kind] = "mixture"
    described: ClassVar[str] = "a mixture of sources"

    loader: LoaderState
    mixture: MixtureRecord

    @property
    def seed(self) -> int:
        return self.loader.state.seed

    @property
    def position(self) -> int:
        """The stream position of the save."""
        return self.mixture.epoch_start + self.loader.state.position

    @property
    def world_size(self) -> int:
        """The processes that wrote it."""
        return self.loader.world_size

    def to_dict(self) -> dict[str, Any]:
        return {**self.loader.to_dict(), MIXTURE: self.mixture.to_dict()}

    @classmethod
    def from_dict(cls, raw: object) -> MixtureState:
        raw = mapping_of(raw, "a mixture's state")
        if MIXTURE not in raw:
            raise StateFormatError(f"a mixture's state lacks its record ({MIXTURE!r}): keys {sorted(raw)[:10]}")
        record = MixtureRecord.from_dict(raw[MIXTURE])
        loader = LoaderState.from_dict({key: value for key, value in raw.items() if key != MIXTURE})
        return cls(loader, record)

    def check_segment(self, stream_position: int) -> None:
        """Refuse weights that took effect after the save, at ``stream_position`` (its position with the run's
        skipped data counted: `lightning_resumable.format.skips`)."""
        if self.mixture.segment_start > stream_position:
            raise StateFormatError(
                f"a mixture's weights took effect at stream position {self.mixture.segment_start}, after its save at"
                f" {stream_position}: the state was altered"
            )

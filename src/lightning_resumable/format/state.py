"""The persisted data state: global values only, plain types only.

Promise: a `DataState` holds the cause of the stream (seed, epoch, global position) and the
setup needed to check a resume is legitimate; never a derived quantity such as rank, shard offset or
per-worker progress, which is recomputed from the current setup on restore. Its dict form contains
only ints, bools and strings, so a checkpoint stays loadable with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from lightning_resumable.errors import IncompatibleStateError, StateFormatError

__all__ = ["STATE_VERSION", "DataState"]

STATE_VERSION = 6
# Version 1 had no ``draws`` (it was always a permutation); versions 1 and 2 had no ``cycle`` (always 0);
# versions 1 to 3 did not record the loader's ``drop_last`` (``drop_last_batch`` is None: not checked);
# versions 1 to 4 had no anchor (``None``: the position is only checked to lie within the epoch);
# versions 1 to 5 had no ``stream_length``: read from what ``draws`` describes (`_described_length`).
_READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
_LENGTH_IN_DRAWS = re.compile(r"(?:num_samples|size)=(\d+)")


def _described_length(draws: object, dataset_size: object) -> int | None:
    """A stream's length as a state before version 6 tells it: the dataset size for a permutation,
    ``num_samples=`` or ``size=`` of other draws, ``None`` (not checked) for a batch sampler's stream."""
    if draws in ("permutation", "sequential"):
        return dataset_size if type(dataset_size) is int else None
    found = _LENGTH_IN_DRAWS.search(draws) if isinstance(draws, str) else None
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class DataState:
    """Where one train loader's stream stands, and the setup that produced it.

    Attributes:
        seed: the shuffle seed of the run.
        epoch: the epoch the position belongs to.
        position: samples of this epoch consumed by all ranks together.
        batches: batches of this epoch completed, as the trainer counts them. Equal to
            ``position // (batch_size * world_size)`` unless the world size changed mid-epoch.
        dataset_size: ``len(dataset)``.
        shuffle: whether the order is shuffled.
        drop_last: the sampler's ``drop_last`` (drop the tail that does not divide across ranks).
        batch_size: samples per batch on each rank.
        world_size: number of processes that wrote the state.
        draws: what the epoch's stream draws (``permutation``, ``weighted-with-replacement(...)``...);
            a resume with other draws is refused.
        cycle: how many times the loader restarted within the epoch (``CombinedLoader``'s
            ``max_size_cycle`` restarts a shorter loader); each cycle is a stream of its own.
        drop_last_batch: the loader's ``drop_last`` (drop each rank's last incomplete batch);
            ``None`` in a state written before version 4, which did not record it.
        anchor_position, anchor_batches: where the epoch's current world size took over (``0, 0``
            unless a resume on another world size happened in this epoch), so that ``position`` is
            ``anchor_position + (batches - anchor_batches) * batch_size * world_size``: the position
            is checked against the trainer's count. ``None`` where not recorded (a sampler's own
            ``state_dict``, or a state before version 5): then it is only checked to lie in the epoch.
        stream_length: positions in the epoch's global stream (samples, or batches for a batch
            sampler), which bounds ``position``; ``None`` only where a state before version 6 could not
            tell it (a batch sampler's stream).
    """

    seed: int
    epoch: int
    position: int
    batches: int
    dataset_size: int
    shuffle: bool
    drop_last: bool
    batch_size: int
    world_size: int
    draws: str = "permutation"
    cycle: int = 0
    drop_last_batch: bool | None = False
    anchor_position: int | None = None
    anchor_batches: int | None = None
    stream_length: int | None = None
    version: int = STATE_VERSION

    def to_dict(self) -> dict[str, int | bool | str | None]:
        """The state as plain values, as the checkpoint stores it (readable with ``weights_only=True``).

        A state read from an older version and saved again before it was applied keeps that version's
        form: what it never recorded is absent, not ``None``, which the parser refuses.
        """
        saved: dict[str, int | bool | str | None] = asdict(self)
        absent: tuple[str, ...]
        if self.drop_last_batch is None:  # versions 1 to 3: neither the loader's drop_last nor an anchor
            version, absent = 3, ("drop_last_batch", "anchor_position", "anchor_batches", "stream_length")
        elif self.anchor_position is None:  # version 4: no anchor
            version, absent = 4, ("anchor_position", "anchor_batches", "stream_length")
        elif self.stream_length is None:  # version 5: no length
            version, absent = 5, ("stream_length",)
        else:
            return saved
        saved = {key: value for key, value in saved.items() if key not in absent}
        saved["version"] = version
        return saved

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DataState:
        """Parse a persisted dict, refusing unknown versions and wrong types with a specific error."""
        if not isinstance(raw, Mapping):
            raise StateFormatError(f"data state must be a dict, got {type(raw).__name__}")
        version = raw.get("version")
        if type(version) is not int or version not in _READABLE_VERSIONS:  # True == 1 and 1.0 == 1 are not versions
            raise StateFormatError(
                f"data state version {version!r} is not supported (this library reads versions {_READABLE_VERSIONS})"
            )
        if version == 1:
            raw = {**raw, "draws": "permutation" if raw.get("shuffle") else "sequential"}
        if version in (1, 2):
            raw = {**raw, "cycle": 0}
        unrecorded: set[str] = set()  # what the state's version did not record: None, not checked
        if version in (1, 2, 3):
            raw, unrecorded = {**raw, "drop_last_batch": None}, {"drop_last_batch"}
        if version in (1, 2, 3, 4):
            raw = {**raw, "anchor_position": None, "anchor_batches": None}
            unrecorded |= {"anchor_position", "anchor_batches"}
        if version < 6:
            length = _described_length(raw.get("draws"), raw.get("dataset_size"))
            raw, unrecorded = {**raw, "stream_length": length, "version": STATE_VERSION}, unrecorded | {"stream_length"}
        values: dict[str, Any] = {}
        for field in fields(cls):
            if field.name not in raw:
                raise StateFormatError(f"data state lacks the key {field.name!r}")
            value = raw[field.name]
            expected = {"bool": bool, "str": str, "bool | None": bool}.get(str(field.type), int)
            if value is None and field.name in unrecorded:
                pass  # not recorded by the state's version
            elif type(value) is not expected:
                raise StateFormatError(
                    f"data state key {field.name!r} must be {expected.__name__}, got {type(value).__name__}"
                )
            values[field.name] = value
        state = cls(**values)
        if min(state.epoch, state.position, state.batches, state.cycle, state.stream_length or 0) < 0:
            raise StateFormatError(f"data state has a negative epoch, position, batch count or cycle: {state}")
        if state.dataset_size < 1 or state.batch_size < 1 or state.world_size < 1:
            raise StateFormatError(f"data state has a non-positive size: {state}")
        state.check_position()
        return state

    def laid_out_otherwise(self, world_size: int, batch_size: int) -> bool:
        """Whether this state was written on another layout than ``world_size`` processes of ``batch_size`` samples a
        batch: then the epoch goes on from its global position, split anew (the anchor moves there)."""
        return (self.world_size, self.batch_size) != (world_size, batch_size)

    def at_start(self, epoch: int, cycle: int, stream_length: int) -> DataState:
        """This setup's state at the start of ``epoch``'s ``cycle`` (a stream of ``stream_length``
        positions): nothing consumed, the stream's start the anchor."""
        return replace(
            self,
            epoch=epoch,
            cycle=cycle,
            position=0,
            batches=0,
            anchor_position=0,
            anchor_batches=0,
            stream_length=stream_length,
        )

    def check_position(self) -> None:
        """Raise `StateFormatError` unless ``position`` is where ``batches`` put it (from the anchor) and
        lies within the epoch (its length, plus the padding of one batch on every rank)."""
        anchor = (self.anchor_position, self.anchor_batches)
        if (None in anchor) != (anchor == (None, None)):
            raise StateFormatError(f"a data state's anchor must be two ints or two None: {anchor}")
        if self.anchor_position is not None and self.anchor_batches is not None:
            step = self.batch_size * self.world_size
            expected = self.anchor_position + (self.batches - self.anchor_batches) * step
            if not (0 <= self.anchor_position <= self.position and 0 <= self.anchor_batches <= self.batches):
                raise StateFormatError(f"a data state's anchor {anchor} lies after its position: {self}")
            if self.position != expected:
                raise StateFormatError(
                    f"the data state's position {self.position} is not where {self.batches} batches of"
                    f" {self.batch_size} on {self.world_size} processes put it ({expected}, from the anchor"
                    f" {anchor}): the state was altered"
                )
        length = self.stream_length
        if length is not None and self.position >= length + self.batch_size * self.world_size:
            raise StateFormatError(
                f"the data state's position {self.position} lies past the end of its epoch ({length} positions):"
                " the state was altered"
            )

    def check_same_data(self, current: DataState, batch_size_may_change: bool = False) -> None:
        """Raise if ``current`` (the running setup) would read a different stream than the saved one.

        The world size is not compared here: a changed world size is an elastic resume, which the
        sampler handles and the callback polices; nor, where ``batch_size_may_change``, the batch size (the
        same global stream read on in batches of another size).
        """
        names: tuple[str, ...] = ("dataset_size", "shuffle", "drop_last", "drop_last_batch", "draws")
        names += () if batch_size_may_change else ("batch_size",)
        differences = [
            f"{name}: checkpoint {getattr(self, name)!r}, now {getattr(current, name)!r}"
            for name in names
            if getattr(self, name) != getattr(current, name)
            and None not in (getattr(self, name), getattr(current, name))
        ]
        if differences:
            raise IncompatibleStateError(
                "the checkpoint's data state was written by a different setup; resuming would read a"
                " different stream. Differences: " + "; ".join(differences)
            )

"""The checkpoint format: everything the callback writes under its key, and the one parser that reads it.

Promise: `parse` reads every format this library ever wrote (0.1.0 on) into typed values, or raises
`StateFormatError` saying what is wrong; `Envelope.to_dict` writes plain values only (ints, bools,
strings, lists, dicts), so a checkpoint loads with ``torch.load(weights_only=True)``. This module
imports neither torch nor Lightning: ``lightning-resumable inspect`` reads checkpoints through it.

The envelope (``format`` 1, from 0.3.0)::

    {"format": 1, "kind": "loader" | "loaders" | "stream" | "mixture" | "unresumable", "keys": 1,
     "state": <the kind's state>,             # not for "unresumable"
     "reason": "...",                         # "unresumable" only: why no state could be written
     "partial_accumulation": {...},           # a save inside a gradient accumulation window
     "skips": [{"steps": [a, b], "at": step, "holes": [[epoch, start, length], ...]}, ...]}  # (0.4.0 on)

``keys``: the key derivation (`lightning_resumable.format._keys`) the stream was drawn with. Before 0.3.0
there was no envelope: the kind was told by its keys (``train``, ``loaders``, ``stream`` or
``unresumable``), ``partial_accumulation`` beside them; those still read, as ``keys`` 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from lightning_resumable.errors import StateFormatError
from lightning_resumable.format._keys import DERIVATION_VERSION, check_version
from lightning_resumable.format._parsing import Kind, mapping_of, require_keys
from lightning_resumable.format.loader_state import TRAIN, BatchFingerprint, LoaderState
from lightning_resumable.format.mixture_state import MixtureRecord, MixtureState
from lightning_resumable.format.skips import Skip, position_in_stream, skips_from_list
from lightning_resumable.format.stream_state import GLOBAL_POSITION_ATTRIBUTE, StreamState

__all__ = [
    "FORMAT_VERSION",
    "GLOBAL_POSITION_ATTRIBUTE",
    "STATE_KEY",
    "TRAIN",
    "BatchFingerprint",
    "Envelope",
    "LoaderState",
    "LoadersState",
    "MixtureRecord",
    "MixtureState",
    "PartialAccumulation",
    "StreamState",
    "Unresumable",
    "holds_no_state",
    "parse",
]

STATE_KEY = "ResumableDataCallback"
"""The key of the callback's state in ``checkpoint["callbacks"]`` (its ``state_key``)."""
FORMAT_VERSION = 1
KEYS_VERSION = DERIVATION_VERSION
"""The key derivation this release draws streams with (`lightning_resumable.format._keys`)."""

# The envelope's keys, and the keys of the states inside it.
FORMAT, KIND, KEYS, STATE, REASON = "format", "kind", "keys", "state", "reason"
PARTIAL_ACCUMULATION = "partial_accumulation"
SKIPS = "skips"
SEED, MODE, LOADERS = "seed", "mode", "loaders"
STREAM, UNRESUMABLE = "stream", "unresumable"


@dataclass(frozen=True)
class LoadersState:
    """Several train loaders: the run's seed, the ``CombinedLoader`` mode, and each loader's state by key."""

    kind: ClassVar[Kind] = "loaders"
    described: ClassVar[str] = "several train loaders"

    seed: int
    mode: str
    loaders: dict[str, LoaderState]

    @property
    def world_size(self) -> int:
        """The processes that wrote it (every loader's state says the same)."""
        return next(iter(self.loaders.values())).world_size

    def to_dict(self) -> dict[str, Any]:
        return {SEED: self.seed, MODE: self.mode, LOADERS: {k: v.to_dict() for k, v in self.loaders.items()}}

    @classmethod
    def from_dict(cls, raw: object) -> LoadersState:
        raw = mapping_of(raw, "the state of several train loaders")
        require_keys(raw, {SEED, MODE, LOADERS}, set(), "the state of several train loaders")
        seed, mode = raw[SEED], raw[MODE]
        if type(seed) is not int or not isinstance(mode, str):
            raise StateFormatError(f"the seed and mode of several train loaders must be an int and a str: {raw!r:.200}")
        loaders = mapping_of(raw[LOADERS], "the train loaders' states")
        if not loaders:
            raise StateFormatError("the state of several train loaders holds no loader")
        return cls(seed, mode, {key: LoaderState.from_dict(value) for key, value in loaders.items()})


@dataclass(frozen=True)
class PartialAccumulation:
    """A save inside a gradient accumulation window: ``accumulated`` of ``window`` batches had been
    accumulated without an optimizer step, after ``batches`` batches of the epoch."""

    accumulated: int
    window: int
    batches: int

    @classmethod
    def from_dict(cls, raw: object) -> PartialAccumulation:
        raw = mapping_of(raw, f"{PARTIAL_ACCUMULATION!r}")
        require_keys(raw, {"accumulated", "window", "batches"}, set(), f"{PARTIAL_ACCUMULATION!r}")
        if not all(type(raw[name]) is int and raw[name] >= 0 for name in raw):
            raise StateFormatError(f"{PARTIAL_ACCUMULATION!r} must hold non-negative ints: {raw!r:.200}")
        return cls(**raw)


Body = LoaderState | LoadersState | StreamState | MixtureState


@dataclass(frozen=True)
class Unresumable:
    """A save that holds no state to resume from, and why (written as the kind ``unresumable``)."""

    reason: str


@dataclass(frozen=True)
class Envelope:
    """What the callback writes: one kind of state (or the reason there is none), and its marks."""

    state: Body | None
    reason: str | None = None
    partial_accumulation: PartialAccumulation | None = None
    keys: int = KEYS_VERSION
    skips: tuple[Skip, ...] = ()
    """The skipped step ranges of the run (`lightning_resumable.format.skips`); written only when there are some,
    so a release before them refuses a checkpoint whose stream it would read without its holes."""

    @property
    def kind(self) -> Kind:
        return self.state.kind if self.state is not None else "unresumable"

    @property
    def world_size(self) -> int | None:
        """The processes that wrote the state; ``None`` for a save that holds none."""
        return self.state.world_size if self.state is not None else None

    def to_dict(self) -> dict[str, Any]:
        raw: dict[str, Any] = {FORMAT: FORMAT_VERSION, KIND: self.kind, KEYS: self.keys}
        if self.state is None:
            raw[REASON] = self.reason or ""
        else:
            raw[STATE] = self.state.to_dict()
        if self.partial_accumulation is not None:
            raw[PARTIAL_ACCUMULATION] = asdict(self.partial_accumulation)
        if self.skips:
            raw[SKIPS] = [skip.to_dict() for skip in self.skips]
        return raw


_BODIES: dict[str, type[Body]] = {body.kind: body for body in (LoaderState, LoadersState, StreamState, MixtureState)}


def _empty(value: object) -> bool:
    """``None``, or a falsy plain value (``{}``, ``[]``, ``0``, ``False``, ``""``); a tensor is not tested."""
    return value is None or (isinstance(value, (Mapping, list, tuple, str, bytes, int, float)) and not value)


def holds_no_state(raw: object) -> bool:
    """Whether the callback's slot is empty or partial: falsy, or without the state of its kind (an
    envelope whose ``state`` is missing or empty, an older form with none of the kinds' keys)."""
    if _empty(raw):
        return True
    if not isinstance(raw, Mapping):
        return False  # malformed: the parser says how
    if FORMAT in raw:
        kind = raw.get(KIND)
        return isinstance(kind, str) and kind in _BODIES and _empty(raw.get(STATE))
    return not any(key in raw for key in (TRAIN, LOADERS, STREAM, UNRESUMABLE))


def parse(raw: object) -> Envelope:
    """The callback's state as written by any release, typed; a `StateFormatError` for anything else."""
    raw = mapping_of(raw, "the data state")
    marked = raw.get(PARTIAL_ACCUMULATION)
    partial = PartialAccumulation.from_dict(marked) if marked is not None else None
    if FORMAT not in raw:
        return _parse_unversioned(raw, partial)
    version = raw[FORMAT]
    if type(version) is not int or version != FORMAT_VERSION:
        raise StateFormatError(f"data state format {version!r} is not supported (this library reads {FORMAT_VERSION})")
    kind, keys = raw.get(KIND), raw.get(KEYS)
    try:
        keys = check_version(keys)  # the derivation the stream was drawn with selects the functions
    except ValueError as error:
        raise StateFormatError(str(error)) from None
    if kind == UNRESUMABLE:
        require_keys(raw, {FORMAT, KIND, KEYS, REASON}, {PARTIAL_ACCUMULATION}, "an unresumable data state")
        if not isinstance(raw[REASON], str):
            raise StateFormatError(f"the reason of an unresumable data state must be a str: {raw[REASON]!r:.200}")
        return Envelope(None, reason=raw[REASON], partial_accumulation=partial, keys=keys)
    if not isinstance(kind, str) or kind not in _BODIES:  # a list is unhashable: no `in` before the type
        raise StateFormatError(f"unknown kind of data state {kind!r:.200} (known: {sorted([*_BODIES, UNRESUMABLE])})")
    require_keys(raw, {FORMAT, KIND, KEYS, STATE}, {PARTIAL_ACCUMULATION, SKIPS}, f"a data state of kind {kind!r}")
    skips = skips_from_list(raw[SKIPS]) if SKIPS in raw else ()
    body = _BODIES[kind].from_dict(raw[STATE])
    if isinstance(body, MixtureState):
        body.check_segment(position_in_stream([hole for skip in skips for hole in skip.holes], None, body.position))
    return Envelope(body, partial_accumulation=partial, keys=keys, skips=skips)


def _parse_unversioned(raw: Mapping[str, Any], partial: PartialAccumulation | None) -> Envelope:
    """A state written before the envelope (0.1.0 to 0.2.x): the kind is told by its keys."""
    body = {key: value for key, value in raw.items() if key != PARTIAL_ACCUMULATION}
    if UNRESUMABLE in body:
        require_keys(body, {UNRESUMABLE}, set(), "an unresumable data state")
        return Envelope(None, reason=str(body[UNRESUMABLE]), partial_accumulation=partial)
    if STREAM in body:
        require_keys(body, {STREAM}, set(), "a stream's data state")
        return Envelope(StreamState.from_dict(body[STREAM]), partial_accumulation=partial)
    if LOADERS in body:
        return Envelope(LoadersState.from_dict(body), partial_accumulation=partial)
    if TRAIN in body:
        return Envelope(LoaderState.from_dict(body), partial_accumulation=partial)
    raise StateFormatError(f"the data state holds none of the known kinds: keys {sorted(body)[:10]}")

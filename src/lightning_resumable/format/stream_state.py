"""A stream's saved state: where a stream loader stands on every rank, in the checkpoint format
(`lightning_resumable.format.envelope` holds it in its envelope as the kind ``stream``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from lightning_resumable.errors import StateFormatError
from lightning_resumable.format._parsing import Kind, is_digest, mapping_of, require_keys
from lightning_resumable.internals._torchdata import torchdata_release

__all__ = ["GLOBAL_POSITION_ATTRIBUTE", "STREAM_ORDER_ATTRIBUTE", "STREAM_STATE_VERSION", "StreamState"]

GLOBAL_POSITION_ATTRIBUTE = "resumable_global_position"
"""A stream dataset's attribute: ``True`` declares its state the same on every rank and valid on any world size."""
STREAM_ORDER_ATTRIBUTE = "resumable_stream_order"
"""A stream dataset's attribute: ``(world_size, num_workers, batch_size)``, the layout whose global order every epoch
begun is read in, on any layout (`lightning_resumable.readers.elsewhere_plan.declared_order`)."""
STREAM_STATE_VERSION = 5
# Version 1 (never released) had no torchdata version; 1 and 2 (0.2.x) no next-batch digests nor reader; 1 to 3 no
# batch size; 1 to 4 no digests of the next batch's samples.
_READABLE_STREAM_VERSIONS = (1, 2, 3, 4, 5)


@dataclass(frozen=True)
class StreamState:
    """Where a stream loader stands on every rank, and the setup whose slices those states mean.

    Attributes:
        seed: the run's seed (the sample seeds are keyed by it).
        epoch: the epoch of the position.
        batches: batches of the epoch every rank has completed.
        world_size: processes that wrote it.
        num_workers: loader workers per process.
        global_position: the dataset declared its state the same on every rank.
        finished: every rank's loader had run out (a resume starts the next epoch).
        ranks: each rank's loader state, in rank order (``StatefulDataLoader`` form, workers' included).
        torchdata: the torchdata version whose ``StatefulDataLoader`` wrote ``ranks`` (an older
            torchdata cannot read a newer one's state); ``""`` if not recorded.
        next_batch: each rank's digest of the batch it trains next (Lightning had read it ahead), in
            rank order; ``""`` for a rank that had not read it; ``None`` if not recorded (no
            verification, or a state before version 3).
        reader: what read the stream and wrote ``ranks``: ``torchdata`` (a ``StatefulDataLoader``)
            ``litdata`` or ``mosaic`` (LitData's or MosaicML Streaming's ``StreamingDataLoader``).
        batch_size: each process's batch size; ``None`` if not recorded (a state before version 4).
        next_samples: each rank's digests of the samples of the batch it trains next, in rank order (``[]``: not
            read, or its samples cannot be told apart), for a stream whose position is global: its resume on
            another world size checks the global batch (`lightning_resumable.core.global_batch`); ``None`` if not
            recorded (another stream, no verification, or a state before version 5).
    """

    kind: ClassVar[Kind] = "stream"
    described: ClassVar[str] = "a stream (an iterable dataset)"

    seed: int
    epoch: int
    batches: int
    world_size: int
    num_workers: int
    global_position: bool
    finished: bool
    ranks: list[dict[str, Any]]
    torchdata: str = ""
    next_batch: list[str] | None = None
    reader: str = "torchdata"
    batch_size: int | None = None
    next_samples: list[list[str]] | None = None
    version: int = STREAM_STATE_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: object) -> StreamState:
        raw = mapping_of(raw, "a stream state")
        version = raw.get("version")
        if type(version) is not int or version not in _READABLE_STREAM_VERSIONS:
            raise StateFormatError(
                f"stream state version {version!r} is not supported (this library reads {_READABLE_STREAM_VERSIONS})"
            )
        if version == 1:
            raw = {**raw, "torchdata": ""}
        if version in (1, 2):
            raw = {**raw, "next_batch": None, "reader": "torchdata"}
        if version in (1, 2, 3):
            raw = {**raw, "batch_size": None}
        if version in (1, 2, 3, 4):
            raw = {**raw, "next_samples": None, "version": STREAM_STATE_VERSION}
        require_keys(raw, {field.name for field in fields(cls)}, set(), "a stream state")
        for field in fields(cls):
            expected = {
                "bool": bool,
                "str": str,
                "list[dict[str, Any]]": list,
                "list[str] | None": list,
                "list[list[str]] | None": list,
            }.get(str(field.type), int)
            if field.name in ("next_batch", "batch_size", "next_samples") and raw[field.name] is None:
                continue  # not recorded
            if type(raw[field.name]) is not expected:
                raise StateFormatError(
                    f"stream state key {field.name!r} must be {expected.__name__}, got {type(raw[field.name]).__name__}"
                )
        state = cls(**{field.name: raw[field.name] for field in fields(cls)})
        batch_size = 1 if state.batch_size is None else state.batch_size
        if min(state.epoch, state.batches, state.num_workers) < 0 or min(state.world_size, batch_size) < 1:
            raise StateFormatError(f"a stream state has a negative count or no rank: {state!r:.300}")
        if len(state.ranks) != state.world_size or not all(isinstance(rank, Mapping) for rank in state.ranks):
            raise StateFormatError(f"the stream state must hold one loader state per rank ({state.world_size})")
        if state.torchdata:
            torchdata_release(state.torchdata)
        if re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", state.reader) is None:  # a reader's tag; the owner checks it is ours
            raise StateFormatError(
                f"a stream state's reader must be a reader's tag (torchdata, litdata...): {state.reader!r:.100}"
            )
        if state.next_batch is not None and (
            len(state.next_batch) != state.world_size
            or not all(digest == "" or is_digest(digest) for digest in state.next_batch)
        ):
            raise StateFormatError(
                f'a stream state\'s next_batch must hold one 16-digit hex digest (or "") per rank'
                f" ({state.world_size}), got {state.next_batch!r:.200}"
            )
        if state.next_samples is not None and (
            len(state.next_samples) != state.world_size
            or not all(type(samples) is list and all(map(is_digest, samples)) for samples in state.next_samples)
        ):
            raise StateFormatError(
                f"a stream state's next_samples must hold one list of 16-digit hex digests per rank"
                f" ({state.world_size}), got {state.next_samples!r:.200}"
            )
        return state

"""One map-style loader's persisted state: its `DataState`, each rank's next-batch fingerprint, and the
state of a dataset that has its own (`lightning_resumable.format.envelope` holds every kind)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning_resumable.errors import StateFormatError
from lightning_resumable.format._parsing import Kind, is_digest, mapping_of, require_keys
from lightning_resumable.format.state import DataState

__all__ = ["DATASET", "NEXT_BATCH", "TRAIN", "BatchFingerprint", "LoaderState"]

TRAIN, NEXT_BATCH, DATASET = "train", "next_batch", "dataset"


@dataclass(frozen=True)
class BatchFingerprint:
    """Digests (16 hex digits) of one rank's next batch: its sample keys, its content as fetched again,
    the batch the loader produced (``""``: not known, or a state of 0.2.0 and before)."""

    ids: str
    content: str
    produced: str = ""

    def to_list(self) -> list[str]:
        return [self.ids, self.content, self.produced]

    @classmethod
    def from_list(cls, raw: object) -> BatchFingerprint:
        """Parse the persisted form, a list of two 16-digit hex strings, and a third one or ``""``."""
        ids, content, produced = [*raw, ""][:3] if isinstance(raw, list) and len(raw) in (2, 3) else ["", "", ""]
        if not (is_digest(ids) and is_digest(content) and (produced == "" or is_digest(produced))):
            raise StateFormatError(f'a batch fingerprint must be 2 hex digests and one or "", got {raw!r:.200}')
        return cls(ids, content, produced)


@dataclass(frozen=True)
class LoaderState:
    """One map-style loader: its stream's state, each rank's next-batch fingerprint, and the state of a
    dataset that has its own (global, saved once)."""

    kind: ClassVar[Kind] = "loader"
    described: ClassVar[str] = "one map-style train loader"

    state: DataState
    fingerprints: list[BatchFingerprint] | None = None
    dataset: Mapping[str, Any] | None = None

    @property
    def seed(self) -> int:
        return self.state.seed

    @property
    def world_size(self) -> int:
        """The processes that wrote it."""
        return self.state.world_size

    def to_dict(self) -> dict[str, Any]:
        saved: dict[str, Any] = {TRAIN: self.state.to_dict()}
        if self.fingerprints is not None:
            saved[NEXT_BATCH] = [fingerprint.to_list() for fingerprint in self.fingerprints]
        if self.dataset is not None:
            saved[DATASET] = dict(self.dataset)
        return saved

    @classmethod
    def from_dict(cls, raw: object) -> LoaderState:
        raw = mapping_of(raw, "a loader's state")
        require_keys(raw, {TRAIN}, {NEXT_BATCH, DATASET}, "a loader's state")
        state = DataState.from_dict(raw[TRAIN])
        fingerprints = None
        if NEXT_BATCH in raw:
            entries = raw[NEXT_BATCH]
            if not isinstance(entries, list) or len(entries) != state.world_size:
                raise StateFormatError(
                    f"the data state must hold one batch fingerprint per rank ({state.world_size}),"
                    f" got {type(entries).__name__} of length {len(entries) if isinstance(entries, list) else '-'}"
                )
            fingerprints = [BatchFingerprint.from_list(entry) for entry in entries]
        dataset = raw.get(DATASET)
        if dataset is not None:
            dataset = mapping_of(dataset, "the dataset's state")
        return cls(state, fingerprints, dataset)

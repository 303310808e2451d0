"""What every reader shares: the options a loader is built with, what a build returns, and the base of
every stream reader (a data library's loader or torchdata's), with the plumbing they all need and the
resume policy a data library's state gets unless its reader says otherwise.

An adapter of a data library is one module (`lightning_resumable.readers.litdata`,
`lightning_resumable.readers.mosaic`; torch's own loaders: `lightning_resumable.readers.streams`,
`lightning_resumable.readers.map_style`) with ``recognises(loader)``, ``build(loader, options)``, its
refusals and its reader class, a subclass of `StreamReader` for a stream, whose policy says where its
state resumes. `lightning_resumable.readers.libraries` lists the data libraries, with what is known of
each before it is imported (a `Library`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from torch.utils.data import DataLoader

from lightning_resumable.core.mixture_sampler import MixtureSampler
from lightning_resumable.errors import WorldSizeChangedError
from lightning_resumable.format.stream_state import StreamState
from lightning_resumable.readers.recording import PassRecord

__all__ = ["Adapter", "BuildOptions", "Built", "Library", "StreamReader"]


@dataclass(frozen=True)
class Library:
    """A data library: its name, the package its classes come from, the keys of its own global position
    (the contract accepts them in a chain holding its object), and the way this release resumes it."""

    name: str
    package: str
    position_keys: frozenset[str]
    supported: str
    adapter: str
    """The adapter module (`lightning_resumable.readers.libraries.LIBRARIES`)."""


@dataclass(frozen=True)
class BuildOptions:
    """How a train loader is made resumable: the run's ``seed``, this process's place, whether each
    sample is seeded (``seed_samples``) and the main process's generators put back after it
    (``restore_globals``), and the trainer's epoch (``epoch_source``)."""

    seed: int
    num_replicas: int
    rank: int
    seed_samples: bool = True
    restore_globals: bool = True
    epoch_source: Callable[[], int] = lambda: 0

    def library_loader_keywords(self) -> dict[str, Any]:
        """The keywords of a data library's ``make_*_resumable`` (LitData's, Mosaic's)."""
        return {
            "seed": self.seed,
            "epoch_source": self.epoch_source,
            "rank": self.rank,
            "world_size": self.num_replicas,
            "seed_samples": self.seed_samples,
            "restore_globals": self.restore_globals,
        }


class StreamReader:
    """The base of a stream's loader, which a `lightning_resumable.lightning.stream_owner.StreamOwner` owns.

    Its `PassRecord` (``self.record``) answers for the state and the next batch at the trainer's count;
    ``state_dict`` and ``load_state_dict`` are hidden from Lightning, which would save rank 0's state
    after the look-ahead and load it on every rank. Its resume policy (`world_size_refusal`,
    `state_for_rank`) is a data library's by default: the saved layout, unless the position is global.
    """

    reader: ClassVar[str]
    """What reads the stream, as the checkpoint records it (``StreamState.reader``)."""
    library: ClassVar[str]
    """The reader's library, as messages name it."""
    state_dict = None
    load_state_dict = None
    puts_back_globals = True
    """A data library's reader without workers puts the global generators back after each batch it reads (its samples
    seeded and `BuildOptions`' ``restore_globals``)."""
    record: PassRecord
    epoch_source: Callable[[], int]
    dataset: Any
    num_workers: int
    _next_epoch: int | None = None

    def start_reading(self, record: PassRecord, epoch_source: Callable[[], int]) -> None:
        """Set up the shared plumbing (from the reader's ``__init__``)."""
        self.record, self.epoch_source, self._next_epoch = record, epoch_source, None

    def pass_epoch(self) -> int:
        """The epoch the pass starting now reads: the one `start_epoch` set, else the trainer's."""
        epoch, self._next_epoch = (self.epoch_source() if self._next_epoch is None else self._next_epoch), None
        self.record.epoch = epoch
        return epoch

    def start_epoch(self, epoch: int) -> None:
        """Make the next pass a fresh one of ``epoch`` (a resume after an epoch's last batch: Lightning
        creates the iterator while its epoch counter still shows the finished epoch)."""
        self._next_epoch = epoch

    @property
    def first_batch(self) -> tuple[str, str] | None:
        """(expected, read) digests of the first batch after a restore, once read."""
        return self.record.first_batch

    def state_after(self, batches: int) -> dict[str, Any]:
        """The loader's state after ``batches`` batches of the current epoch (`PassRecord.state_after`)."""
        return self.record.state_after(batches)

    def finished_after(self, batches: int) -> bool:
        """Whether the epoch had run out after ``batches`` batches."""
        return self.record.finished_after(batches)

    def next_batch_digest(self, batches: int) -> str:
        """The digest of batch ``batches`` of the epoch (`PassRecord.next_batch_digest`), read now if
        Lightning has not read it ahead (`PassRecord.read_ahead`): not past the loader's length, where
        Lightning ends the epoch without reading more."""
        try:
            within = batches < len(self)  # type: ignore[arg-type]  # a DataLoader's
        except TypeError:  # no length: Lightning has read ahead, or the pass has run out
            within = True
        if within:
            self.record.read_ahead(batches)
        return self.record.next_batch_digest(batches)

    def resume_from(self, state: Mapping[str, Any], batches: int, next_batch: str = "") -> None:
        """Continue the next pass from ``state``, ``batches`` batches into the epoch; ``next_batch``: the
        digest the first batch read must have (`first_batch` holds the outcome), ``""``: unknown."""
        raise NotImplementedError

    def retire_workers(self) -> None:
        """End the loader's workers (at the end of a fit, or before a reload's)."""
        raise NotImplementedError

    def world_size_refusal(self, saved: StreamState) -> str | None:
        """Why ``saved`` cannot resume on another world size (for the world-size policy); ``None``: it can.

        A data library's state resumes on its saved layout unless its position is global (Mosaic's
        one count, which the library partitions again on any world size and number of workers).
        """
        if saved.global_position:
            return None
        return (
            f"{self.library} restripes its stream on another layout itself, but this release does not resume"
            f" {self.library} elastically yet. Resume on {saved.world_size} processes with"
            f" num_workers={saved.num_workers}"
        )

    def continues_elsewhere(self, state: Mapping[str, Any]) -> bool:
        """Whether ``state``, restored on another layout, goes on with the samples the checkpoint would have read
        next (then its recorded next samples are checked); ``False``: a pass that reads the epoch in this layout's
        own order."""
        return True

    def state_for_rank(self, saved: StreamState, rank: int, world_size: int) -> Mapping[str, Any]:
        """The state ``rank`` of ``world_size`` restores from ``saved``, the saved layout checked; the world
        size is the policy's to allow (`world_size_refusal`), refused here too if it was not.

        Raises:
            WorldSizeChangedError: another world size or number of workers that the state cannot resume on.
        """
        refusal = self.world_size_refusal(saved)
        layout, saved_layout = (world_size, self.num_workers), (saved.world_size, saved.num_workers)
        if refusal is not None and layout != saved_layout:
            raise WorldSizeChangedError(
                f"the checkpoint's stream state was written on {saved.world_size} processes with num_workers="
                f"{saved.num_workers} and resumes on {world_size} with num_workers={self.num_workers}: {refusal}"
            )
        return saved.ranks[rank if world_size == saved.world_size else 0]


@dataclass(frozen=True)
class Built:
    """A resumable train loader and the kind it was built as: ``stream`` is the loader itself when it
    reads a stream (a `StreamReader`), ``mixture`` its sampler when it reads a `Mixture`; neither for a
    map-style loader with a `ResumableSampler`."""

    loader: DataLoader[Any]
    stream: StreamReader | None = None
    mixture: MixtureSampler | None = None


class Adapter(Protocol):
    """What a data library's adapter module holds (`lightning_resumable.readers.libraries.LIBRARIES` names it)."""

    LIBRARY: Library

    def recognises(self, loader: object) -> bool:
        """Whether ``loader`` is the library's loader, or a torch loader over its dataset."""

    def build(self, loader: Any, options: BuildOptions) -> Built:
        """``loader`` as the library's resumable reader."""

    def mixture_source(self, dataset: Any, window: int) -> object:
        """The library's chunked ``dataset`` as a `Mixture` reads it by index (``window``: chunks mixed
        together); the dataset itself where the library's own ``__getitem__`` reads a chunk well."""

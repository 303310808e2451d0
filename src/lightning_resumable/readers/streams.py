"""Iterable datasets with state: each rank's stream position, taken before Lightning's look-ahead.

Promise: a train loader over an ``IterableDataset`` that implements ``state_dict``/``load_state_dict``
resumes on every rank at the batch after the checkpoint, with the same content.

- The position of a stream is per rank (each rank reads its own shard) and per worker (each worker
  its own slice), so the callback gathers every rank's state into the checkpoint that rank 0 writes,
  keyed by rank, and each rank restores its own, before its iterator exists.
- Lightning reads one batch ahead of ``training_step`` for a loader without a length, so the loader's
  state when a checkpoint is written is one batch too far. `StreamLoader` records its state
  before each batch (`lightning_resumable.readers.recording`) and hands out the one at the trainer's count
  of completed batches.
- Workers' stream state is captured by torchdata's ``StatefulDataLoader`` (a snapshot at every batch).
- Each sample is drawn under a seed of ``(seed, epoch, rank, worker, samples that worker has yielded)``,
  so augmentations drawn from the global generators are the same after a resume.

A resume on another number of processes or workers would hand out states that mean another slice of
the data: it is refused (`WorldSizeChangedError`,
`WorkerCountChangedError`), unless the dataset declares its state global
(``resumable_global_position = True``: the same on every rank, as LitData's count of samples
consumed by all ranks), in which case every rank restores rank 0's state on a new world size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resumable.errors import (
    IncompatibleStateError,
    UnsupportedLoaderError,
    WorkerCountChangedError,
    WorldSizeChangedError,
)
from lightning_resumable.format.envelope import GLOBAL_POSITION_ATTRIBUTE, StreamState
from lightning_resumable.internals._torchdata import (
    check_loader_state,
    dataset_states,
    holds_restored_iterator,
    take_iterator,
    torchdata_release,
    torchdata_version,
)
from lightning_resumable.readers.base import BuildOptions, Built, StreamReader
from lightning_resumable.readers.elsewhere_plan import DROPS_LAST, declared_order, resume_plan
from lightning_resumable.readers.hf_partitions import hf_partitions
from lightning_resumable.readers.hugging_face import take_over_buffers
from lightning_resumable.readers.recording import FRESH_PASS, PassRecord
from lightning_resumable.readers.seeded_stream import SeededStream
from lightning_resumable.readers.settings import TORCH_SETTINGS, forwarded_settings
from lightning_resumable.readers.stream_elsewhere import STREAM_ELSEWHERE, Layout, Partitions
from lightning_resumable.readers.workers import (
    forking,
    retire,
    warn_once_on_affected_python,
)

__all__ = [
    "GLOBAL_POSITION_ATTRIBUTE",
    "SeededStream",
    "StreamLoader",
    "StreamState",
    "build",
    "make_stream_resumable",
    "recognises",
]


class StreamLoader(StreamReader, StatefulDataLoader):  # type: ignore[misc]  # torchdata is untyped
    """A ``StatefulDataLoader`` whose state the callback takes at the trainer's count of batches.

    Its `PassRecord` keeps its state before each of the last few batches, so the state after ``k``
    batches is known after Lightning has read batch ``k + 1`` ahead. ``state_dict`` and
    ``load_state_dict`` are hidden from Lightning, which would save rank 0's state after the
    look-ahead and load it on every rank: use `state_after` and `resume_from`.
    """

    reader = "torchdata"
    library = "torchdata"

    def __init__(self, *args: Any, epoch_source: Callable[[], int] = lambda: 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_reading(PassRecord("the stream loader", self._state, state_at_end=True), epoch_source)

    def __iter__(self) -> Iterator[Any]:
        stream = self.dataset
        assert isinstance(stream, SeededStream)
        stream.set_epoch(self.pass_epoch())  # before the workers get their copy
        # Retire the previous pass's iterator (its workers and feeder threads) before new workers are
        # forked (see lightning_resumable.readers.workers): 2 hangs in 11 runs of 3 epochs before, none in 22 after.
        kept = self.persistent_workers and self.num_workers > 0  # torchdata resets its workers for the pass
        if not kept and not holds_restored_iterator(self):  # else that iterator holds a restored state: keep it
            previous = take_iterator(self)
            if previous is not None:
                retire(previous)
            del previous
        warn_once_on_affected_python(self)
        with forking(super().__iter__) as iterator:
            pass
        return self.record.record(iterator)

    def retire_workers(self) -> None:
        """Retire the last pass's iterator (its workers and feeder threads), at the end of a fit."""
        previous = take_iterator(self)
        if previous is not None:
            retire(previous)

    def _state(self) -> dict[str, Any]:
        """torchdata's state, not copied: with workers, a snapshot it makes anew at each batch from the states the
        workers pickled; without, fresh values and the stream's state, which `SeededStream.state_dict` copies (a
        deep copy of every worker's state before each batch was a third of the main process's time)."""
        state: dict[str, Any] = StatefulDataLoader.state_dict(self)
        return state

    @property
    def batches_yielded(self) -> int:
        """Batches of the current epoch yielded, counting those before a restore."""
        return self.record.batches

    def resume_from(self, state: Mapping[str, Any], batches: int, next_batch: str = "") -> None:
        """Continue the next iteration from ``state``, ``batches`` batches into the epoch; ``next_batch``:
        the digest the first batch read must have (`first_batch` holds the outcome), ``""``: unknown."""
        if FRESH_PASS in state:  # nothing of the epoch read: a fresh pass of it, on this layout
            self.record.expect_first(next_batch)
            return
        if STREAM_ELSEWHERE in state:  # the rest of an epoch begun on another layout, in its order
            self.dataset.resume_elsewhere(state[STREAM_ELSEWHERE])
            self.record.resume(batches, copy.deepcopy(dict(state)), next_batch)
            return
        StatefulDataLoader.load_state_dict(self, copy.deepcopy(dict(state)))
        # Kept as restored: asked for before the pass, torchdata's state_dict() would start the restored
        # iterator (its workers) early, and the pass then read other batches (seen with 2 workers).
        self.record.resume(batches, copy.deepcopy(dict(state)), next_batch)

    @property
    def resumes_on_any_layout(self) -> bool:
        """Whether an epoch goes on on another world size, number of workers or batch size, in the order that began
        it: a stream whose workers' streams can be opened anywhere (a WebDataset pipeline's, a Hugging Face stream's:
        `lightning_resumable.readers.stream_elsewhere`), batched without dropping a worker's last partial batch."""
        return self.dataset.resumes_on_any_layout and not self.drop_last

    def world_size_refusal(self, saved: StreamState) -> str | None:
        """Why ``saved`` cannot resume on another world size: a stream's position is per rank, unless the
        dataset declares it global (then every rank restores rank 0's state) or reads it in its own order."""
        if saved.global_position or self.resumes_on_any_layout:
            return None
        if self.dataset.resumes_on_any_layout:  # but for drop_last
            return DROPS_LAST + f". Resume on {saved.world_size} processes, or with drop_last=False"
        return (
            "a stream's position is per rank (each rank reads its own shard), so it means other data on another"
            f" world size. Resume on {saved.world_size} processes, or give the dataset {GLOBAL_POSITION_ATTRIBUTE}"
            " = True if its state is the same on every rank"
        )

    def state_for_rank(
        self, saved: StreamState, rank: int, world_size: int, torchdata: str | None = None
    ) -> Mapping[str, Any]:
        """The loader state that ``rank`` of ``world_size`` restores (``torchdata``: the installed version).

        Raises:
            WorldSizeChangedError: another world size, and the dataset's position is per rank.
            WorkerCountChangedError: another number of workers per process.
            IncompatibleStateError: the state was written by a newer torchdata than the installed one.
            StateFormatError: a rank's state is not a loader state of that number of workers.
        """
        if self.resumes_on_any_layout:
            elsewhere = self._state_elsewhere(saved, world_size)
            if elsewhere is not None:
                return elsewhere
        refusal = self.world_size_refusal(saved)
        if world_size != saved.world_size and refusal is not None:
            raise WorldSizeChangedError(
                f"the checkpoint's stream state was written on {saved.world_size} processes and resumes on"
                f" {world_size}: {refusal}"
            )
        installed = torchdata_version() if torchdata is None else torchdata
        if saved.torchdata and torchdata_release(installed) < torchdata_release(saved.torchdata):
            raise IncompatibleStateError(
                f"the checkpoint's stream state was written with torchdata {saved.torchdata} and resumes with"
                f" torchdata {installed}: an older torchdata cannot read a newer one's StatefulDataLoader state."
                f" Install torchdata>={saved.torchdata}"
            )
        if self.num_workers != saved.num_workers:
            why = DROPS_LAST if self.dataset.resumes_on_any_layout else "each worker reads its own slice of the stream"
            raise WorkerCountChangedError(
                f"the checkpoint's stream state was written with num_workers={saved.num_workers} per process and"
                f" resumes with num_workers={self.num_workers}: {why}, so the saved worker states mean other data."
                f" Resume with num_workers={saved.num_workers}"
            )
        for each, state in enumerate(saved.ranks):  # every rank checks them all
            check_loader_state(state, saved.num_workers, each)
        return saved.ranks[rank if world_size == saved.world_size else 0]

    def _state_elsewhere(self, saved: StreamState, world_size: int) -> Mapping[str, Any] | None:
        """What every rank restores of an epoch that goes on on this layout in the order that began it
        (`STREAM_ELSEWHERE`: the place in its global sequence, the same on every rank; `FRESH_PASS` if nothing of it
        was read: the pass is this layout's own); ``None``: the saved layout's own states, restored as saved.

        Raises:
            IncompatibleStateError: one layout batched by the loader, the other by the pipeline.
            StateFormatError: a rank's state is malformed.
        """
        for each, state in enumerate(saved.ranks):
            if STREAM_ELSEWHERE not in state:
                check_loader_state(state, saved.num_workers, each)
        states: list[Mapping[str, Any]] = []  # every worker's dataset state, rank after rank
        for state in saved.ranks:
            if STREAM_ELSEWHERE in state:  # saved before the first batch of an epoch going on elsewhere: its plan
                states.append(
                    {"stream": {"epoch": saved.epoch, STREAM_ELSEWHERE: state[STREAM_ELSEWHERE]}, "yielded": 0}
                )
            else:
                states.extend(dataset_states(state, saved.num_workers))
        going_on = any(STREAM_ELSEWHERE in state["stream"] for state in states)
        layout = (world_size, self.num_workers, self.batch_size)
        if layout == (saved.world_size, saved.num_workers, saved.batch_size) and not going_on:
            begun_here = saved.batches == 0 and self.dataset.reads_in_order  # an epoch this layout begins in an order
            return {FRESH_PASS: saved.epoch} if begun_here else None
        if (self.batch_size is None) != (saved.batch_size is None):
            raise IncompatibleStateError(
                f"the checkpoint's stream was batched by {'its pipeline' if saved.batch_size is None else 'the loader'}"
                f" and the train loader now is batched by {'its pipeline' if self.batch_size is None else 'itself'}:"
                " the items of its sequence would not be the same. Batch it as the checkpoint's run did"
            )
        if not going_on and saved.batches == 0:
            return {FRESH_PASS: saved.epoch}
        first = Layout(saved.world_size, saved.num_workers, saved.batch_size or 1)
        new = Layout(world_size, self.num_workers, self.batch_size or 1)
        partitions = self.dataset.partitions
        return {STREAM_ELSEWHERE: resume_plan(states, partitions, first, saved.epoch, saved.batches, new)}

    def continues_elsewhere(self, state: Mapping[str, Any]) -> bool:
        return FRESH_PASS not in state  # a fresh pass on another layout reads that layout's own order


def recognises(loader: object) -> bool:
    """A torch loader over an ``IterableDataset``."""
    return isinstance(loader, DataLoader) and isinstance(loader.dataset, IterableDataset)


def build(loader: DataLoader[Any], options: BuildOptions, subclass: bool, dataset: Any = None) -> Built:
    """``loader`` as a `StreamLoader` (`make_stream_resumable`) over its stream (or ``dataset``, a data
    library's stream taken over); a ``DataLoader`` subclass is refused.

    Raises:
        UnsupportedLoaderError: the loader cannot be made exactly resumable; the message says why.
    """
    if subclass:
        raise UnsupportedLoaderError(
            f"train_dataloader() returned a {type(loader).__name__} over a stream; return a DataLoader or"
            " StatefulDataLoader over it"
        )
    made = make_stream_resumable(
        loader,
        dataset=dataset,
        seed=options.seed,
        rank=options.rank,
        world_size=options.num_replicas,
        seed_samples=options.seed_samples,
        restore_globals=options.restore_globals,
        epoch_source=options.epoch_source,
    )
    return Built(made, made)


_STREAM_SETTINGS = tuple(name for name in TORCH_SETTINGS if name != "in_order")
"""A stream loader's: ``in_order=False`` is refused, and torchdata 0.10's loader does not take it."""


def make_stream_resumable(
    loader: DataLoader[Any],
    *,
    seed: int,
    rank: int,
    world_size: int,
    seed_samples: bool,
    restore_globals: bool,
    epoch_source: Callable[[], int],
    dataset: Any = None,
) -> StreamLoader:
    """``loader`` (a ``DataLoader`` or ``StatefulDataLoader`` over a stateful ``IterableDataset``) as a
    `StreamLoader` over a `SeededStream`, every other setting kept.

    Raises:
        UnsupportedLoaderError: the stream has no state, or the loader has ``in_order=False`` (its order is not
            reproducible), or the stream declares an order it cannot be read in (`declared_order`).
    """
    dataset = loader.dataset if dataset is None else dataset  # (a data library's stream, taken over)
    partitions = _partitions_of(dataset, seed, seed_samples)
    unreadable = (
        "only a Hugging Face stream's, a WebDataset pipeline's and LitData's can be read on another layout"
        f" ({type(dataset).__name__}'s state is its own)"
    )
    order = declared_order(loader, dataset, None if partitions is not None else unreadable)
    taken = take_over_buffers(dataset, seed, rank, seed_samples)  # a Hugging Face shuffle buffer: windows
    if taken is not None:
        dataset = taken
    if not (callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))):
        raise UnsupportedLoaderError(
            f"the train loader reads an IterableDataset ({type(dataset).__name__}) without state_dict/load_state_dict:"
            " its position cannot be saved, and replaying it from the start would not be exact. Give it"
            " state_dict()/load_state_dict() (torchdata's Stateful protocol), as Hugging Face's"
            " datasets.IterableDataset has"
        )
    if not getattr(loader, "in_order", True):
        raise UnsupportedLoaderError(
            "a stream loader with in_order=False has no reproducible order; pass in_order=True"
        )
    stream = SeededStream(
        dataset,
        seed=seed,
        rank=rank,
        seed_globals=seed_samples,
        restore_globals=restore_globals,
        partitions=partitions,
        order=order,
        layout=Layout(world_size, loader.num_workers, loader.batch_size or 1),
    )
    return StreamLoader(
        stream,
        snapshot_every_n_steps=1,  # every worker's state with every batch: a restore replays nothing
        epoch_source=epoch_source,
        **forwarded_settings(loader, _STREAM_SETTINGS),
    )


def _partitions_of(dataset: Any, seed: int, seed_samples: bool) -> Partitions | None:
    """What opens ``dataset``'s first-layout workers' streams anywhere (`lightning_resumable.readers.stream_elsewhere`):
    a WebDataset pipeline taken over is its own; a Hugging Face stream's are ``datasets``' splits; ``None`` for a
    stream of the user's, whose state the library cannot read another layout's order from."""
    if callable(getattr(dataset, "place_of", None)) and callable(getattr(dataset, "maker", None)):
        return dataset  # type: ignore[no-any-return]
    return hf_partitions(dataset, seed, seed_samples)

"""LitData (``litdata``): the one module that imports it, imported only when a train loader holds LitData.

Promise: `make_litdata_resumable` turns the user's LitData ``StreamingDataLoader`` over a
``StreamingDataset`` into a `LitDataLoader`, every setting kept, which a `StreamOwner` owns:

- its state is LitData's own (``StreamingDataLoader.state_dict``: the samples each rank has read,
  the worker whose batch comes next, the epoch), recorded before each batch, so that the state at the
  trainer's count of completed batches is known after Lightning has read one batch ahead; Lightning
  does not see it (it would save the look-ahead's state, and LitData's loader then replayed the
  interrupted epoch's tail as the next epoch);
- each sample is read under a seed keyed by the run's seed, the epoch and the sample's index in the
  dataset, so augmentations drawn from the global generators are the same after a resume;
- LitData's epoch is the trainer's (LitData counts from 1: ``current_epoch`` is the trainer's + 1).

Private LitData API and behaviour, tested against the version CI installs
(``tests/test_litdata_internals.py``, ``tests/e2e/test_litdata.py``): ``ChunkedIndex.index`` (the
sample's index, which ``StreamingDataset.__next__`` hands to ``__getitem__``);
``StreamingDataLoader.restore`` (set by ``load_state_dict``: the next pass continues the loaded
state); and ``StreamingDataset.state_dict`` overwriting a loaded state not yet applied with its own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
from litdata.streaming.sampler import ChunkedIndex
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resumable.core.chunks import DEFAULT_WINDOW
from lightning_resumable.core.seeded_library_dataset import seed_each_sample
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.format.envelope import StreamState
from lightning_resumable.internals._litdata import copy_of_loader_state
from lightning_resumable.internals._torchdata import take_iterator
from lightning_resumable.readers import mixture as mixture_reader
from lightning_resumable.readers.base import BuildOptions, Built, StreamReader
from lightning_resumable.readers.elsewhere_plan import declared_order
from lightning_resumable.readers.libraries import LIBRARIES, is_of
from lightning_resumable.readers.litdata_chunks import LitDataChunkReader
from lightning_resumable.readers.litdata_combined import (
    combined_as_mixture,
    mixture_to_write,
    source_names,
    users_collate_fn,
)
from lightning_resumable.readers.litdata_elsewhere import (
    ELSEWHERE,
    Remainder,
    RemainderSamples,
    declared_epoch,
    rest_of_epoch,
)
from lightning_resumable.readers.recording import FRESH_PASS, PassRecord
from lightning_resumable.readers.settings import DATA_LIBRARY_SETTINGS, forwarded_settings
from lightning_resumable.readers.stream_elsewhere import Layout
from lightning_resumable.readers.workers import ForkingEachPass, retire, warn_once_on_affected_python

__all__ = [
    "LIBRARY",
    "LitDataChunkReader",
    "LitDataLoader",
    "build",
    "make_litdata_resumable",
    "mixture_source",
    "recognises",
]

LIBRARY = LIBRARIES["litdata"]


def recognises(loader: object) -> bool:
    """LitData's loader, or a torch ``DataLoader`` or ``StatefulDataLoader`` over LitData's dataset."""
    dataset = getattr(loader, "dataset", None)
    torch_loader = type(loader) in (DataLoader, StatefulDataLoader)
    over_litdata = isinstance(dataset, (StreamingDataset, CombinedStreamingDataset))
    return is_of(loader, "litdata", "StreamingDataLoader") or (torch_loader and over_litdata)


def build(loader: Any, options: BuildOptions) -> Built:
    if isinstance(loader.dataset, CombinedStreamingDataset) and not loader.dataset._iterate_over_all:
        mixture, settings = combined_as_mixture(loader)
        # Keyed by the run's seed, as every loader the library builds: a resume restores the run's seed from
        # the data state, which seeds each step too (the combined dataset's own seed is LitData's, 42 by default).
        return mixture_reader.build(DataLoader(mixture, **settings), options, False)
    made = make_litdata_resumable(loader, **options.library_loader_keywords())
    return Built(made, made)


def mixture_source(dataset: StreamingDataset, window: int) -> LitDataChunkReader:
    """LitData's dataset as a `Mixture` reads it (`lightning_resumable.readers.base.Adapter.mixture_source`)."""
    return LitDataChunkReader(dataset, window)


def _epoch_of(dataset: StreamingDataset) -> int:
    return int(dataset.current_epoch)


def _node_count(dataset: Any) -> int:
    """The nodes LitData deals a ``StreamingDataset``'s chunks to (detected at its construction: the world size over
    a node's GPUs); a combined dataset declares no order."""
    return int(dataset.distributed_env.num_nodes) if isinstance(dataset, StreamingDataset) else 1


def _index_of(key: Any) -> int:
    return int(key.index) if isinstance(key, ChunkedIndex) else int(key)


class LitDataLoader(ForkingEachPass, StreamReader, StreamingDataLoader):  # type: ignore[misc]  # litdata is untyped
    """LitData's ``StreamingDataLoader``, whose state the callback takes at the trainer's count of batches."""

    reader = "litdata"
    library = LIBRARY.name

    def __init__(
        self,
        *args: Any,
        epoch_source: Callable[[], int] = lambda: 0,
        rank: int = 0,
        world_size: int = 1,
        order: Layout | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.start_reading(PassRecord("LitData's loader", self._state), epoch_source)
        self._fresh_epoch: int | None = None  # the epoch of a pass that starts afresh
        self.rank, self.world_size = rank, world_size
        self._remainder: Remainder | None = None  # an interrupted epoch's rest (or a declared order's), read here
        # The layout the dataset declares every fresh epoch read in (`declared_order`), unless it is this one on one
        # node: a declared order is the layout's plan on one node, and LitData deals chunks by node.
        own = order == Layout(world_size, self.num_workers, int(self.batch_size)) and _node_count(self.dataset) == 1
        self._order = None if own else order
        self._planned: tuple[int, Remainder] | None = None  # the last epoch planned in that order

    @property
    def resumes_on_any_layout(self) -> bool:
        """A ``StreamingDataset``'s epoch resumes on another world size, number of workers or batch size
        (`lightning_resumable.readers.litdata_elsewhere`); a combined dataset's on its own layout only."""
        return isinstance(self.dataset, StreamingDataset)

    @property
    def resumed_elsewhere(self) -> bool:
        """Whether this loader's epoch went on on another layout than the one that began it (the next epochs are
        counted on this layout: Lightning builds the loader again)."""
        return self._remainder is not None

    def __len__(self) -> int:
        if self._remainder is not None:  # the epoch's batches before the resume, then the rest's on this layout
            return self._remainder.at.batches + self._remainder.steps
        if self._order is not None and not self.record.resuming:  # a fresh epoch in the declared order
            return self._declared(self.epoch_source() if self._next_epoch is None else self._next_epoch).steps
        return int(super().__len__())

    def _declared(self, epoch: int) -> Remainder:
        """The trainer's ``epoch`` in the declared layout's order, dealt to this layout (LitData counts from 1); the
        last one planned is kept (Lightning asks the length more than once an epoch, and a plan is O(samples))."""
        assert self._order is not None
        if self._planned is None or self._planned[0] != epoch:
            batch_size = int(self.batch_size)
            planned = declared_epoch(self.dataset, self._order, epoch + 1, self.rank, self.world_size, batch_size)
            self._planned = epoch, planned
        return self._planned[1]

    def world_size_refusal(self, saved: StreamState) -> str | None:
        return None if self.resumes_on_any_layout else super().world_size_refusal(saved)

    def state_for_rank(self, saved: StreamState, rank: int, world_size: int) -> Mapping[str, Any]:
        """LitData's own state on the layout that wrote it; on another, the epoch's place in its global sequence
        (`Elsewhere`), unless nothing of it was read (a fresh pass) or all of it. The rest of an epoch going on on
        another layout is dealt here, so that the loader's length counts it before the restore asks."""
        layout = (world_size, self.num_workers, self.batch_size)
        if not self.resumes_on_any_layout or (saved.world_size, saved.num_workers, saved.batch_size) == layout:
            state = super().state_for_rank(saved, rank, world_size)
            if ELSEWHERE not in state or saved.finished:
                return state
        elif FRESH_PASS in saved.ranks[0] or saved.finished:  # nothing read (a fresh pass) or all: LitData's own
            return saved.ranks[0]
        self._remainder = rest_of_epoch(self.dataset, saved, rank, world_size, int(self.batch_size))
        return self._remainder.state_after(saved.batches)

    def continues_elsewhere(self, state: Mapping[str, Any]) -> bool:
        return FRESH_PASS not in state  # a fresh pass on another layout reads LitData's own order there

    def __iter__(self) -> Iterator[Any]:
        if self._remainder is not None and self.record.resuming:
            return self._read_remainder(self._remainder)
        self._remainder = None  # an epoch that went on elsewhere is over: LitData's own epochs on this layout
        if self._order is not None and not self.record.resuming:  # unless the dataset declares another's order
            epoch = self.pass_epoch()
            self._remainder = self._declared(epoch)
            return self._read_remainder(self._remainder, fresh=epoch)
        # The pass continues a restored state only right after `resume_from`. LitData clears its
        # ``restore`` flag only when a pass runs out, and Lightning stops a sized loader's pass at its
        # length without exhausting it: LitData then replayed the interrupted epoch's tail.
        self.restore = self.record.resuming
        previous_epoch, previous_batches = self.record.epoch, self.record.batches
        epoch = self.pass_epoch()
        if self.persistent_workers and self.num_workers > 0:
            # Kept workers read the next pass from their own copies of the dataset, whose epoch LitData adds 1 to
            # as each worker runs out: right only after a whole epoch read, and never for a restored state.
            whole = not self.restore and epoch == previous_epoch + 1 and previous_batches >= len(self)
            kept = None if whole else take_iterator(self)
            if kept is not None:
                retire(kept)
        self._fresh_epoch = None if self.restore else epoch
        if not self.restore:  # LitData adds 1 at each fresh pass: its epochs count from 1
            self.current_epoch = epoch
        warn_once_on_affected_python(self)
        # Without workers the samples (and their seeds) are read in this process, in next().
        return self.record.record(super().__iter__(), restore_globals=self.num_workers == 0 and self.puts_back_globals)

    def _read_remainder(self, remainder: Remainder, fresh: int | None = None) -> Iterator[Any]:
        """The interrupted epoch's rest on this layout (or the ``fresh`` epoch, its pass begun, in a declared order),
        each sample read by its chunk and index under its seed."""
        if fresh is None:
            self.pass_epoch()
        self._fresh_epoch = fresh
        self.dataset.current_epoch = remainder.at.epoch  # the samples' seeds are keyed by LitData's epoch
        samples = RemainderSamples(LitDataChunkReader(self.dataset, DEFAULT_WINDOW), remainder.pairs)
        # One pass: its workers are not kept (the loader is built again for the next epoch).
        settings = forwarded_settings(
            self, DATA_LIBRARY_SETTINGS, collate_fn=users_collate_fn(self), persistent_workers=False
        )
        loader = DataLoader(samples, **settings)
        warn_once_on_affected_python(loader)
        iterator = self.make_iterator(lambda: iter(loader))
        return self.record.record(iterator, restore_globals=self.num_workers == 0 and self.puts_back_globals)

    def _state(self) -> dict[str, Any]:
        if self._remainder is not None:
            return self._remainder.state_after(self.record.batches)
        state: dict[str, Any] = copy_of_loader_state(StreamingDataLoader.state_dict(self))
        return state

    def state_after(self, batches: int) -> dict[str, Any]:
        """LitData's state after ``batches`` batches of the epoch; after none of a fresh pass, or before any pass began
        (a save in the fit's setup), `FRESH_PASS`: LitData starts a pass at its first batch (its ``__iter__`` is a
        generator), and its state before then is the last pass's end or its epoch's place before any (a resume from it
        read nothing; on another layout it read the first layout's plan of another epoch)."""
        if batches == 0 and self._fresh_epoch is not None:
            return {FRESH_PASS: self._fresh_epoch}
        if batches == 0 and not self.record.started and not self.record.resuming:  # saved before any pass began
            return {FRESH_PASS: self.epoch_source() if self._next_epoch is None else self._next_epoch}
        return super().state_after(batches)

    def resume_from(self, state: Mapping[str, Any], batches: int, next_batch: str = "") -> None:
        """Continue the next pass from LitData's ``state``, ``batches`` batches into the epoch (or from an
        `Elsewhere`: the epoch's rest on this layout)."""
        if ELSEWHERE in state:
            assert self._remainder is not None, "the rest of the epoch is dealt by state_for_rank, which restores call"
            self.record.resume(batches, self._remainder.state_after(batches), next_batch)
            return
        if FRESH_PASS in state:  # none read yet: a fresh pass of that epoch, its first batch still verified
            self._fresh_epoch = int(state[FRESH_PASS])
            self.start_epoch(self._fresh_epoch)
            self.record.expect_first(next_batch)
            return
        restored = copy.deepcopy(dict(state))
        StreamingDataLoader.load_state_dict(self, restored)
        if isinstance(self.dataset, StreamingDataset):
            # Its workers resume the state's epoch; this process's copy keeps its own (``set_epoch`` leaves a
            # restored one be) and wrote it in the next save: a resume of the resumed pass read another epoch.
            self.dataset.current_epoch = restored["dataset"]["current_epoch"]
        # Kept as restored: LitData's state_dict() would overwrite the pending one with its own.
        self.record.resume(batches, copy.deepcopy(dict(state)), next_batch)

    def start_epoch(self, epoch: int) -> None:
        """Make the next pass a fresh one of ``epoch`` (a resume after an epoch's last batch): LitData's own, whose
        length Lightning counts (a rest dealt for the ended epoch, of no batch, is dropped: its length was the ended
        epoch's, and the next epoch ran that many batches of the new layout's)."""
        self.restore = False
        self._remainder = None
        super().start_epoch(epoch)


def make_litdata_resumable(
    loader: Any,
    *,
    seed: int,
    epoch_source: Callable[[], int],
    rank: int = 0,
    world_size: int = 1,
    seed_samples: bool = True,
    restore_globals: bool = True,
) -> LitDataLoader:
    """``loader`` (LitData's ``StreamingDataLoader``, or a torch ``DataLoader`` or ``StatefulDataLoader``,
    over a ``StreamingDataset`` or a ``CombinedStreamingDataset`` of them) as a `LitDataLoader`: a torch
    loader cannot hand LitData's dataset the counts its ``state_dict`` needs; LitData's loader can.
    ``seed_samples``, ``restore_globals``: `BuildOptions`' (each sample seeded; without workers, the generators put back
    after each batch).

    Raises:
        UnsupportedLoaderError: the dataset is a ``ParallelStreamingDataset`` (or another), or a
            ``CombinedStreamingDataset`` read by workers; the loader has persistent workers; or a torch
            loader drops its last batch (LitData's ``drop_last`` is the dataset's: pass it there).
    """
    dataset = loader.dataset
    own = isinstance(loader, StreamingDataLoader)
    if not own and loader.drop_last:
        raise UnsupportedLoaderError(
            "a torch DataLoader(drop_last=True) over LitData's StreamingDataset: LitData's loader, which this"
            " library reads it through, has no such option; pass drop_last to the StreamingDataset instead"
        )
    combined = isinstance(dataset, CombinedStreamingDataset)
    datasets = list(dataset._datasets) if combined else [dataset]  # a combined dataset's own: private
    if not all(isinstance(each, StreamingDataset) for each in datasets):
        raise UnsupportedLoaderError(
            f"LitData's StreamingDataLoader over a {type(dataset).__name__} is not resumed yet; over a"
            " StreamingDataset, or a CombinedStreamingDataset of them, it is"
        )
    if combined and loader.num_workers > 0:
        names = source_names(datasets)
        weights = [float(weight) for weight in dataset._weights]
        raise UnsupportedLoaderError(
            "LitData's CombinedStreamingDataset(iterate_over_all=True) with num_workers > 0: LitData's state sums"
            " each dataset's count over the workers, and its resume then reads other samples (seen: a sample"
            " trained twice and another never, 2 workers). It resumes exactly with num_workers=0; with workers,"
            " pass iterate_over_all=False (read as a Mixture, exact with any workers and world size), or write "
            + mixture_to_write(names, weights, loader, shuffle=any(each.shuffle for each in datasets))
        )
    for stream, each in enumerate(datasets):  # a combined dataset's samples share their indices
        seed_each_sample(each, seed, _epoch_of, _index_of, stream, seed_samples)
    collate_fn = loader.collate_fn.collate_fn if own else loader.collate_fn  # LitData's wraps the user's
    settings = forwarded_settings(loader, DATA_LIBRARY_SETTINGS, collate_fn=collate_fn)
    order = declared_order(loader, dataset, "a CombinedStreamingDataset's order is its own" if combined else None)
    made = LitDataLoader(dataset, epoch_source=epoch_source, rank=rank, world_size=world_size, order=order, **settings)
    made.puts_back_globals = seed_samples and restore_globals
    return made

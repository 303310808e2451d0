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

import bisect
import collections
import copy
from collections.abc import Callable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
from litdata.streaming import dataloader as litdata_dataloader
from litdata.streaming.item_loader import ParquetLoader, TokensLoader
from litdata.streaming.sampler import ChunkedIndex
from litdata.utilities.env import _WorkerEnv
from torch.utils.data import DataLoader, default_collate
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resumable.core import randomness
from lightning_resumable.core.mixture import Mixture
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.internals._litdata import copy_of_loader_state
from lightning_resumable.readers import mixture as mixture_reader
from lightning_resumable.readers.base import BuildOptions, Built, StreamReader
from lightning_resumable.readers.libraries import LIBRARIES, is_of
from lightning_resumable.readers.recording import PassRecord
from lightning_resumable.readers.settings import DATA_LIBRARY_SETTINGS, forwarded_settings, kept_workers
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
    made = make_litdata_resumable(loader, seed=options.seed, epoch_source=options.epoch_source)
    return Built(made, made)


def source_names(datasets: list[Any]) -> list[str]:
    """A name for each of a combined dataset's datasets: its directory's last part, numbered where two share it."""
    names = [
        PurePosixPath(str(each.input_dir.url or each.input_dir.path or "source").rstrip("/")).name for each in datasets
    ]
    return [f"{name}-{number}" if names.count(name) > 1 else name for number, name in enumerate(names)]


def _users_collate_fn(loader: Any) -> Any:
    """The collation the user gave ``loader`` (LitData's loader wraps it in its own)."""
    return loader.collate_fn.collate_fn if isinstance(loader, StreamingDataLoader) else loader.collate_fn


def _written(names: list[str], weights: list[float], loader: Any, shuffle: bool) -> str:
    sources = ", ".join(f"{name!r}: StreamingDataset(...)" for name in names)
    shares = ", ".join(f"{name!r}: {weight:.4g}" for name, weight in zip(names, weights, strict=True))
    collate_fn = _users_collate_fn(loader)
    defaults = (default_collate, getattr(litdata_dataloader, "litdata_collate", default_collate))
    collation = "" if collate_fn in defaults else f", collate_fn={getattr(collate_fn, '__qualname__', collate_fn)}"
    return (
        f"DataLoader(Mixture({{{sources}}}, {{{shares}}}{'' if shuffle else ', shuffle=False'}),"
        f" batch_size={loader.batch_size}, num_workers={loader.num_workers}{collation})"
    )


def combined_as_mixture(loader: Any) -> tuple[Mixture, dict[str, Any]]:
    """A loader over a ``CombinedStreamingDataset(datasets, weights, seed, iterate_over_all=False)`` as the
    equivalent `Mixture` (its datasets by `source_names`, its weights; read chunk by chunk) and the
    settings of the torch loader that reads it (batch size, workers, collation: the user's).

    Raises:
        UnsupportedLoaderError: what the mixture cannot honour (batches of one dataset each, datasets
            shuffled and not, a DataLoader subclass), printing the loader to write instead.
    """
    combined = loader.dataset
    datasets, weights = list(combined._datasets), [float(weight) for weight in combined._weights]
    names = source_names(datasets)
    shuffles = {bool(each.shuffle) for each in datasets}
    written = _written(names, weights, loader, shuffle=True in shuffles)
    why = ""
    if combined._batching_method != "stratified":
        why = f"batching_method={combined._batching_method!r} (a Mixture mixes its sources within each batch)"
    elif len(shuffles) > 1:
        why = "datasets of which some shuffle and some do not (a Mixture shuffles all its sources or none)"
    elif not all(isinstance(each, StreamingDataset) for each in datasets):
        why = "a dataset that is not a StreamingDataset"
    if why:
        raise UnsupportedLoaderError(
            f"LitData's CombinedStreamingDataset with {why} cannot be read as a Mixture; write {written}"
        )
    collate_fn = _users_collate_fn(loader)
    mixture = Mixture(
        dict(zip(names, datasets, strict=True)), dict(zip(names, weights, strict=True)), shuffle=True in shuffles
    )
    return mixture, forwarded_settings(loader, DATA_LIBRARY_SETTINGS, collate_fn=collate_fn, **kept_workers(loader))


def mixture_source(dataset: StreamingDataset, window: int) -> LitDataChunkReader:
    """LitData's dataset as a `Mixture` reads it (`lightning_resumable.readers.base.Adapter.mixture_source`)."""
    return LitDataChunkReader(dataset, window)


class LitDataChunkReader:
    """LitData's ``StreamingDataset`` as a `Mixture` reads it: by an index that names the chunk, each chunk
    fetched once and held while this process reads it.

    LitData's own read treats a change of chunk as the end of the previous one (a file-locked release,
    its memory map closed), which a mixture's window, read in a permuted order, makes at nearly every
    sample (measured: 14 times slower). Here a process holds the last ``2 * window`` chunks it read (a
    window and the next) and releases a chunk as LitData's read does when it falls out, so a bounded
    cache (``max_cache_size``) may delete it. The chunk table is taken in the process that reads, as
    LitData's ``__getitem__`` takes it; the dataset's own ``__getitem__`` (a user's subclass) is called.
    """

    def __init__(self, dataset: StreamingDataset, window: int) -> None:
        self.dataset, self.held = dataset, 2 * window
        self._firsts: list[int] = []
        self._intervals: list[Any] = []

    def __len__(self) -> int:  # all its samples: LitData's len is one rank's share under DDP
        return sum(int(end) - int(start) for start, end in self.dataset.region_of_interest)

    def __getitem__(self, index: int) -> Any:
        if not self._intervals:
            self._start_reading()
        chunk = bisect.bisect_right(self._firsts, index) - 1
        return self.dataset[ChunkedIndex(int(self._intervals[chunk][1]) + index - self._firsts[chunk], chunk)]

    def _start_reading(self) -> None:
        dataset = self.dataset
        if dataset.cache is None:  # as LitData's __getitem__ makes it
            dataset.worker_env = _WorkerEnv.detect()
            dataset.cache = dataset._create_cache(worker_env=dataset.worker_env)
        if not isinstance(dataset.cache, _HeldChunks):
            dataset.cache = _HeldChunks(dataset.cache, self.held)
        self._intervals, first = list(dataset.cache.get_chunk_intervals()), 0
        for interval in self._intervals:
            self._firsts.append(first)
            first += int(interval[2]) - int(interval[1])

    def __getstate__(self) -> dict[str, Any]:  # a worker takes the table in its own process
        return {"dataset": self.dataset, "held": self.held, "_firsts": [], "_intervals": []}


class _HeldChunks:
    """LitData's ``Cache`` whose reads by ``ChunkedIndex`` hold the last ``held`` chunks (private LitData API:
    its reader's config, download request, item loader and release, as ``BinaryReader.read`` uses them)."""

    def __init__(self, cache: Any, held: int) -> None:
        self._cache, self._held, self._open = cache, held, collections.OrderedDict[int, None]()

    def __getattr__(self, name: str) -> Any:
        if name == "_cache":  # not set yet (unpickling, in a worker not forked): don't recurse
            raise AttributeError(name)
        return getattr(self._cache, name)

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, ChunkedIndex):
            return self._cache[index]
        reader = self._cache._reader
        if reader._config is None and reader._try_load_config() is None:
            raise RuntimeError(f"LitData's index of {self._cache._cache_dir} cannot be read")
        chunk = index.chunk_index
        if chunk in self._open:
            self._open.move_to_end(chunk)
        else:
            reader.setup_thread_and_download_chunk(index)  # fetched (and counted as in use) if remote
            self._open[chunk] = None
            while len(self._open) > self._held:
                self._release(reader, self._open.popitem(last=False)[0])
        path, begin, size = reader.config[index]
        if reader._pytree_loader:
            return reader._item_loader.load_item_from_chunk(index.index, chunk, path, begin, size, reader._encryption)
        return reader._item_loader.load_item_from_chunk(index.index, chunk, path, begin, size)

    @staticmethod
    def _release(reader: Any, chunk: int) -> None:
        config = reader._config
        if (config._remote_dir or config._compressor) and reader._prepare_thread is not None:
            reader._prepare_thread._decrement_local_lock(chunk)
            reader._held_shared.discard(chunk)
            reader._prepare_thread.delete([chunk])
        if isinstance(reader._item_loader, (TokensLoader, ParquetLoader)):
            reader._item_loader.close(chunk)


FRESH_PASS = "lightning_resumable.fresh_pass"
"""The key of the state a `LitDataLoader` records after no batch of a fresh pass: the pass's epoch."""


def _epoch_of(dataset: StreamingDataset) -> int:
    return int(dataset.current_epoch)


def _index_of(key: Any) -> int:
    return int(key.index) if isinstance(key, ChunkedIndex) else int(key)


class LitDataLoader(ForkingEachPass, StreamReader, StreamingDataLoader):  # type: ignore[misc]  # litdata is untyped
    """LitData's ``StreamingDataLoader``, whose state the callback takes at the trainer's count of batches."""

    reader = "litdata"
    library = LIBRARY.name

    def __init__(self, *args: Any, epoch_source: Callable[[], int] = lambda: 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_reading(PassRecord("LitData's loader", self._state), epoch_source)
        self._fresh_epoch: int | None = None  # the epoch of a pass that starts afresh

    def __iter__(self) -> Iterator[Any]:
        # The pass continues a restored state only right after `resume_from`. LitData clears its
        # ``restore`` flag only when a pass runs out, and Lightning stops a sized loader's pass at its
        # length without exhausting it: LitData then replayed the interrupted epoch's tail.
        self.restore = self.record.resuming
        previous_epoch, previous_batches = self.record.epoch, self.record.batches
        epoch = self.pass_epoch()
        kept: Any = getattr(self, "_iterator", None)  # torch's iterator whose workers a persistent loader keeps
        if self.persistent_workers and self.num_workers > 0 and kept is not None:
            # Kept workers read the next pass from their own copies of the dataset, whose epoch LitData adds 1 to
            # as each worker runs out: right only after a whole epoch read, and never for a restored state.
            whole = not self.restore and epoch == previous_epoch + 1 and previous_batches >= len(self)
            if not whole:
                retire(kept)
                self._iterator = None
        self._fresh_epoch = None if self.restore else epoch
        if not self.restore:  # LitData adds 1 at each fresh pass: its epochs count from 1
            self.current_epoch = epoch
        warn_once_on_affected_python(self)
        # Without workers the samples (and their seeds) are read in this process, in next().
        return self.record.record(super().__iter__(), restore_globals=self.num_workers == 0)

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = copy_of_loader_state(StreamingDataLoader.state_dict(self))
        return state

    def state_after(self, batches: int) -> dict[str, Any]:
        """LitData's state after ``batches`` batches of the epoch; after none of a fresh pass, `FRESH_PASS`: LitData
        starts a pass at its first batch (its ``__iter__`` is a generator), and its state before then is the last
        pass's end (a resume from it read nothing)."""
        if batches == 0 and self._fresh_epoch is not None:
            return {FRESH_PASS: self._fresh_epoch}
        return super().state_after(batches)

    def resume_from(self, state: Mapping[str, Any], batches: int, next_batch: str = "") -> None:
        """Continue the next pass from LitData's ``state``, ``batches`` batches into the epoch."""
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
        """Make the next pass a fresh one of ``epoch`` (a resume after an epoch's last batch)."""
        self.restore = False
        super().start_epoch(epoch)


def make_litdata_resumable(loader: Any, *, seed: int, epoch_source: Callable[[], int]) -> LitDataLoader:
    """``loader`` (LitData's ``StreamingDataLoader``, or a torch ``DataLoader`` or ``StatefulDataLoader``,
    over a ``StreamingDataset`` or a ``CombinedStreamingDataset`` of them) as a `LitDataLoader`: a torch
    loader cannot hand LitData's dataset the counts its ``state_dict`` needs; LitData's loader can.

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
            + _written(names, weights, loader, shuffle=any(each.shuffle for each in datasets))
        )
    for stream, each in enumerate(datasets):  # a combined dataset's samples share their indices
        randomness.seed_each_sample(each, seed, _epoch_of, _index_of, stream)
    collate_fn = loader.collate_fn.collate_fn if own else loader.collate_fn  # LitData's wraps the user's
    settings = forwarded_settings(loader, DATA_LIBRARY_SETTINGS, collate_fn=collate_fn, **kept_workers(loader))
    return LitDataLoader(dataset, epoch_source=epoch_source, **settings)

"""MosaicML Streaming (``streaming``): the one module that imports it, imported only when a train loader holds it.

Promise: `make_mosaic_resumable` turns the user's Mosaic ``StreamingDataLoader`` (or torch
``DataLoader``) over a ``StreamingDataset`` into a `MosaicLoader`, every setting kept, which a
`StreamOwner` owns:

- its state is Mosaic's own (as ``StreamingDataset.state_dict`` makes it: the epoch, the samples all
  ranks have consumed in it, the shuffle's seed and canonical nodes), computed from the trainer's
  count of completed batches, not from what the loader has read (Lightning reads one batch ahead),
  and handed to the dataset (``load_state_dict``) before each pass's workers start;
- Mosaic's epoch is the trainer's: Mosaic counts its passes in memory shared by the node's processes,
  and a pass Lightning starts again would be counted as the next epoch;
- each sample is read under a seed keyed by the run's seed, the epoch and the sample's index in the
  dataset, so augmentations drawn from the global generators are the same after a resume;
- Mosaic's order is one global sequence for a fixed ``num_canonical_nodes``, whatever the layout: step after step,
  the next global batch of it (Mosaic's partition deals each step's samples among the ranks). A resume on another
  world size or batch size (issue 55) goes on from the checkpoint's count in global batches of the new layout; the
  resumed epoch's length is the batches before the resume and the rest's, counted again on this layout at its end
  (the loader kept: Lightning asks its length anew).

Mosaic reads its world from the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) when the
dataset is built. Lightning's own launcher sets none of them but ``WORLD_SIZE``, so every rank would
read rank 0's samples: the world the dataset saw is compared with the trainer's and a difference is
refused (`set_mosaic_environment` sets them; ``torchrun`` does too).

Private Mosaic API and behaviour, tested against the version CI installs
(``tests/test_mosaic_internals.py``, ``tests/e2e/test_mosaic.py``): ``StreamingDataset._unique_rank_world``
(the world the dataset saw); the defaults its first pass settles (`order_of`); and a pass reading its
epoch and position from what ``load_state_dict`` and ``next_epoch`` put in shared memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from streaming import StreamingDataLoader, StreamingDataset
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resumable.core.seeded_library_dataset import seed_each_sample
from lightning_resumable.errors import IncompatibleStateError, UnsupportedLoaderError
from lightning_resumable.format.envelope import StreamState
from lightning_resumable.readers.base import BuildOptions, Built, StreamReader
from lightning_resumable.readers.libraries import LIBRARIES, is_of
from lightning_resumable.readers.recording import PassRecord
from lightning_resumable.readers.settings import DATA_LIBRARY_SETTINGS, forwarded_settings
from lightning_resumable.readers.workers import ForkingEachPass, warn_once_on_affected_python

__all__ = ["LIBRARY", "MosaicLoader", "build", "make_mosaic_resumable", "mixture_source", "recognises"]

LIBRARY = LIBRARIES["streaming"]


def mixture_source(dataset: StreamingDataset, window: int) -> StreamingDataset:
    """Mosaic's dataset as a `Mixture` reads it: itself (its ``get_item`` fetches a whole shard into its
    node-wide cache; `lightning_resumable.readers.base.Adapter.mixture_source`)."""
    return dataset


def recognises(loader: object) -> bool:
    """Mosaic's loader, or a torch ``DataLoader`` or ``StatefulDataLoader`` over Mosaic's dataset."""
    torch_loader = type(loader) in (DataLoader, StatefulDataLoader)
    over_mosaic = isinstance(getattr(loader, "dataset", None), StreamingDataset)
    return is_of(loader, "streaming", "StreamingDataLoader") or (torch_loader and over_mosaic)


def build(loader: Any, options: BuildOptions) -> Built:
    made = make_mosaic_resumable(loader, **options.library_loader_keywords())
    return Built(made, made)


_EPOCH = "_lightning_resumable_epoch"
"""The dataset's attribute holding the pass's epoch: a tensor in shared memory, which every worker's copy shares,
so that workers kept from pass to pass (``persistent_workers=True``) read each pass's epoch too."""


def _epoch_of(dataset: StreamingDataset) -> int:
    epoch = getattr(dataset, _EPOCH, None)
    return 0 if epoch is None else int(epoch)


class MosaicLoader(ForkingEachPass, StreamReader, StreamingDataLoader):  # type: ignore[misc]  # streaming is untyped
    """Mosaic's ``StreamingDataLoader``, whose state the callback computes at the trainer's count of batches."""

    reader = "mosaic"
    library = LIBRARY.name
    resumable_global_position = True  # one global count, the same on every rank, on any layout

    def __init__(
        self, *args: Any, epoch_source: Callable[[], int] = lambda: 0, world_size: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.start_reading(PassRecord("Mosaic's loader", state=None), epoch_source)
        self.world_size, self.epoch = world_size, 0
        self._resume: dict[str, Any] | None = None  # Mosaic's state the next pass continues
        self._order = order_of(self.dataset)  # Mosaic's state but the position: a resume takes the saved one
        # A resumed epoch on another global batch: (its epoch, the batches and samples consumed at the resume), and
        # its length, in batches of the saving layout before the resume and of this one after.
        self._anchor: tuple[int, int, int] | None = None
        self._resumed_length: int | None = None

    def __len__(self) -> int:
        return int(super().__len__()) if self._resumed_length is None else self._resumed_length

    @property
    def counted_anew_at_epoch_end(self) -> bool:
        """Whether Lightning must count the next epoch's batches anew (this one's were the resumed epoch's)."""
        return self._resumed_length is not None

    def count_anew(self) -> None:
        """The resumed epoch is over: the loader's length is Mosaic's own again."""
        self._resumed_length = None

    def __iter__(self) -> Iterator[Any]:
        dataset = self.dataset
        self.epoch = self.pass_epoch()
        resume, self._resume = self._resume, None
        if resume is None:  # a fresh pass: Mosaic's own count and length
            self._anchor = self._resumed_length = None
        shared_epoch(dataset).fill_(self.epoch)  # before the workers read the pass
        # Mosaic's pass reads its epoch and position from the node's shared memory: both are set
        # here, for every pass, as the same values on every rank.
        state = resume or {**self._order, "epoch": self.epoch, "sample_in_epoch": 0}
        dataset.next_epoch = self.epoch
        StreamingDataset.load_state_dict(dataset, state)
        warn_once_on_affected_python(self)
        # Without workers the samples (and their seeds) are read in this process, in next().
        return self.record.record(super().__iter__(), restore_globals=self.num_workers == 0 and self.puts_back_globals)

    def state_after(self, batches: int) -> dict[str, Any]:
        """Mosaic's state after ``batches`` batches of the current epoch on every rank: the same on all."""
        if self._resume is not None:  # restored, and not iterated yet
            return dict(self._resume)
        consumed = batches * self._global_batch
        if self._anchor is not None and self._anchor[0] == self.epoch:  # resumed on another global batch
            _, at, samples = self._anchor
            consumed = samples + (batches - at) * self._global_batch
        return {**self._order, "epoch": self.epoch, "sample_in_epoch": consumed}

    @property
    def _global_batch(self) -> int:
        return int(self.batch_size) * self.world_size

    def state_for_rank(self, saved: StreamState, rank: int, world_size: int) -> Mapping[str, Any]:
        """Mosaic's state (the same on every rank); on another global batch, the resumed epoch's length counted here,
        before Lightning asks the loader's length: the batches before the resume, then the rest's on this layout.

        Raises:
            IncompatibleStateError: the samples consumed do not divide among this run's nodes (Mosaic would round
                the count down, and train samples again).
        """
        state = super().state_for_rank(saved, rank, world_size)
        consumed, nodes = int(state["sample_in_epoch"]), seen_world(self.dataset)[2]
        if consumed % nodes:
            raise IncompatibleStateError(
                f"MosaicML Streaming's state has consumed {consumed} samples of epoch {state['epoch']}, which do not"
                f" divide among this run's {nodes} nodes: Mosaic would round the count down to a multiple of them and"
                " train samples again. Resume on a number of nodes that divides it"
            )
        self._anchor = self._resumed_length = None
        if consumed != saved.batches * self._global_batch:
            self._anchor = (int(state["epoch"]), saved.batches, consumed)
            self._resumed_length = saved.batches + self._batches_of(max(int(self.dataset.epoch_size) - consumed, 0))
        return state

    def _batches_of(self, samples: int) -> int:
        """The batches a rank reads of ``samples`` of the epoch's global sequence, as Mosaic's length counts them."""
        per_rank = math.ceil(samples / self.world_size)
        return per_rank // int(self.batch_size) if self.drop_last else math.ceil(per_rank / int(self.batch_size))

    def start_epoch(self, epoch: int) -> None:
        """A fresh pass of ``epoch`` next (a resume after an epoch's last batch): Mosaic's own count and length."""
        self._anchor = self._resumed_length = None
        super().start_epoch(epoch)

    def resume_from(self, state: Mapping[str, Any], batches: int, next_batch: str = "") -> None:
        """Continue the next pass from Mosaic's ``state``, ``batches`` batches into the epoch (on another global batch,
        from the samples it consumed: `state_for_rank`)."""
        self._resume = dict(state)
        self._order = {key: state[key] for key in self._order}
        self._next_epoch = int(state["epoch"])
        self.record.resume(batches, next_batch=next_batch)


def shared_epoch(dataset: StreamingDataset) -> torch.Tensor:
    """The dataset's epoch tensor (`_EPOCH`), made in shared memory on first use, in the main process."""
    epoch = getattr(dataset, _EPOCH, None)
    if epoch is None:
        epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        setattr(dataset, _EPOCH, epoch)
    return epoch  # type: ignore[no-any-return]


def seen_world(dataset: StreamingDataset) -> tuple[int, int, int]:
    """(rank, ranks, nodes) that Mosaic read from the environment when ``dataset`` was built."""
    world = dataset._unique_rank_world
    return int(world.rank), int(world.num_ranks), int(world.num_nodes)


def order_of(dataset: StreamingDataset) -> dict[str, Any]:
    """The parts of Mosaic's state that fix its order, as its first pass settles them (``_resume``):
    computed here, not read from the node's shared memory, which another rank may be writing."""
    nodes = seen_world(dataset)[2]
    canonical = dataset.num_canonical_nodes or (64 * nodes if dataset.shuffle_algo in ("py1s", "py2s") else nodes)
    return {
        "num_canonical_nodes": int(canonical),
        "shuffle_seed": int(dataset.shuffle_seed),
        "initial_physical_nodes": int(dataset.initial_physical_nodes or nodes),
    }


def make_mosaic_resumable(
    loader: Any,
    *,
    seed: int,
    epoch_source: Callable[[], int],
    rank: int,
    world_size: int,
    seed_samples: bool = True,
    restore_globals: bool = True,
) -> MosaicLoader:
    """``loader`` (Mosaic's ``StreamingDataLoader``, or a torch ``DataLoader`` or ``StatefulDataLoader``,
    over a ``StreamingDataset``) as a `MosaicLoader` on ``rank`` of ``world_size``; ``seed_samples``,
    ``restore_globals``: `BuildOptions`' (each sample seeded; without workers, the generators put back after each
    batch).

    Raises:
        UnsupportedLoaderError: the dataset is not a ``StreamingDataset``; it saw another world than the
            trainer's; its ``batch_size`` is not the loader's; or the loader has persistent workers.
    """
    dataset = loader.dataset
    if not isinstance(dataset, StreamingDataset):
        raise UnsupportedLoaderError(
            f"MosaicML Streaming's StreamingDataLoader over a {type(dataset).__name__} is not resumed; over a"
            " StreamingDataset it is"
        )
    seen = seen_world(dataset)
    if seen[:2] != (rank, world_size):
        raise UnsupportedLoaderError(
            f"MosaicML Streaming's StreamingDataset was built as rank {seen[0]} of {seen[1]} (it reads RANK,"
            f" WORLD_SIZE and LOCAL_WORLD_SIZE from the environment), and this is rank {rank} of {world_size}:"
            " every rank would read another rank's samples. Lightning's launcher does not set RANK nor"
            " LOCAL_WORLD_SIZE: call lightning_resumable.set_mosaic_environment(self.trainer) in the"
            " DataModule's setup() before building the dataset, or launch with torchrun"
        )
    if dataset.batch_size != loader.batch_size:
        raise UnsupportedLoaderError(
            f"MosaicML Streaming's StreamingDataset(batch_size={dataset.batch_size}) under a loader of"
            f" batch_size={loader.batch_size}: Mosaic partitions each epoch by the dataset's batch size, so"
            f" a resume is exact only when both are the same; pass batch_size={loader.batch_size} to the dataset"
        )
    seed_each_sample(dataset, seed, _epoch_of, int, seed_globals=seed_samples)
    settings = forwarded_settings(loader, (*DATA_LIBRARY_SETTINGS, "drop_last"))
    made = MosaicLoader(dataset, epoch_source=epoch_source, world_size=world_size, **settings)
    made.puts_back_globals = seed_samples and restore_globals
    return made

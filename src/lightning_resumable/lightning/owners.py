"""The owners of the train input, one per kind: one map-style loader, several loaders, a stream.

Promise: an owner is the one holder of its loaders' position from the moment they are attached to
the end of the fit. It restores a saved state before the loaders are iterated, records the state at
a save, checks at the train start that the trainer resumes where the data does (and verifies the
next batches), names the ids of each trained step, and says when the loader must be rebuilt at an
epoch's end. The owner is picked once, where the loaders are built (`lightning_resumable.lightning.train_input`),
and the callback delegates to it (as Grain's elastic iterator picks its base iterator once and
delegates its state), so no kind is told apart anywhere else. Each owner is typed by the state it
saves; the world-size policy is the callback's one function, which every owner calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.verification import all_gather_objects, check_first_stream_batches, digest_of
from lightning_resumable.errors import IncompatibleStateError
from lightning_resumable.format.envelope import (
    GLOBAL_POSITION_ATTRIBUTE,
    Body,
    Envelope,
    LoadersState,
    LoaderState,
    MixtureState,
    PartialAccumulation,
    StreamState,
    Unresumable,
)
from lightning_resumable.format.state import DataState
from lightning_resumable.internals._torchdata import torchdata_version
from lightning_resumable.lightning.combined import loader_position
from lightning_resumable.lightning.progress import SavePoint
from lightning_resumable.lightning.sampled_loader import SampledLoader
from lightning_resumable.lightning.world_size import WorldSizePolicy
from lightning_resumable.readers.base import StreamReader
from lightning_resumable.readers.contract import check_contract
from lightning_resumable.readers.workers import retire_previous

__all__ = ["AnyOwner", "LoaderOwner", "LoadersOwner", "Owner", "StreamOwner"]

SEVERAL_SAME_SIZE = "several train loaders resume on the same world size only"
STREAM_OFF_PATH = (
    "it was written from an exception path (OnExceptionCheckpoint after an error), where the ranks cannot"
    " exchange their stream positions without risking a deadlock, and a stream's position is per rank (a"
    " preemption by SIGTERM or SLURM's requeue signal is captured by every rank together and resumes). Resume"
    " from a checkpoint written during training (ModelCheckpoint)"
)


S = TypeVar("S", LoaderState, LoadersState, StreamState, MixtureState)


class Owner(ABC, Generic[S]):
    """One kind of train input, typed by the state it saves and restores; see the module's promise."""

    state_type: type[S]

    def restore_saved(self, saved: Body, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        """`restore` a checkpoint's state, refused if it is another kind's."""
        if not isinstance(saved, self.state_type):
            raise IncompatibleStateError(
                f"the checkpoint holds the state of {saved.described}, but train_dataloader() now returns"
                f" {self.state_type.described}"
            )
        self.restore(saved, epoch, verify, world_size_policy)

    @abstractmethod
    def restore(self, saved: S, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        """Apply ``saved`` before the loaders are iterated (``epoch``: the trainer's current one)."""

    @abstractmethod
    def start_fresh(self, epoch: int) -> None:
        """No state to restore: select ``epoch`` before the loaders are iterated."""

    def carried(self, epoch: int) -> S | None:
        """What a loader built again at ``epoch`` within the run restores (``None``: a fresh start is the same)."""
        return None

    @abstractmethod
    def save(self, at: SavePoint) -> S | Unresumable:
        """The state at ``at``; or, where none can be written, why (the checkpoint is marked)."""

    def envelope(self, at: SavePoint, partial: Callable[[bool], PartialAccumulation | None]) -> Envelope:
        """The state at ``at`` in its envelope, marked by ``partial`` (of whether it ran to its epoch's end)."""
        saved = self.save(at)
        if isinstance(saved, Unresumable):
            return Envelope(None, reason=saved.reason)
        return Envelope(saved, partial_accumulation=partial(self.ran_to_end(saved, at)))

    def ran_to_end(self, saved: S, at: SavePoint) -> bool:
        """Whether ``saved`` is at the end of its epoch (a save there is never inside an accumulation window)."""
        return at.complete

    @property
    def first_sampler(self) -> ResumableSampler | None:
        """The sampler of the (first) map-style loader; ``None`` for a stream."""
        return None

    @abstractmethod
    def start(self, trainer: pl.Trainer, batches: int) -> int:
        """At the train start: refuse a trainer resuming elsewhere than the data (``batches``: its count),
        verify the next batches; the index of the first batch this process trains."""

    def check_first_batch(self) -> None:
        """Before the first batch a process trains after a restore: compare it, as the loader produced
        it, with the checkpoint's record; collective."""
        return None

    @abstractmethod
    def trained_ids(self, batch: Any, batch_idx: int) -> Any:
        """What the audit log records of a trained step."""

    def rebuild_at_epoch_end(self, epoch: int) -> bool:
        """Whether the train loader must be built again before the next epoch (its length changes)."""
        return False

    @abstractmethod
    def retire_workers(self) -> None:
        """At the end of the fit: end the loaders' workers (none may outlive the fit)."""


def _where(state: DataState) -> str:
    return f"at epoch {state.epoch}, global position {state.position}"


class LoaderOwner(Owner[LoaderState]):
    """One map-style train loader, which resumes on another world size."""

    state_type = LoaderState

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.owned = SampledLoader(loader, key=None)
        self.resized_epoch: int | None = None

    @property
    def sampler(self) -> ResumableSampler:
        return self.owned.sampler

    @property
    def first_sampler(self) -> ResumableSampler:
        return self.owned.sampler

    def restore(self, saved: LoaderState, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        world_size = self.sampler.num_replicas
        world_size_policy(saved.state.world_size, world_size, None, _where(saved.state))
        if saved.state.world_size != world_size:
            self.resized_epoch = saved.state.epoch  # counted in the old units: rebuilt at its end
        self.owned.restore(saved, verify)

    def start_fresh(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def save(self, at: SavePoint) -> LoaderState:
        return self.owned.save(at.batches, None, at)

    def start(self, trainer: pl.Trainer, batches: int) -> int:
        self.owned.check_start(trainer, (0, batches))
        return self.owned.first_batch()

    def check_first_batch(self) -> None:
        self.owned.check_produced()

    def trained_ids(self, batch: Any, batch_idx: int) -> list[int]:
        return self.sampler.batch_indices(batch_idx)

    def retire_workers(self) -> None:
        retire_previous(self.owned.loader)

    def rebuild_at_epoch_end(self, epoch: int) -> bool:
        if self.resized_epoch == epoch:
            # The epoch resumed on a new world size is over; count the next ones on the new size.
            self.resized_epoch = None
            return True
        # A batch sampler's epochs may hold different numbers of batches: Lightning counts them once per build.
        return self.owned.next_epoch_differs_in_length(epoch)


class LoadersOwner(Owner[LoadersState]):
    """Several map-style train loaders by key, iterated by a ``CombinedLoader`` in ``mode``."""

    state_type = LoadersState

    def __init__(self, loaders: Mapping[str, DataLoader[Any]], mode: str, seed: int) -> None:
        self.owned = {key: SampledLoader(loader, key) for key, loader in loaders.items()}
        self.mode, self.seed = mode, seed
        for owned in self.owned.values():  # max_size_cycle restarts a shorter loader: a fresh order each time
            owned.sampler.passes = "cycle" if mode == "max_size_cycle" else "once"

    def restore(self, saved: LoadersState, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        if saved.mode != self.mode or set(saved.loaders) != set(self.owned):
            raise IncompatibleStateError(
                f"the checkpoint holds train loaders {sorted(saved.loaders)} in {saved.mode} mode; now they are"
                f" {sorted(self.owned)} in {self.mode} mode"
            )
        for key in sorted(self.owned):
            state = saved.loaders[key].state
            world_size_policy(state.world_size, self.owned[key].sampler.num_replicas, SEVERAL_SAME_SIZE, _where(state))
            self.owned[key].restore(saved.loaders[key], verify)

    @property
    def first_sampler(self) -> ResumableSampler:
        return next(iter(self.owned.values())).sampler

    def start_fresh(self, epoch: int) -> None:
        for each in self.owned.values():
            each.sampler.set_epoch(epoch)

    def save(self, at: SavePoint) -> LoadersState:
        saved = {}
        for key in sorted(self.owned):  # the same order on every rank
            owned = self.owned[key]
            cycle, loader_batches = loader_position(self.mode, at.batches, len(owned.loader))
            saved[key] = owned.save(loader_batches, cycle, at)
        return LoadersState(self.seed, self.mode, saved)

    def start(self, trainer: pl.Trainer, batches: int) -> int:
        first = 0
        for owned in self.owned.values():
            owned.check_start(trainer, loader_position(self.mode, batches, len(owned.loader)))
            first = max(first, owned.first_batch())
        return first

    def check_first_batch(self) -> None:
        for key in sorted(self.owned):  # the same order on every rank
            self.owned[key].check_produced()

    def trained_ids(self, batch: Any, batch_idx: int) -> dict[str, list[int] | None]:
        ids: dict[str, list[int] | None] = {}
        for key, owned in self.owned.items():
            length = len(owned.loader)
            _, loader_batch = loader_position(self.mode, batch_idx, length)
            ids[key] = None if loader_batch >= length else owned.sampler.batch_indices(loader_batch)
        return ids

    def rebuild_at_epoch_end(self, epoch: int) -> bool:
        return any(owned.next_epoch_differs_in_length(epoch) for owned in self.owned.values())

    def retire_workers(self) -> None:
        for owned in self.owned.values():
            retire_previous(owned.loader)


class StreamOwner(Owner[StreamState]):
    """A stream: an ``IterableDataset`` with state, read through a `StreamLoader` (or a data library's
    loader); per-rank positions."""

    state_type = StreamState

    def __init__(self, loader: StreamReader, rank: int, world_size: int) -> None:
        check_contract(loader, owned=(loader.dataset,))
        self.loader, self.rank, self.world_size = loader, rank, world_size
        self.resumes_at: tuple[int, int | None] | None = None  # (epoch, batches); no count for a fresh epoch
        self.verifying: tuple[int, int] | None = None  # (epoch, batches) whose next batch is verified

    def restore(self, saved: StreamState, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        if saved.reader != self.loader.reader:
            raise IncompatibleStateError(
                f"the checkpoint's stream was read by {saved.reader}'s loader, and the train loader is now"
                f" {self.loader.reader}'s"
            )
        where = f"at epoch {saved.epoch}, after {saved.batches} batches of its stream"
        world_size_policy(saved.world_size, self.world_size, self.loader.world_size_refusal(saved), where)
        state = self.loader.state_for_rank(saved, self.rank, self.world_size)  # the reader's checks of its layout
        if saved.finished:  # every rank had read its whole stream: the resume starts the next epoch
            self.loader.start_epoch(saved.epoch + 1)
            self.resumes_at = (saved.epoch + 1, None)
        elif saved.epoch == epoch:
            # Each rank verifies its own next batch, on the world size that recorded them.
            if verify and saved.next_batch is None:
                rank_zero_info("lightning_resumable: the checkpoint holds no batch digest; the resume is not verified")
            verifiable = verify and saved.world_size == self.world_size and not self.loader.inexact
            recorded = saved.next_batch if verifiable else None
            self.loader.resume_from(state, saved.batches, recorded[self.rank] if recorded else "")
            self.verifying = (saved.epoch, saved.batches) if recorded else None
            self.resumes_at = (saved.epoch, saved.batches)
        else:
            raise IncompatibleStateError(
                f"the stream state resumes epoch {saved.epoch} after {saved.batches} batches, but the trainer"
                f" resumes epoch {epoch}"
            )

    def start_fresh(self, epoch: int) -> None:
        pass  # the loader asks the trainer for its epoch at each iter()

    def save(self, at: SavePoint) -> StreamState | Unresumable:
        if not at.collective and at.world_size > 1:  # one process waits for no other
            return Unresumable(STREAM_OFF_PATH)
        check_contract(self.loader, owned=(self.loader.dataset,))
        loader, batches = self.loader, at.batches
        digest = loader.next_batch_digest(batches) if at.verify else ""
        gathered = all_gather_objects((loader.state_after(batches), digest, loader.finished_after(batches)))
        ranks = [state for state, _, _ in gathered]
        return StreamState(
            seed=at.seed,
            epoch=at.epoch,
            batches=at.batches,
            world_size=at.world_size,
            num_workers=self.loader.num_workers,
            global_position=any(getattr(each, GLOBAL_POSITION_ATTRIBUTE, False) for each in (loader, loader.dataset)),
            finished=all(finished for _, _, finished in gathered),
            ranks=ranks,
            torchdata=torchdata_version(),
            next_batch=[digest for _, digest, _ in gathered] if at.verify else None,
            reader=loader.reader,
        )

    def ran_to_end(self, saved: StreamState, at: SavePoint) -> bool:
        return saved.finished  # a stream's length is its own: every rank read to its end

    def start(self, trainer: pl.Trainer, batches: int) -> int:
        if self.resumes_at is None:
            return 0
        (epoch, stream_batches), self.resumes_at = self.resumes_at, None
        # A stream read to its end resumes in the next epoch, or at the end of its own where Lightning's loop
        # ends that epoch first (a checkpoint of the validation after its last batch): nothing is read there.
        ending = stream_batches is None and trainer.current_epoch == epoch - 1
        if not ending and (epoch != trainer.current_epoch or stream_batches not in (None, batches)):
            raise IncompatibleStateError(
                f"the stream state resumes epoch {epoch} after {stream_batches or 0} batches but the trainer"
                f" resumes epoch {trainer.current_epoch} after {batches}"
            )
        return stream_batches or 0

    def check_first_batch(self) -> None:
        if self.verifying is not None:
            (epoch, batches), self.verifying = self.verifying, None
            check_first_stream_batches(all_gather_objects(self.loader.first_batch), epoch, batches)

    def trained_ids(self, batch: Any, batch_idx: int) -> str:
        return digest_of(batch)  # a stream's samples have no index

    def retire_workers(self) -> None:
        self.loader.retire_workers()


AnyOwner = LoaderOwner | LoadersOwner | StreamOwner
"""An owner of any kind, as `lightning_resumable.lightning.train_input` builds them."""

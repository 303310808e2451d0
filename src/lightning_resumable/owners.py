"""The owners of the train input, one per kind: one map-style loader, several loaders, a stream.

Promise: an owner is the one holder of its loaders' position from the moment they are attached to
the end of the fit. It restores a saved state before the loaders are iterated, records the state at
a save, checks at the train start that the trainer resumes where the data does (and verifies the
next batches), names the ids of each trained step, and says when the loader must be rebuilt at an
epoch's end. The callback picks an owner once, when ``train_dataloader()`` hands the loaders over,
and delegates to it (as Grain's elastic iterator picks its base iterator once and delegates its
state), so no kind is told apart anywhere else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightning_resumable._torchdata import torchdata_version
from lightning_resumable.combined import loader_position
from lightning_resumable.contract import check_contract
from lightning_resumable.errors import IncompatibleStateError, WorldSizeChangedError
from lightning_resumable.format import (
    GLOBAL_POSITION_ATTRIBUTE,
    Body,
    LoadersState,
    LoaderState,
    StreamState,
    describe,
)
from lightning_resumable.progress import SavePoint
from lightning_resumable.sampled_loader import SampledLoader
from lightning_resumable.sampler import ResumableSampler
from lightning_resumable.state import DataState
from lightning_resumable.streams import StreamReader, state_for_rank
from lightning_resumable.verification import all_gather_objects, check_first_stream_batches, digest_of
from lightning_resumable.workers import retire_previous

__all__ = ["LoaderOwner", "LoadersOwner", "Owner", "SavePoint", "StreamOwner", "WorldSizePolicy", "check_world_size"]

WorldSizePolicy = Callable[[int, int, bool, str], None]
"""The callback's world-size policy, which every owner calls: ``(saved world size, world size now, elastic,
where the state stands)``; raises to refuse a change."""


def check_world_size(allowed: bool, saved_world_size: int, world_size: int, elastic: bool, where: str) -> None:
    """The world-size policy, for every kind of train input (``allowed``: the callback's
    ``allow_world_size_change``): an elastic resume is logged, or refused where it cannot be exact or
    the user turned it off."""
    if saved_world_size == world_size:
        return
    message = f"the checkpoint was written on {saved_world_size} processes and resumes on {world_size}, {where}"
    if not elastic:
        raise WorldSizeChangedError(message + "; several train loaders resume on the same world size only")
    if not allowed:
        raise WorldSizeChangedError(message + "; ResumableDataCallback(allow_world_size_change=False)")
    rank_zero_info(f"lightning_resumable: {message}; the rest of the epoch is split across the new ranks")


STREAM_OFF_PATH = (
    "it was written from an exception path (OnExceptionCheckpoint after an error), where the ranks cannot"
    " exchange their stream positions without risking a deadlock, and a stream's position is per rank (a"
    " preemption by SIGTERM or SLURM's requeue signal is captured by every rank together and resumes). Resume"
    " from a checkpoint written during training (ModelCheckpoint)"
)


class Owner(ABC):
    """One kind of train input; see the module's promise."""

    kind: str
    """The kind's tag in the checkpoint format."""

    def refuse_other_kind(self, saved: Body) -> None:
        if describe(_kind_of(saved)) != describe(self.kind):
            raise IncompatibleStateError(
                f"the checkpoint holds the state of {describe(_kind_of(saved))}, but train_dataloader() now"
                f" returns {describe(self.kind)}"
            )

    @abstractmethod
    def restore(self, saved: Body, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        """Apply ``saved`` before the loaders are iterated (``epoch``: the trainer's current one)."""

    @abstractmethod
    def start_fresh(self, epoch: int) -> None:
        """No state to restore: select ``epoch`` before the loaders are iterated."""

    @abstractmethod
    def save(self, at: SavePoint) -> Body | str:
        """The state at ``at``; or, where none can be written, the reason (the checkpoint is marked)."""

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


def _kind_of(saved: Body) -> str:
    if isinstance(saved, StreamState):
        return "stream"
    return "loaders" if isinstance(saved, LoadersState) else "loader"


class LoaderOwner(Owner):
    """One map-style train loader; the only kind that resumes on another world size."""

    kind = "loader"

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.owned = SampledLoader(loader, key=None)
        self.resized_epoch: int | None = None

    @property
    def sampler(self) -> ResumableSampler:
        return self.owned.sampler

    def restore(self, saved: Body, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        self.refuse_other_kind(saved)
        assert isinstance(saved, LoaderState)
        world_size = self.sampler.num_replicas
        world_size_policy(saved.state.world_size, world_size, True, _where(saved.state))
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


class LoadersOwner(Owner):
    """Several map-style train loaders by key, iterated by a ``CombinedLoader`` in ``mode``."""

    kind = "loaders"

    def __init__(self, loaders: Mapping[str, DataLoader[Any]], mode: str, seed: int) -> None:
        self.owned = {key: SampledLoader(loader, key) for key, loader in loaders.items()}
        self.mode, self.seed = mode, seed
        for owned in self.owned.values():  # max_size_cycle restarts a shorter loader: a fresh order each time
            owned.sampler.passes = "cycle" if mode == "max_size_cycle" else "once"

    def restore(self, saved: Body, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        self.refuse_other_kind(saved)
        assert isinstance(saved, LoadersState)
        if saved.mode != self.mode or set(saved.loaders) != set(self.owned):
            raise IncompatibleStateError(
                f"the checkpoint holds train loaders {sorted(saved.loaders)} in {saved.mode} mode; now they are"
                f" {sorted(self.owned)} in {self.mode} mode"
            )
        for key in sorted(self.owned):
            state = saved.loaders[key].state
            world_size_policy(state.world_size, self.owned[key].sampler.num_replicas, False, _where(state))
            self.owned[key].restore(saved.loaders[key], verify)

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


class StreamOwner(Owner):
    """A stream: an ``IterableDataset`` with state, read through a `StreamLoader` (or LitData's
    loader); per-rank positions."""

    kind = "stream"

    def __init__(self, loader: StreamReader, rank: int, world_size: int) -> None:
        check_contract(loader, owned=(loader.dataset,))
        self.loader, self.rank, self.world_size = loader, rank, world_size
        self.resumes_at: tuple[int, int | None] | None = None  # (epoch, batches); no count for a fresh epoch
        self.verifying: tuple[int, int] | None = None  # (epoch, batches) whose next batch is verified

    def restore(self, saved: Body, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        self.refuse_other_kind(saved)
        assert isinstance(saved, StreamState)
        if saved.reader != self.loader.reader:
            raise IncompatibleStateError(
                f"the checkpoint's stream was read by {saved.reader}'s loader, and the train loader is now"
                f" {self.loader.reader}'s"
            )
        if saved.global_position:  # else state_for_rank refuses another world size, saying why
            where = f"at epoch {saved.epoch}, after {saved.batches} batches of its stream"
            world_size_policy(saved.world_size, self.world_size, True, where)
        state = state_for_rank(saved, self.rank, self.world_size, self.loader.num_workers)  # refuses another layout
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

    def save(self, at: SavePoint) -> StreamState | str:
        if not at.collective and at.world_size > 1:  # one process waits for no other
            return STREAM_OFF_PATH
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

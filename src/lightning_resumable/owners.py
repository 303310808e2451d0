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
from dataclasses import dataclass, replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightning_resumable.combined import loader_position
from lightning_resumable.contract import check_contract
from lightning_resumable.errors import IncompatibleStateError, InconsistentRankStateError
from lightning_resumable.format import (
    GLOBAL_POSITION_ATTRIBUTE,
    BatchFingerprint,
    Body,
    LoadersState,
    LoaderState,
    StreamState,
    describe,
    torchdata_version,
)
from lightning_resumable.sampler import ResumableSampler
from lightning_resumable.state import DataState
from lightning_resumable.streams import StreamLoader, loader_state_finished, state_for_rank
from lightning_resumable.verification import all_gather_objects, check_fingerprints, digest_of, fingerprint_next_batch
from lightning_resumable.workers import retire_previous

__all__ = ["LoaderOwner", "LoadersOwner", "Owner", "SavePoint", "StreamOwner", "WorldSizePolicy"]

WorldSizePolicy = Callable[[DataState, int, bool], None]
"""The callback's world-size policy: ``(saved state, world size now, elastic)``; raises to refuse a change."""

STREAM_OFF_PATH = (
    "it was written from an exception or signal path (OnExceptionCheckpoint, SIGTERM, SLURM requeue), where the"
    " ranks cannot exchange their stream positions without risking a deadlock, and a stream's position is per"
    " rank. Resume from a checkpoint written during training (ModelCheckpoint)"
)


@dataclass(frozen=True)
class SavePoint:
    """Where a checkpoint is being written, as the callback counts it.

    ``collective``: every rank saves in step (a ``ModelCheckpoint``), so they may exchange their
    parts; ``False`` on an exception or signal path, where no rank may wait for another.
    """

    seed: int
    epoch: int
    batches: int
    complete: bool
    rank: int
    world_size: int
    collective: bool
    verify: bool


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

    @abstractmethod
    def trained_ids(self, batch: Any, batch_idx: int) -> Any:
        """What the audit log records of a trained step."""

    def rebuild_at_epoch_end(self, epoch: int) -> bool:
        """Whether the train loader must be built again before the next epoch (its length changes)."""
        return False

    @abstractmethod
    def retire_workers(self) -> None:
        """At the end of the fit: end the loaders' workers (none may outlive the fit)."""


def _kind_of(saved: Body) -> str:
    if isinstance(saved, StreamState):
        return "stream"
    return "loaders" if isinstance(saved, LoadersState) else "loader"


class _Sampled:
    """One map-style loader with a `ResumableSampler`: its position, fingerprints and dataset state."""

    def __init__(self, loader: DataLoader[Any], key: str | None) -> None:
        sampler = loader.sampler
        if not isinstance(sampler, ResumableSampler):
            raise TypeError(f"the loader's sampler must be a ResumableSampler, got {type(sampler).__name__}")
        check_contract(loader, owned=(sampler,))
        self.loader, self.sampler, self.key = loader, sampler, key
        self.to_verify: tuple[DataState, list[BatchFingerprint]] | None = None

    @property
    def where(self) -> str:
        return "" if self.key is None else f" (train loader {self.key!r})"

    def user_dataset(self) -> object:
        return getattr(self.loader.dataset, "dataset", self.loader.dataset)  # inside the SampleSeededDataset

    def restore(self, saved: LoaderState, verify: bool) -> None:
        """Apply a saved state (the sampler's, then the dataset's); the world size is the caller's to police."""
        self.sampler.restore(saved.state)  # refuses another setup before anything changes
        self._restore_dataset(saved.dataset)
        if not verify:
            return
        if saved.fingerprints is None:
            rank_zero_info("lightning_resumable: the checkpoint holds no batch fingerprint; the resume is not verified")
        else:
            self.to_verify = (saved.state, saved.fingerprints)

    def _restore_dataset(self, state: Mapping[str, Any] | None) -> None:
        dataset = self.user_dataset()
        load = getattr(dataset, "load_state_dict", None)
        if state is None:
            if callable(getattr(dataset, "state_dict", None)):
                raise IncompatibleStateError(
                    f"the dataset {type(dataset).__name__}{self.where} has its own state, but the checkpoint holds"
                    " none: it was written by a setup whose dataset had no state_dict"
                )
            return
        if not callable(load):
            raise IncompatibleStateError(
                f"the checkpoint holds a dataset state (keys {sorted(state)}){self.where}, but the dataset"
                f" {type(dataset).__name__} has no load_state_dict"
            )
        load(state)

    def _dataset_state(self, rank: int, collective: bool) -> Mapping[str, Any] | None:
        """The dataset's own state, checked to be the same on every rank (only rank 0 writes it) when
        ``collective``; else this rank's."""
        state_dict = getattr(self.user_dataset(), "state_dict", None)
        if not callable(state_dict):
            return None
        state: Mapping[str, Any] = state_dict()
        if not collective:
            return state
        digests = all_gather_objects(digest_of(state))
        differing = [other for other, digest in enumerate(digests) if digest != digests[0]]
        if differing:
            raise InconsistentRankStateError(
                f"the dataset {type(self.user_dataset()).__name__}{self.where} holds a different state on rank(s)"
                f" {differing} than on rank 0 ({state!r} here, on rank {rank}); only rank 0's checkpoint is written,"
                " so the other ranks would resume from rank 0's state. Change the dataset's state on every rank"
                " alike (for example in on_train_epoch_end)"
            )
        return state

    def save(self, batches: int, cycle: int | None, at: SavePoint) -> LoaderState:
        """The state after ``batches`` batches of this loader (of ``cycle``, when it restarts).

        Collective: every rank fingerprints its own next batch for the gathering. Else (an exception
        or signal path) no rank waits for another: rank 0, whose file is the checkpoint,
        fingerprints every rank's next batch itself (the position is global).
        """
        check_contract(self.loader, owned=(self.sampler,))
        sampler = self.sampler
        if at.complete:
            # The resume starts the next epoch (Lightning does the same).
            state = replace(sampler.data_state(), epoch=sampler.epoch + 1, position=0, batches=0, cycle=0)
        elif cycle is not None and cycle != sampler.cycle:
            # The loader ran out exactly here and max_size_cycle has not restarted it yet.
            state = replace(sampler.data_state(), cycle=cycle, position=0, batches=0)
        else:
            sampler.set_consumed_batches(batches)
            state = sampler.data_state()
        fingerprints = None
        if at.verify and at.collective:
            mine = fingerprint_next_batch(self.loader, state, sampler.rank, sampler.num_replicas)
            fingerprints = [BatchFingerprint.from_list(entry) for entry in all_gather_objects(mine.to_list())]
        elif at.verify and at.rank == 0:
            world_size = sampler.num_replicas
            fingerprints = [fingerprint_next_batch(self.loader, state, each, world_size) for each in range(world_size)]
        return LoaderState(state, fingerprints, self._dataset_state(at.rank, at.collective))

    def check_start(self, trainer: pl.Trainer, expected: tuple[int, int]) -> None:
        """Refuse a trainer that resumes another place than the data; then verify the next batches."""
        epoch, _, batches = self.sampler.origin
        if epoch != trainer.current_epoch:
            raise IncompatibleStateError(
                f"the data state{self.where} resumes epoch {epoch} but the trainer resumes epoch"
                f" {trainer.current_epoch}"
            )
        cycle, expected_batches = expected
        if batches and (batches, self.sampler.cycle) != (expected_batches, cycle):
            ours, theirs = f"{batches} batches", f"{expected_batches}"
            if self.key is not None:
                ours, theirs = f"{ours} (cycle {self.sampler.cycle})", f"{theirs} (cycle {cycle})"
            raise IncompatibleStateError(
                f"the data state{self.where} resumes after {ours} of epoch {epoch} but the trainer's count means"
                f" {theirs}"
            )
        if self.to_verify is not None:
            saved, fingerprints = self.to_verify
            self.to_verify = None
            check_fingerprints(self.loader, saved, fingerprints, trainer.global_rank, trainer.world_size)

    def first_batch(self) -> int:
        _, _, origin_batches = self.sampler.origin
        return self.sampler.cycle * len(self.loader) + origin_batches

    def next_epoch_differs_in_length(self, epoch: int) -> bool:
        draws, seed = self.sampler.draws, self.sampler.seed
        return draws.epoch_length(seed, epoch + 1) != draws.epoch_length(seed, epoch)


class LoaderOwner(Owner):
    """One map-style train loader; the only kind that resumes on another world size."""

    kind = "loader"

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.owned = _Sampled(loader, key=None)
        self.resized_epoch: int | None = None

    @property
    def sampler(self) -> ResumableSampler:
        return self.owned.sampler

    def restore(self, saved: Body, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        self.refuse_other_kind(saved)
        assert isinstance(saved, LoaderState)
        world_size = self.sampler.num_replicas
        world_size_policy(saved.state, world_size, True)
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
        self.owned = {key: _Sampled(loader, key) for key, loader in loaders.items()}
        self.mode, self.seed = mode, seed

    def restore(self, saved: Body, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        self.refuse_other_kind(saved)
        assert isinstance(saved, LoadersState)
        if saved.mode != self.mode or set(saved.loaders) != set(self.owned):
            raise IncompatibleStateError(
                f"the checkpoint holds train loaders {sorted(saved.loaders)} in {saved.mode} mode; now they are"
                f" {sorted(self.owned)} in {self.mode} mode"
            )
        for key in sorted(self.owned):
            world_size_policy(saved.loaders[key].state, self.owned[key].sampler.num_replicas, False)
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
    """A stream: an ``IterableDataset`` with state, read through a `StreamLoader`; per-rank positions."""

    kind = "stream"

    def __init__(self, loader: StreamLoader, rank: int, world_size: int) -> None:
        check_contract(loader, owned=(loader.dataset,))
        self.loader, self.rank, self.world_size = loader, rank, world_size
        self.resumes_at: tuple[int, int | None] | None = None  # (epoch, batches); no count for a fresh epoch

    def restore(self, saved: Body, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        self.refuse_other_kind(saved)
        assert isinstance(saved, StreamState)
        state = state_for_rank(saved, self.rank, self.world_size, self.loader.num_workers)  # refuses another layout
        if saved.finished:  # every rank had read its whole stream: the resume starts the next epoch
            self.loader.start_epoch(saved.epoch + 1)
            self.resumes_at = (saved.epoch + 1, None)
        elif saved.epoch == epoch:
            self.loader.restore(state, saved.batches)
            self.resumes_at = (saved.epoch, saved.batches)
        else:
            raise IncompatibleStateError(
                f"the stream state resumes epoch {saved.epoch} after {saved.batches} batches, but the trainer"
                f" resumes epoch {epoch}"
            )

    def start_fresh(self, epoch: int) -> None:
        pass  # the loader asks the trainer for its epoch at each iter()

    def save(self, at: SavePoint) -> StreamState | str:
        if not at.collective:
            return STREAM_OFF_PATH
        check_contract(self.loader, owned=(self.loader.dataset,))
        ranks = all_gather_objects(self.loader.state_after(at.batches))
        return StreamState(
            seed=at.seed,
            epoch=at.epoch,
            batches=at.batches,
            world_size=at.world_size,
            num_workers=self.loader.num_workers,
            global_position=bool(getattr(self.loader.dataset, GLOBAL_POSITION_ATTRIBUTE, False)),
            finished=all(loader_state_finished(each) for each in ranks),
            ranks=ranks,
            torchdata=torchdata_version(),
        )

    def start(self, trainer: pl.Trainer, batches: int) -> int:
        if self.resumes_at is None:
            return 0
        (epoch, stream_batches), self.resumes_at = self.resumes_at, None
        if epoch != trainer.current_epoch or stream_batches not in (None, batches):
            raise IncompatibleStateError(
                f"the stream state resumes epoch {epoch} after {stream_batches or 0} batches but the trainer"
                f" resumes epoch {trainer.current_epoch} after {batches}"
            )
        return stream_batches or 0

    def trained_ids(self, batch: Any, batch_idx: int) -> str:
        return digest_of(batch)  # a stream's samples have no index

    def retire_workers(self) -> None:
        self.loader.retire_workers()

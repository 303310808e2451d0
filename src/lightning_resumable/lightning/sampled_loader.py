"""One map-style train loader with a `ResumableSampler`, as an owner holds it: its position (the
sampler's), the next-batch fingerprints, and the state of a dataset that has its own.

Promise: the state recorded at a save is the sampler's global state at the trainer's count of
completed batches, each rank's next batch fingerprinted (gathered from every rank, or computed for
all of them by rank 0 where no rank may wait for another), and a dataset's own state checked to be
the same on every rank; a restore applies them all before the loader is iterated. The fingerprint
holds the digest of the batch the loader produced (`lightning_resumable.core.produced`), which the first
batch after a restore on the same world size must match.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightning_resumable.core.produced import ProducedBatches, watch_loader
from lightning_resumable.core.resume_start import DataPlace, Start, resume_start
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.verification import (
    all_gather_objects,
    check_fingerprints,
    check_produced_batches,
    digest_of,
    fingerprint_next_batch,
)
from lightning_resumable.errors import IncompatibleStateError, InconsistentRankStateError
from lightning_resumable.format.envelope import BatchFingerprint, LoaderState
from lightning_resumable.format.state import DataState
from lightning_resumable.lightning.progress import SavePoint
from lightning_resumable.readers.contract import check_contract

__all__ = ["SampledLoader"]


class SampledLoader:
    """One map-style loader with a `ResumableSampler`: its position, fingerprints and dataset state."""

    def __init__(self, loader: DataLoader[Any], key: str | None) -> None:
        sampler = loader.sampler
        if not isinstance(sampler, ResumableSampler):
            raise TypeError(f"the loader's sampler must be a ResumableSampler, got {type(sampler).__name__}")
        check_contract(loader, owned=(sampler,))
        self.loader, self.sampler, self.key = loader, sampler, key
        self.to_verify: tuple[DataState, list[BatchFingerprint]] | None = None
        self.produced = ProducedBatches(lambda: (sampler.epoch, sampler.cycle, sampler.origin[2]))
        self.verifying_produced = False  # the first batch after the restore is compared on every rank
        watch_loader(loader, self.produced)

    @property
    def where(self) -> str:
        return "" if self.key is None else f" (train loader {self.key!r})"

    def user_dataset(self) -> object:
        return getattr(self.loader.dataset, "dataset", self.loader.dataset)  # inside the SampleSeededDataset

    def restore(
        self,
        saved: LoaderState,
        verify: bool,
        epoch: int,
        lightning_ends_epoch: bool = False,
        batch_size_may_change: bool = False,
    ) -> None:
        """Apply a saved state (the sampler's, then the dataset's); the world size is the caller's to police,
        and so is the batch size where ``batch_size_may_change`` (else another one is refused).

        ``epoch`` is the trainer's: a resume that starts the next epoch (`resume_start`) starts it here, before
        any iterator exists (a loader's workers read ahead from the first one Lightning makes).
        """
        state = saved.state
        self.sampler.restore(state, batch_size_may_change)  # refuses another setup before anything changes
        resized = state.laid_out_otherwise(self.sampler.num_replicas, self.sampler.batch_size)
        self._restore_dataset(saved.dataset)
        if resume_start(self.place(lightning_ends_epoch), epoch) is Start.NEXT_EPOCH:
            self.begin_next_epoch(epoch)
            return
        if not verify:
            return
        if saved.fingerprints is None:
            rank_zero_info("lightning_resumable: the checkpoint holds no batch fingerprint; the resume is not verified")
            return
        self.to_verify = (saved.state, saved.fingerprints)
        if not resized and self.seeded:  # each rank's own next batch, as its loader produced it
            where = (state.epoch, state.cycle, state.batches)
            self.produced.expect_first(where, saved.fingerprints[self.sampler.rank].produced)
            self.verifying_produced = True

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
        if at.next_epoch:  # the resume starts the next epoch (Lightning does the same)
            state = sampler.state_at_start(sampler.epoch + 1, 0)
        elif cycle is not None and cycle != sampler.cycle:
            # The loader ran out exactly here and max_size_cycle has not restarted it yet.
            state = sampler.state_at_start(sampler.epoch, cycle)
        else:
            state = sampler.data_state(batches)
        fingerprints = None
        if at.verify and at.collective:
            mine = self._fingerprint(state, at)
            fingerprints = [BatchFingerprint.from_list(entry) for entry in all_gather_objects(mine.to_list())]
        elif at.verify and at.rank == 0:
            world_size = sampler.num_replicas
            fingerprints = [fingerprint_next_batch(self.loader, state, each, world_size) for each in range(world_size)]
            fingerprints[0] = self._fingerprint(state, at)
        return LoaderState(state, fingerprints, self._dataset_state(at.rank, at.collective))

    def _fingerprint(self, state: DataState, at: SavePoint) -> BatchFingerprint:
        """This rank's next batch: its keys and content fetched again here, and the batch the loader
        produced (known between steps, where Lightning has read it ahead). Warns where the two differ:
        the dataset holds random state that the workers' copies and this process's do not share."""
        fetched = fingerprint_next_batch(self.loader, state, self.sampler.rank, self.sampler.num_replicas)
        within = not at.next_epoch and state.batches < len(self.loader)
        produced = self.produced.digest_at(state.epoch, state.cycle, state.batches) if within else ""
        if produced and produced != fetched.content and self.seeded:
            warnings.warn(
                f"lightning_resumable: on rank {self.sampler.rank}, the batch the loader produced{self.where}"
                f" after {state.batches} batches of epoch {state.epoch} is not the one fetched again under the"
                f" same seeds (digest {produced}, not {fetched.content}): the dataset draws from random state"
                " that is not seeded per sample (a generator out of the library's reach, such as one at module"
                " level). This checkpoint resumes only if the resumed loader produces the same batch; the"
                " resume checks that",
                RuntimeWarning,
                stacklevel=2,
            )
        return replace(fetched, produced=produced)

    @property
    def seeded(self) -> bool:
        """Whether each sample is fetched under its own seed (``seed_samples``): else what the loader
        produces is not expected to repeat, and only the keys and the re-fetch are compared."""
        return bool(getattr(self.loader.dataset, "seed_globals", True))

    def check_produced(self) -> None:
        """Before the first batch after a restore trains: compare each rank's first produced batch with
        the one its loader produced before the save; collective (on every rank alike, or on none)."""
        if not self.verifying_produced:
            return
        self.verifying_produced = False
        workers = self.loader.num_workers > 0
        check_produced_batches(all_gather_objects(self.produced.first_batch), self.sampler.epoch, self.where, workers)

    def place(self, lightning_ends_epoch: bool = False) -> DataPlace:
        """Where the restored stream stands: over when its sampler left no batch; with ``lightning_ends_epoch``
        (several loaders, each wherever it is) Lightning's end of the epoch ends it."""
        epoch, _, batches = self.sampler.origin
        return DataPlace(epoch, batches, None if lightning_ends_epoch else self.sampler.origin_at_end)

    def begin_next_epoch(self, epoch: int) -> None:
        """`Start.NEXT_EPOCH`: the restored epoch is over, ``epoch`` starts; a pure function of the seed, nothing
        to verify."""
        self.sampler.end_restored_epoch()
        self.sampler.set_epoch(epoch)
        self.to_verify, self.verifying_produced = None, False

    def check_start(self, trainer: pl.Trainer, expected: tuple[int, int], lightning_ends_epoch: bool = False) -> Start:
        """Where this loader resumes (`resume_start`) against the trainer's epoch and its count ``expected``
        (``(cycle, batches)`` of this loader), refusing another place; verifies the next batches. A next epoch
        is started here too, for a loader built before Lightning restored its loops (as
        ``estimated_stepping_batches`` does): an iterator made before read ahead of it."""
        cycle, expected_batches = expected
        place = self.place(lightning_ends_epoch)
        start = resume_start(place, trainer.current_epoch, expected_batches, trainer.num_training_batches, self.where)
        if start is Start.NEXT_EPOCH:
            self.begin_next_epoch(trainer.current_epoch)
            return start
        if place.epoch != trainer.current_epoch:
            return start  # written as the next epoch's start: Lightning first ends the one it trained
        if place.batches and self.sampler.cycle != cycle:
            raise IncompatibleStateError(
                f"the data state{self.where} resumes after {place.batches} batches (cycle {self.sampler.cycle}) of"
                f" epoch {place.epoch} but the trainer's count means {expected_batches} (cycle {cycle})"
            )
        if self.to_verify is not None:
            saved, fingerprints = self.to_verify
            self.to_verify = None
            check_fingerprints(self.loader, saved, fingerprints, trainer.global_rank, trainer.world_size)
        return start

    def first_batch(self) -> int:
        _, _, origin_batches = self.sampler.origin
        return self.sampler.cycle * len(self.loader) + origin_batches

    def next_epoch_differs_in_length(self, epoch: int) -> bool:
        return self.sampler.epoch_length(epoch + 1) != self.sampler.epoch_length(epoch)  # holes out

"""The one owner of the train loaders' position: persisted in the checkpoint, applied once on restore,
verified before the first resumed step; and the owner of the training step's randomness."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from lightning_resumable._lightning import (
    batches_processed,
    handle_preemption_signal,
    preemption_signals,
    rebuild_train_loader_at_next_epoch,
    saving_off_the_training_path,
    silence_not_resumable_warning,
)
from lightning_resumable.audit import AuditLog
from lightning_resumable.combined import loader_position
from lightning_resumable.contract import check_contract
from lightning_resumable.errors import (
    IncompatibleStateError,
    InconsistentRankStateError,
    LateRestoreError,
    MissingCallbackError,
    MissingStateError,
    PartialAccumulationError,
    WorldSizeChangedError,
)
from lightning_resumable.format import (
    GLOBAL_POSITION_ATTRIBUTE,
    STATE_KEY,
    BatchFingerprint,
    Envelope,
    LoadersState,
    LoaderState,
    PartialAccumulation,
    StreamState,
    describe,
    parse,
    torchdata_version,
)
from lightning_resumable.randomness import seed_training_step
from lightning_resumable.sampler import ResumableSampler
from lightning_resumable.signals import DeferredSignals
from lightning_resumable.state import DataState
from lightning_resumable.streams import StreamLoader, loader_state_finished, state_for_rank
from lightning_resumable.verification import (
    all_gather_objects,
    check_fingerprints,
    digest_of,
    fingerprint_next_batch,
)

_Restored = LoaderState | LoadersState | StreamState


def _what(restored: _Restored) -> str:
    return describe(Envelope(restored).kind)


class _SampledLoader:
    """One map-style train loader the callback owns: its sampler's state, the next-batch fingerprints,
    and the state of a dataset that has its own (global, saved once)."""

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

    def restore(self, restored: LoaderState, verify: bool) -> None:
        """Apply a saved state (the sampler's, then the dataset's); the world size is the caller's to police."""
        self.sampler.load_state_dict(restored.state.to_dict())  # refuses another setup before anything changes
        self._restore_dataset(restored.dataset)
        if not verify:
            return
        if restored.fingerprints is None:
            rank_zero_info("lightning_resumable: the checkpoint holds no batch fingerprint; the resume is not verified")
        else:
            self.to_verify = (restored.state, restored.fingerprints)

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

    def save(
        self, batches: int, epoch_complete: bool, cycle: int | None, verify: bool, rank: int, collective: bool
    ) -> LoaderState:
        """The state after ``batches`` batches of this loader (of ``cycle``, when it restarts).

        ``collective``: every rank saves in step, and each fingerprints its own next batch for the
        gathering. Else (an exception or signal path) no rank waits for another: rank 0, whose
        file is the checkpoint, fingerprints every rank's next batch itself (the position is global).
        """
        check_contract(self.loader, owned=(self.sampler,))
        sampler = self.sampler
        if epoch_complete:
            # The resume starts the next epoch (Lightning does the same).
            state = replace(sampler.data_state(), epoch=sampler.epoch + 1, position=0, batches=0, cycle=0)
        elif cycle is not None and cycle != sampler.cycle:
            # The loader ran out exactly here and max_size_cycle has not restarted it yet.
            state = replace(sampler.data_state(), cycle=cycle, position=0, batches=0)
        else:
            sampler.set_consumed_batches(batches)
            state = sampler.data_state()
        fingerprints = None
        if verify and collective:
            mine = fingerprint_next_batch(self.loader, state, sampler.rank, sampler.num_replicas)
            fingerprints = [BatchFingerprint.from_list(entry) for entry in all_gather_objects(mine.to_list())]
        elif verify and rank == 0:
            world_size = sampler.num_replicas
            fingerprints = [fingerprint_next_batch(self.loader, state, each, world_size) for each in range(world_size)]
        return LoaderState(state, fingerprints, self._dataset_state(rank, collective))

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

    def next_epoch_differs_in_length(self, epoch: int) -> bool:
        draws, seed = self.sampler.draws, self.sampler.seed
        return draws.epoch_length(seed, epoch + 1) != draws.epoch_length(seed, epoch)


_STREAM_OFF_PATH = (
    "it was written from an exception or signal path (OnExceptionCheckpoint, SIGTERM, SLURM requeue), where the"
    " ranks cannot exchange their stream positions without risking a deadlock, and a stream's position is per"
    " rank. Resume from a checkpoint written during training (ModelCheckpoint)"
)


def _partial_accumulation(trainer: pl.Trainer, batches: int, complete: bool) -> PartialAccumulation | None:
    """The mark of a save inside a gradient accumulation window, or ``None``.

    Lightning steps the optimizer after every ``accumulate_grad_batches``-th batch of an epoch and
    after its last one; batches since the last step live only in the gradients, which no checkpoint
    holds, so a resume from here cannot be exact.
    """
    window = int(trainer.accumulate_grad_batches)
    accumulated = 0 if complete else batches % window
    return PartialAccumulation(accumulated, window, batches) if accumulated else None


def _refuse_partial_accumulation(partial: PartialAccumulation | None) -> None:
    if partial is None:
        return
    raise PartialAccumulationError(
        f"the checkpoint was saved after batch {partial.batches} of its epoch, inside a gradient accumulation"
        f" window: {partial.accumulated} of accumulate_grad_batches={partial.window} batches had been"
        " accumulated without an optimizer step. Lightning does not save accumulated gradients, so the resumed"
        " run would step without them and its losses would differ from an uninterrupted run's. Resume from a"
        " checkpoint saved at an accumulation boundary (ModelCheckpoint(every_n_train_steps=...) saves there)"
    )


__all__ = ["ResumableDataCallback"]


class ResumableDataCallback(pl.Callback):
    """Makes a resumed run continue as if never interrupted: same batches, same content, same steps.

    On save it records the train loader's global state (seed, epoch, samples consumed by all ranks,
    and the setup), counting the batches the trainer has really completed rather than what the
    loader prefetched, and a fingerprint of the batch each rank trains next. Several train loaders
    (a list, a dict, a ``CombinedLoader``) are recorded each under its key, with the cycle a shorter
    loader is in; a stream (an ``IterableDataset`` with state) is recorded per rank, with each
    worker's state, as it stood after the last completed batch (see `lightning_resumable.streams`).
    On restore it hands that state to the sampler that `ResumableDataModule` builds inside
    ``train_dataloader()``, before the sampler's iterator exists; at ``on_train_start`` it checks
    that the trainer resumed the same epoch and batch as the data, and that the batches about to be
    trained match the fingerprints.

    Randomness is derived, never stored: each sample is fetched under a seed of ``(seed, epoch,
    global position)`` and each training step starts from a seed of ``(seed, epoch, batch index)``
    (see `lightning_resumable.randomness`).

    Args:
        allow_world_size_change: resume on a different number of processes (logged once on rank 0).
            ``False`` raises `WorldSizeChangedError` instead.
        seed_samples: seed torch's CPU generator, ``random`` and NumPy's global ``RandomState``
            before each sample is fetched, so augmentations are exact after a resume.
            ``sample_rng()`` works either way.
        seed_steps: reseed those generators (and CUDA's) at the start of every training step, so
            dropout and other draws in the step are exact after a resume. Every rank gets the same
            seed, as with ``seed_everything``.
        verify: record the next batch's fingerprint at every save and compare it on resume.
        audit_dir: a directory where each rank appends, per trained step, the epoch, the batch index and
            the sample ids it read (``audit.rank{R}.jsonl``); ``python -m lightning_resumable compare``
            compares two runs' logs. ``None`` (the default) writes nothing.

    Raises:
        MissingStateError: resuming a checkpoint written without this callback.
        WorldSizeChangedError: another world size with ``allow_world_size_change=False``, with
            several train loaders, or with a stream whose position is per rank.
        WorkerCountChangedError: a stream resumes with another ``num_workers``.
        IncompatibleStateError: the checkpoint's data setup (dataset size, shuffle, drop_last, batch
            size, the train loaders' keys and mode, stream or not) differs from the current one.
        ResumeVerificationError: on every rank, before the first resumed step, when a batch about to
            be trained differs from the one the checkpoint recorded.
        MissingCallbackError: training starts without a ``ResumableDataModule`` train loader.
        ContractViolationError: at build or at a save, an object in the train loader persists a
            derived quantity (rank, world size, shard offset...) or a wrapper persists other state
            than its inner object's (see `PassThroughWrapper`).
        InconsistentRankStateError: at a save, the ranks' datasets hold different states.

    A dataset with its own ``state_dict``/``load_state_dict`` (a curriculum, say) is persisted once,
    as global state, and restored before the loader is iterated. ``state_dict`` is collective: save
    checkpoints on every rank, as ``ModelCheckpoint`` does.

    Example:
        ```python
        class MyData(ResumableDataModule, L.LightningDataModule):
            def train_dataloader(self):
                return DataLoader(self.dataset, batch_size=32, shuffle=True, num_workers=2)

        trainer = L.Trainer(strategy="ddp", devices=2, callbacks=[ResumableDataCallback()])
        trainer.fit(model, MyData(), ckpt_path="last.ckpt")
        ```
    """

    def __init__(
        self,
        allow_world_size_change: bool = True,
        seed_samples: bool = True,
        seed_steps: bool = True,
        verify: bool = True,
        audit_dir: str | None = None,
    ) -> None:
        self.allow_world_size_change = allow_world_size_change
        self.seed_samples = seed_samples
        self.seed_steps = seed_steps
        self.verify = verify
        self.audit_dir = audit_dir
        self._audit: AuditLog | None = None
        self._trainer: pl.Trainer | None = None
        # What the callback owns once train_dataloader() has run: map-style loaders by key (None for
        # a single loader), with the CombinedLoader mode when there are several; or one stream.
        self._loaders: dict[str | None, _SampledLoader] = {}
        self._mode: str | None = None
        self._stream: StreamLoader | None = None
        # (epoch, batches) a restored stream resumes at; no batch count for a fresh epoch
        self._stream_start: tuple[int, int | None] | None = None
        # A restored state not yet applied to a loader.
        self._pending: _Restored | None = None
        self._seed: int | None = None
        self._resized_epoch: int | None = None
        # Where the data resumes: (epoch, index of the first batch this process trains), checked against
        # Lightning's batch_idx at the first batch. Lightning 2.6 can number a resumed epoch's batches
        # from 0 (a resume from a checkpoint written after an earlier resume from an epoch's end) or
        # from where the previous epoch ended (a stream resumed after its last batch); the callback
        # then counts the epoch's batches itself: (epoch, offset) added to Lightning's count.
        self._first_batch: tuple[int, int] | None = None
        self._batch_index_offset: tuple[int, int] | None = None
        # Preemption signals, held from the train start to its end and acted on where ranks are in step.
        self._signals: DeferredSignals | None = None

    @property
    def state_key(self) -> str:
        return STATE_KEY

    @property
    def sampler(self) -> ResumableSampler | None:
        """The train sampler this callback persists (the first, with several loaders), once built."""
        return next(iter(self._loaders.values())).sampler if self._loaders else None

    # ------------------------------------------------------------------- building the loader
    def shuffle_seed(self, trainer: pl.Trainer) -> int:
        """The run's shuffle seed: the checkpoint's, else ``seed_everything``'s, else drawn once by rank 0."""
        if isinstance(self._pending, LoaderState):
            return self._pending.state.seed
        if isinstance(self._pending, (LoadersState, StreamState)):
            return self._pending.seed
        if self._seed is None:
            global_seed = os.environ.get("PL_GLOBAL_SEED")
            if global_seed is not None:
                self._seed = int(global_seed)
            else:
                drawn = random.SystemRandom().randrange(2**31)
                self._seed = int(trainer.strategy.broadcast(drawn, src=0))
        return self._seed

    def _take_pending(self, kind: type) -> Any:
        restored, self._pending = self._pending, None
        if restored is not None and not isinstance(restored, kind):
            raise IncompatibleStateError(
                f"the checkpoint holds the state of {_what(restored)}, but train_dataloader() now returns"
                f" {'a stream' if kind is StreamState else 'map-style loaders of another layout'}"
            )
        return restored

    def attach(self, loader: DataLoader[Any], current_epoch: int) -> None:
        """Take ownership of ``loader`` before it is iterated: check the pass-through contract, apply a
        restored state (the sampler's and the dataset's) once, or else select the trainer's current
        epoch (a loader reloaded mid-run may be iterated, with prefetching workers, before Lightning's
        ``set_epoch``). ``loader`` is a map-style loader with a `ResumableSampler` or a
        `StreamLoader`."""
        if isinstance(loader, StreamLoader):
            self._attach_stream(loader, current_epoch)
            return
        owned = _SampledLoader(loader, key=None)
        self._loaders, self._mode = {None: owned}, None
        restored: LoaderState | None = self._take_pending(LoaderState)
        if restored is None:
            owned.sampler.set_epoch(current_epoch)
            return
        self._check_world_size(restored.state, owned.sampler.num_replicas, elastic=True)
        owned.restore(restored, self.verify)
        self._seed = restored.state.seed

    def attach_several(self, loaders: Mapping[str, DataLoader[Any]], mode: str, current_epoch: int) -> None:
        """Take ownership of several map-style loaders, by key, that a ``CombinedLoader`` in ``mode`` iterates."""
        owned = {key: _SampledLoader(loader, key) for key, loader in loaders.items()}
        self._loaders, self._mode = {key: each for key, each in owned.items()}, mode
        restored: LoadersState | None = self._take_pending(LoadersState)
        if restored is None:
            for each in owned.values():
                each.sampler.set_epoch(current_epoch)
            return
        if restored.mode != mode or set(restored.loaders) != set(owned):
            raise IncompatibleStateError(
                f"the checkpoint holds train loaders {sorted(restored.loaders)} in {restored.mode} mode; now they are"
                f" {sorted(owned)} in {mode} mode"
            )
        for key in sorted(owned):
            self._check_world_size(restored.loaders[key].state, owned[key].sampler.num_replicas, elastic=False)
            owned[key].restore(restored.loaders[key], self.verify)
        self._seed = restored.seed

    def _check_world_size(self, saved: DataState, world_size: int, elastic: bool) -> None:
        if saved.world_size == world_size:
            return
        message = (
            f"the checkpoint was written on {saved.world_size} processes and resumes on {world_size},"
            f" at epoch {saved.epoch}, global position {saved.position}"
        )
        if not elastic:
            raise WorldSizeChangedError(message + "; several train loaders resume on the same world size only")
        if not self.allow_world_size_change:
            raise WorldSizeChangedError(message + "; ResumableDataCallback(allow_world_size_change=False)")
        rank_zero_info(f"lightning_resumable: {message}; the rest of the epoch is split across the new ranks")
        self._resized_epoch = saved.epoch

    def _attach_stream(self, loader: StreamLoader, current_epoch: int) -> None:
        check_contract(loader, owned=(loader.dataset,))
        self._stream, self._loaders, self._mode = loader, {}, None
        restored: StreamState | None = self._take_pending(StreamState)
        if restored is None:
            return
        self._seed = restored.seed
        trainer = self._trainer
        rank, world_size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        state = state_for_rank(restored, rank, world_size, loader.num_workers)  # refuses another layout
        if restored.finished:  # every rank had read its whole stream: the resume starts the next epoch
            loader.start_epoch(restored.epoch + 1)
            self._stream_start = (restored.epoch + 1, None)
        elif restored.epoch == current_epoch:
            loader.restore(state, restored.batches)
            self._stream_start = (restored.epoch, restored.batches)
        else:
            raise IncompatibleStateError(
                f"the stream state resumes epoch {restored.epoch} after {restored.batches} batches, but the trainer"
                f" resumes epoch {current_epoch}"
            )

    # ----------------------------------------------------------------------------- persisting
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        silence_not_resumable_warning()
        if stage == TrainerFn.FITTING:
            # Each fit builds its train loader anew (a second fit on the same trainer too): forget the last one's.
            self._loaders, self._mode, self._stream, self._stream_start = {}, None, None, None
            self._pending, self._resized_epoch, self._first_batch, self._batch_index_offset = None, None, None, None

    def state_dict(self) -> dict[str, Any]:
        """The data state; collective (every rank's fingerprint and stream state are gathered, because
        only rank 0 writes the file).

        One loader: ``{"train": DataState, "next_batch": one [ids, content] fingerprint per rank,
        "dataset": its own state, if it has one}``. Several: ``{"seed", "mode", "loaders": {key: the
        same}}``. A stream: ``{"stream": StreamState}``.
        """
        trainer = self._trainer
        if trainer is None or (not self._loaders and self._stream is None):
            # Nothing trained yet in this process: keep a restored state that was not applied.
            return Envelope(self._pending).to_dict() if self._pending is not None else {}
        batches = self._epoch_batch_index(trainer, batches_processed(trainer))
        collective = not saving_off_the_training_path(trainer)
        if self._stream is not None:
            if not collective:
                return Envelope(None, reason=_STREAM_OFF_PATH).to_dict()
            stream = self._save_stream(trainer, self._stream, batches)
            return Envelope(
                stream, partial_accumulation=_partial_accumulation(trainer, batches, stream.finished)
            ).to_dict()
        complete = batches >= trainer.num_training_batches
        rank = trainer.global_rank
        if self._mode is None:
            body: _Restored = self._loaders[None].save(batches, complete, None, self.verify, rank, collective)
            return Envelope(body, partial_accumulation=_partial_accumulation(trainer, batches, complete)).to_dict()
        saved = {}
        for key in sorted(k for k in self._loaders if k is not None):  # the same order on every rank
            owned = self._loaders[key]
            cycle, loader_batches = loader_position(self._mode, batches, len(owned.loader))
            saved[key] = owned.save(loader_batches, complete, cycle, self.verify, rank, collective)
        body = LoadersState(self.shuffle_seed(trainer), self._mode, saved)
        return Envelope(body, partial_accumulation=_partial_accumulation(trainer, batches, complete)).to_dict()

    def _save_stream(self, trainer: pl.Trainer, loader: StreamLoader, batches: int) -> StreamState:
        check_contract(loader, owned=(loader.dataset,))
        state = loader.state_after(batches)
        ranks = all_gather_objects(state)
        return StreamState(
            seed=self.shuffle_seed(trainer),
            epoch=trainer.current_epoch,
            batches=batches,
            world_size=trainer.world_size,
            num_workers=loader.num_workers,
            global_position=bool(getattr(loader.dataset, GLOBAL_POSITION_ATTRIBUTE, False)),
            finished=all(loader_state_finished(each) for each in ranks),
            ranks=ranks,
            torchdata=torchdata_version(),
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the checkpoint's data state for the train loader about to be built; only when fitting.

        Lightning restores callbacks for every checkpoint load: ``validate``, ``test`` and ``predict``
        from a checkpoint read no train stream, so their loads leave the callback as it is.
        """
        if not state_dict or (self._trainer is not None and self._trainer.state.fn != TrainerFn.FITTING):
            return
        envelope = parse(state_dict)
        if envelope.state is None:
            raise MissingStateError(f"the checkpoint holds no resumable data state: {envelope.reason}")
        _refuse_partial_accumulation(envelope.partial_accumulation)
        if self._loaders or self._stream is not None:
            raise LateRestoreError(
                "the data state was restored after the train loader was built (the strategy restores"
                " checkpoints after setup); the stream cannot be repositioned exactly"
            )
        self._pending = envelope.state

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return  # validate/test/predict from a checkpoint read no train stream
        if self.state_key not in checkpoint.get("callbacks", {}):
            raise MissingStateError(
                "the checkpoint holds no data state: it was written without ResumableDataCallback, so the"
                " position of the train stream is unknown. Resume from a checkpoint written with the callback"
            )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._resized_epoch == trainer.current_epoch:
            # The epoch resumed on a new world size is over; count the next ones on the new size.
            self._resized_epoch = None
            rebuild_train_loader_at_next_epoch(trainer)
        elif any(owned.next_epoch_differs_in_length(trainer.current_epoch) for owned in self._loaders.values()):
            # A batch sampler's epochs may hold different numbers of batches: Lightning counts them
            # once per loader build.
            rebuild_train_loader_at_next_epoch(trainer)

    def _first_batch_index(self, trainer: pl.Trainer, batch_idx: int) -> int:
        """At each batch's start: Lightning's ``batch_idx``, checked against the data at the first batch."""
        if self._first_batch is not None:
            (epoch, expected), self._first_batch = self._first_batch, None
            if epoch == trainer.current_epoch and expected != batch_idx:
                rank_zero_warn(
                    f"lightning_resumable: the data resumes at batch {expected} of epoch {epoch}, but Lightning"
                    f" numbers that batch {batch_idx}; its loop progress in the checkpoint is inconsistent (as after"
                    " a chain of resumes through an epoch's end). The data, the step seeds, the audit log and the"
                    " next checkpoints count the epoch's batches from the data"
                )
                self._batch_index_offset = (epoch, expected - batch_idx)
        return self._epoch_batch_index(trainer, batch_idx)

    def _epoch_batch_index(self, trainer: pl.Trainer, batch_idx: int) -> int:
        """Lightning's ``batch_idx`` (or batch count), corrected where it disagreed with the data."""
        if self._batch_index_offset is not None and self._batch_index_offset[0] == trainer.current_epoch:
            return batch_idx + self._batch_index_offset[1]
        return batch_idx

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        batch_idx = self._first_batch_index(trainer, batch_idx)
        if self.seed_steps and self._seed is not None:
            seed_training_step(self._seed, trainer.current_epoch, batch_idx)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.audit_dir is not None:
            if self._audit is None:
                self._audit = AuditLog(self.audit_dir, trainer.global_rank)
            epoch_batch_idx = self._epoch_batch_index(trainer, batch_idx)
            self._audit.write(trainer.current_epoch, epoch_batch_idx, self._trained_ids(batch, epoch_batch_idx))
        if self._signals is not None:  # every rank is here, at the same batch: act on a preemption signal
            received_here = self._signals.received
            for signum in sorted(self._signals.agree(trainer.strategy.root_device)):
                handle_preemption_signal(trainer, signum, signum in received_here, self._signals.previous(signum))

    # ----------------------------------------------------------------------------- preemption
    def _hold_signals(self, trainer: pl.Trainer) -> None:
        """Under DDP, record Lightning's preemption signals while the train loop runs (see `signals`)."""
        if trainer.world_size > 1 and self._signals is None:
            signals = DeferredSignals(preemption_signals(trainer))
            if signals.install():
                self._signals = signals

    def _release_signals(self, trainer: pl.Trainer) -> None:
        """Give the signals back to Lightning; one received after the last batch only marks a SIGTERM
        (the fit is ending: no rank waits for the others any more)."""
        if self._signals is None:
            return
        signals, self._signals = self._signals, None
        for signum in signals.uninstall():
            rank_zero_info(f"signal {signum} arrived after the last training batch; the fit ends as it would")
            if signum == signal.SIGTERM:
                handle_preemption_signal(trainer, signum, True, signals.previous(signum))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._release_signals(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._release_signals(trainer)

    def _trained_ids(self, batch: Any, batch_idx: int) -> Any:
        """What the audit log records of a step: dataset indices; ``{key: indices}`` for several loaders;
        a digest of the batch for a stream, whose samples have no index."""
        if self._stream is not None:
            return digest_of(batch)
        if self._mode is None:
            return self._loaders[None].sampler.batch_indices(batch_idx)
        ids: dict[str, list[int] | None] = {}
        for key, owned in self._loaders.items():
            assert key is not None
            length = len(owned.loader)
            _, loader_batch = loader_position(self._mode, batch_idx, length)
            ids[key] = None if loader_batch >= length else owned.sampler.batch_indices(loader_batch)
        return ids

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._release_signals(trainer)
        if self._audit is not None:
            self._audit.close()
            self._audit = None

    # ---------------------------------------------------------------------------- verifying
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._loaders and self._stream is None:
            raise MissingCallbackError(
                "ResumableDataCallback found no resumable train loader: make the datamodule a"
                " ResumableDataModule (class MyData(ResumableDataModule, L.LightningDataModule))"
            )
        batches = batches_processed(trainer)
        first = 0  # the index of the first batch this process trains, by the data
        if self._stream_start is not None:
            (epoch, stream_batches), self._stream_start = self._stream_start, None
            if epoch != trainer.current_epoch or stream_batches not in (None, batches):
                raise IncompatibleStateError(
                    f"the stream state resumes epoch {epoch} after {stream_batches or 0} batches but the trainer"
                    f" resumes epoch {trainer.current_epoch} after {batches}"
                )
            first = stream_batches or 0
        for owned in self._loaders.values():
            expected = (0, batches) if self._mode is None else loader_position(self._mode, batches, len(owned.loader))
            owned.check_start(trainer, expected)
            _, _, origin_batches = owned.sampler.origin
            first = max(first, owned.sampler.cycle * len(owned.loader) + origin_batches)
        self._first_batch = (trainer.current_epoch, first)
        self._hold_signals(trainer)

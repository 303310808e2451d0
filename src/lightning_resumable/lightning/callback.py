"""The one owner of the train loaders' position: persisted in the checkpoint, applied once on restore,
verified before the first resumed step; and the owner of the training step's randomness.

The callback keeps the Lightning hooks, its options, the run's seed and the world-size policy; what
depends on the kind of train input is its `lightning_resumable.lightning.owners` owner's.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from lightning_resumable.core.deprecated import warn_if_inexact_streams_allowed
from lightning_resumable.core.randomness import global_generators_kept, seed_training_step
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.errors import (
    LateRestoreError,
    MissingCallbackError,
    MissingStateError,
)
from lightning_resumable.format.audit import AuditLog
from lightning_resumable.format.envelope import STATE_KEY, Body, Envelope, parse
from lightning_resumable.format.skips import StepRanges
from lightning_resumable.internals._lightning import (
    batches_processed,
    rebuild_train_loader,
    saving_off_the_training_path,
    silence_not_resumable_warning,
)
from lightning_resumable.internals._loop_progress import RestoredLoops, ended_epoch_resumes_at_the_next
from lightning_resumable.lightning.data_log import DataLog
from lightning_resumable.lightning.online_weights import MixtureWeights
from lightning_resumable.lightning.progress import (
    BatchCount,
    SavePoint,
    ends_its_epoch_by_count,
    partial_accumulation,
    refuse_missing_state,
    refuse_partial_accumulation,
    runs_before_next_step,
)
from lightning_resumable.lightning.signals import HeldPreemption
from lightning_resumable.lightning.skipping import SkippedSteps
from lightning_resumable.lightning.train_input import TrainOwner, run_seed
from lightning_resumable.lightning.world_size import check_world_size
from lightning_resumable.readers.quiet_fork import ForkGuard

__all__ = ["ResumableDataCallback"]


class ResumableDataCallback(MixtureWeights, pl.Callback):
    """Makes a resumed run continue as if never interrupted: same batches, same content, same steps.

    On save it records the train input's global state (seed, epoch, samples all ranks trained, the setup)
    and a fingerprint of the batch each rank trains next; on restore it hands that state to the loader
    `ResumableDataModule` builds, before its iterator exists, and at ``on_train_start`` checks where the
    trainer resumed and the next batches (the kind of train input is its `lightning_resumable.lightning.owners`
    owner's). Randomness is derived: a sample is fetched under a seed of ``(seed, epoch, global position)``.

    Args:
        allow_world_size_change: resume on a different number of processes (logged once on rank 0);
            ``False`` raises `WorldSizeChangedError` instead.
        seed_samples: seed torch's CPU generator, ``random`` and NumPy's global ``RandomState``
            before each sample is fetched, so augmentations are exact (``sample_rng()`` works either way).
        seed_steps: reseed those generators (and CUDA's) at the start of every training step (dropout is
            exact) and at its end (what runs between steps too), the same seed on every rank.
        verify: record the next batch's fingerprint at every save and compare it on resume.
        audit_dir: where each rank appends, per trained step, its epoch, batch index and sample ids
            (``audit.rank{R}.jsonl``; ``python -m lightning_resumable compare`` compares two runs).
        allow_inexact_streams: deprecated, no effect (every stream resumes exactly); ``True`` warns.
        skip_steps: steps whose data to pass over, as the resumed run numbered them (``global_step``):
            ``"40701-40900"``, ``[40701, 40900]`` or a list; at the range's first step its data is passed over,
            and that step trains what the spiking run trained after it (Long runs). Kept in the checkpoint.
        log_mixture: log a mixture's weights and each source's share to ``trainer.logger`` every
            ``log_every_n_steps`` (``mixture/weight/<source>``, ``mixture/share/<source>``).

    Raises:
        MissingStateError: resuming a checkpoint written without this callback.
        IncompatibleStateError: the checkpoint's data setup differs from the current one (and
            `WorldSizeChangedError`, `WorkerCountChangedError` where that cannot be exact).
        ResumeVerificationError: before the first resumed step, a batch differs from its fingerprint.
        MissingCallbackError: training starts without a ``ResumableDataModule`` train loader.
        ContractViolationError: an object in the train loader persists a derived quantity.
        SkipError: ``skip_steps`` cannot be honoured (malformed, before the checkpoint's step), before any step.
        PartialAccumulationError: the checkpoint was saved inside a gradient accumulation window.

    Every other refusal has a class of its own (the Exceptions page). ``state_dict`` is collective
    during training: save on every rank, as ``ModelCheckpoint`` does.

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
        allow_inexact_streams: bool = False,
        skip_steps: StepRanges = None,
        log_mixture: bool = True,
    ) -> None:
        self.allow_world_size_change, self.seed_samples = allow_world_size_change, seed_samples
        self.seed_steps, self.verify, self.audit_dir = seed_steps, verify, audit_dir
        warn_if_inexact_streams_allowed(allow_inexact_streams)
        self.skip_steps, self._skips = skip_steps, SkippedSteps(skip_steps)  # given; the skips in force in a fit
        self.log_mixture, self._log = log_mixture, DataLog(log_mixture)
        self._audit: AuditLog | None = None
        self._trainer: pl.Trainer | None = None
        self._owner: TrainOwner | None = None  # built with the loaders by train_dataloader()
        self._pending: Body | None = None  # a restored state not yet applied to a loader
        self._seed: int | None = None
        self._batches = BatchCount()
        self._preemption = HeldPreemption()
        self._started = False  # training of this fit has started: the loader's position is in use
        self._captured: dict[str, Any] | None = None  # the envelope taken where the ranks acted on a preemption
        self._forks = ForkGuard()  # every fork waits for quiet native threads, from the fit's setup to its end
        self._loops = RestoredLoops()  # the loops a fit was restored from, while no batch has run

    def __getstate__(self) -> dict[str, Any]:
        """A pickled callback (``torch.save(trainer)``) carries its options and seed; what it holds for the
        fit in this process (the trainer, the loaders' owner, audit files, signal handlers) is left behind."""
        state = self.__dict__.copy()
        state.update(_audit=None, _trainer=None, _owner=None, _batches=BatchCount(), _preemption=HeldPreemption())
        state.update(_started=False, _captured=None, _forks=ForkGuard(), _loops=RestoredLoops())
        return state

    @property
    @override
    def state_key(self) -> str:
        return STATE_KEY

    @property
    def owner(self) -> TrainOwner | None:
        """The owner of the train input's position in this fit, once built (`lightning_resumable.lightning.owners`)."""
        return self._owner

    @property
    def sampler(self) -> ResumableSampler | None:
        """The train sampler this callback persists (the first, with several loaders), once built."""
        return self._owner.first_sampler if self._owner is not None else None

    # ------------------------------------------------------------------- building the loader
    def shuffle_seed(self, trainer: pl.Trainer) -> int:
        """The run's shuffle seed: the checkpoint's, else ``seed_everything``'s, else drawn once by rank 0."""
        if self._pending is not None:
            return self._pending.seed
        if self._seed is None:
            self._seed = run_seed(trainer)
        return self._seed

    def take(self, owner: TrainOwner, current_epoch: int) -> None:
        """Take ownership of the train input's position (`lightning_resumable.lightning.train_input` built ``owner``)
        before its loaders are iterated: apply a restored state once, else select the trainer's current epoch (a
        reloaded loader may be iterated, with prefetching workers, before Lightning's ``set_epoch``); and skips."""
        previous, self._owner, restored, self._pending = self._owner, owner, self._pending, None
        verify = self.verify
        if previous is not None:  # a reload: the last loader's workers end before the new ones fork
            previous.retire_workers()
            if restored is None:  # its stream continues, where it is not a pure function of the epoch
                restored, verify = previous.carried(current_epoch), False
        if restored is None:
            self._skips.take(owner, self._trainer, lambda: owner.start_fresh(current_epoch))
            return
        policy = functools.partial(check_world_size, self.allow_world_size_change)
        self._skips.take(owner, self._trainer, lambda: owner.restore_saved(restored, current_epoch, verify, policy))
        self._seed = restored.seed

    # ----------------------------------------------------------------------------- persisting
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        silence_not_resumable_warning()
        if stage == TrainerFn.FITTING:
            # Each fit builds its train loader anew (a second fit on the same trainer too): forget the last one's.
            self._owner, self._pending, self._batches = None, None, BatchCount()
            self._started, self._captured, self._loops = False, None, RestoredLoops()
            self._skips.new_fit()
            self._forks.start()  # the validation loaders' workers fork after the batches' collectives too
            self._preemption.hold(trainer, lambda: self._capture(trainer))  # before the restore, the first workers

    @override
    def state_dict(self) -> dict[str, Any]:
        """The data state in its envelope (`lightning_resumable.format.envelope`); collective during training
        (every rank's fingerprint and stream state are gathered: only rank 0 writes the file). On an
        exception or signal path no rank waits for another: a preemption's save writes the state the
        ranks captured together where they acted on the signal (`HeldPreemption`)."""
        trainer = self._trainer
        if trainer is None or self._owner is None:
            # Nothing trained yet in this process: keep a restored state that was not applied.
            return Envelope(self._pending, skips=self._skips.checkpoint or ()).to_dict() if self._pending else {}
        if self._captured is not None:
            return self._captured
        batches = self._batches.of(trainer.current_epoch, batches_processed(trainer))
        return self._envelope(trainer, batches, not saving_off_the_training_path(trainer))

    def _envelope(self, trainer: pl.Trainer, batches: int, collective: bool) -> dict[str, Any]:
        assert self._owner is not None
        at = SavePoint.of(trainer, self.shuffle_seed(trainer), batches, collective, self.verify)
        with global_generators_kept():  # a save fetches the next batch again: it must not change the run's draws
            envelope = self._owner.envelope(at, lambda ended: partial_accumulation(trainer, batches, ended))
            return self._skips.enveloped(envelope).to_dict()

    def _capture(self, trainer: pl.Trainer, collective: bool = True) -> None:
        """Every rank's data state where all ranks act on a preemption (collective), or on one rank before an exception
        ends the workers, which a later save (``OnExceptionCheckpoint``, after an epoch's end too) cannot read."""
        batches = self._batches.of(trainer.current_epoch, batches_processed(trainer))
        self._captured = self._captured or self._envelope(trainer, batches, collective)

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._loops.write(trainer, checkpoint)

    @override
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
        refuse_partial_accumulation(envelope.partial_accumulation)
        if self._owner is not None:
            self._discard_early_loader()
        self._pending = envelope.state
        self._skips.restored(envelope.skips)

    def _discard_early_loader(self) -> None:
        """A strategy that restores after ``setup`` (FSDP, ``ModelParallelStrategy``, DeepSpeed) may have built
        the train loader and its iterator before (``estimated_stepping_batches`` in ``configure_optimizers``):
        nothing trained from it, so it is retired and Lightning builds it again for the restored state."""
        if self._started or self._trainer is None:
            raise LateRestoreError(
                "the data state was restored after training from the train loader started; the stream cannot be"
                " repositioned exactly. Restore the checkpoint with trainer.fit(..., ckpt_path=...)"
            )
        owner, self._owner = self._owner, None
        assert owner is not None
        owner.retire_workers()
        rebuild_train_loader(self._trainer)

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:  # validate/test/predict from a checkpoint read no train stream
            refuse_missing_state(checkpoint, self.state_key)
            self._loops.restored(checkpoint)
            self._skips.checkpoint_step = int(checkpoint.get("global_step", 0))
            if ends_its_epoch_by_count(checkpoint, self.state_key, trainer.world_size):
                ended_epoch_resumes_at_the_next(checkpoint)

    # ------------------------------------------------------------------------------ training
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._owner is None:
            raise MissingCallbackError(
                "ResumableDataCallback found no resumable train loader: make the datamodule a"
                " ResumableDataModule (class MyData(ResumableDataModule, L.LightningDataModule))"
            )
        self._started = True
        first = self._owner.start(trainer, batches_processed(trainer))  # refuses another place; verifies
        if self._owner.rebuild_now:  # the epoch changed under an iterator already made: build the loader again
            rebuild_train_loader(trainer)
        self._batches.first = (trainer.current_epoch, first)
        if (done := batches_processed(trainer)) and self.seed_steps and self._seed is not None:
            seed_training_step(self._seed, trainer.current_epoch, done - 1, ended=True)  # as that step left them
        self._preemption.act(trainer, at_boundary=True, before_training=True)  # a signal held since setup

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        batch_idx = self._batches.at_batch_start(trainer.current_epoch, batch_idx)
        self._loops.batch_started()
        self._captured = None  # a captured state is the position at the end of the batch before
        if self._owner is not None:
            self._owner.check_first_batch()  # a stream's resumed batch, before it trains
            self._owner.batch_started(batch_idx)
        if self.seed_steps and self._seed is not None:
            seed_training_step(self._seed, trainer.current_epoch, batch_idx)
        self._skips.step_started(trainer, batch_idx % trainer.accumulate_grad_batches == 0)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.audit_dir is not None and self._owner is not None:
            self._audit = self._audit or AuditLog(self.audit_dir, trainer.global_rank)
            epoch_batch_idx = self._batches.of(trainer.current_epoch, batch_idx)
            ids, weights = self._owner.trained_ids(batch, epoch_batch_idx), self._owner.weights_of(epoch_batch_idx)
            self._audit.write(trainer.current_epoch, epoch_batch_idx, ids, weights, self._skips.audit_mark())
        if self._owner is not None:  # every rank is here, at the same batch
            self._log.batch_trained(trainer, self._owner, self._batches.of(trainer.current_epoch, batch_idx))
            batches = self._batches.of(trainer.current_epoch, batches_processed(trainer))
            boundary = partial_accumulation(trainer, batches, batches >= trainer.num_training_batches) is None
            self._preemption.act(trainer, boundary)
            if self.seed_steps and self._seed is not None and runs_before_next_step(trainer):
                seed_training_step(self._seed, trainer.current_epoch, batches - 1, ended=True)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        owner, epoch = self._owner, trainer.current_epoch
        if owner is not None and (owner.rebuild_at_epoch_end(epoch) or owner.recount_at_epoch_end(epoch)):
            rebuild_train_loader(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end_of_training(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._owner is not None and trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            with contextlib.suppress(Exception):  # on this rank alone; data that failed fails a save from here again
                self._capture(trainer, collective=False)
        self._end_of_training(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._end_of_training(trainer)
        self._preemption.release()  # done by Lightning's teardown already, unless hooks ran without it
        if self._audit is not None:
            self._audit.close()
            self._audit = None

    def _end_of_training(self, trainer: pl.Trainer) -> None:
        """The train loaders' workers and the fork guard end with the training (signals: `HeldPreemption`)."""
        self._forks.stop()
        if self._owner is not None:
            self._owner.retire_workers()

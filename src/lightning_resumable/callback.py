"""The one owner of the train loader's position: persisted in the checkpoint, applied once on restore,
verified before the first resumed step; and the owner of the training step's randomness."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightning_resumable._lightning import (
    batches_processed,
    rebuild_train_loader_at_next_epoch,
    silence_not_resumable_warning,
)
from lightning_resumable.contract import check_contract
from lightning_resumable.errors import (
    IncompatibleStateError,
    InconsistentRankStateError,
    MissingCallbackError,
    MissingStateError,
    ResumeError,
    StateFormatError,
    WorldSizeChangedError,
)
from lightning_resumable.randomness import seed_training_step
from lightning_resumable.sampler import ResumableSampler
from lightning_resumable.state import DataState
from lightning_resumable.verification import (
    BatchFingerprint,
    all_gather_objects,
    check_fingerprints,
    digest_of,
    fingerprint_next_batch,
)


@dataclass(frozen=True)
class _Saved:
    """What the callback persists: the stream's state, each rank's next-batch fingerprint, and the
    state of a dataset that has its own (global, saved once)."""

    state: DataState
    fingerprints: list[BatchFingerprint] | None = None
    dataset: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        saved: dict[str, Any] = {"train": self.state.to_dict()}
        if self.fingerprints is not None:
            saved["next_batch"] = [fingerprint.to_list() for fingerprint in self.fingerprints]
        if self.dataset is not None:
            saved["dataset"] = self.dataset
        return saved

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> _Saved:
        if not {"train"} <= set(raw) <= {"train", "next_batch", "dataset"}:
            raise StateFormatError(f"unexpected keys in the data state: {sorted(raw)}")
        state = DataState.from_dict(raw["train"])
        fingerprints = None
        if "next_batch" in raw:
            entries = raw["next_batch"]
            if not isinstance(entries, list) or len(entries) != state.world_size:
                raise StateFormatError(
                    f"the data state must hold one batch fingerprint per rank ({state.world_size}), got {entries!r}"
                )
            fingerprints = [BatchFingerprint.from_list(entry) for entry in entries]
        dataset = raw.get("dataset")
        if dataset is not None and not isinstance(dataset, Mapping):
            raise StateFormatError(f"the dataset's state must be a dict, got {type(dataset).__name__}")
        return cls(state, fingerprints, dataset)


__all__ = ["ResumableDataCallback"]


class ResumableDataCallback(pl.Callback):
    """Makes a resumed run continue as if never interrupted: same batches, same content, same steps.

    On save it records the train loader's global state (seed, epoch, samples consumed by all ranks,
    and the setup), counting the batches the trainer has really completed rather than what the
    loader prefetched, and a fingerprint of the batch each rank trains next. On restore it hands
    that state to the sampler that :class:`~lightning_resumable.ResumableDataModule` builds inside
    ``train_dataloader()``, before the sampler's iterator exists; at ``on_train_start`` it checks
    that the trainer resumed the same epoch and batch as the data, and that the batches about to be
    trained match the fingerprints.

    Randomness is derived, never stored: each sample is fetched under a seed of ``(seed, epoch,
    global position)`` and each training step starts from a seed of ``(seed, epoch, batch index)``
    (see :mod:`lightning_resumable.randomness`).

    Args:
        allow_world_size_change: resume on a different number of processes (logged once on rank 0).
            ``False`` raises :class:`WorldSizeChangedError` instead.
        seed_samples: seed torch's CPU generator, ``random`` and NumPy's global ``RandomState``
            before each sample is fetched, so augmentations are exact after a resume.
            ``sample_rng()`` works either way.
        seed_steps: reseed those generators (and CUDA's) at the start of every training step, so
            dropout and other draws in the step are exact after a resume. Every rank gets the same
            seed, as with ``seed_everything``.
        verify: record the next batch's fingerprint at every save and compare it on resume.

    Raises:
        MissingStateError: resuming a checkpoint written without this callback.
        IncompatibleStateError: the checkpoint's data setup (dataset size, shuffle, drop_last, batch
            size) differs from the current one.
        ResumeVerificationError: on every rank, before the first resumed step, when a batch about to
            be trained differs from the one the checkpoint recorded.
        MissingCallbackError: training starts without a ``ResumableDataModule`` train loader.
        ContractViolationError: at build or at a save, an object in the train loader persists a
            derived quantity (rank, world size, shard offset...) or a wrapper persists other state
            than its inner object's (see :class:`~lightning_resumable.PassThroughWrapper`).
        InconsistentRankStateError: at a save, the ranks' datasets hold different states.

    A dataset with its own ``state_dict``/``load_state_dict`` (a curriculum, say) is persisted once,
    as global state, and restored before the loader is iterated. ``state_dict`` is collective: save
    checkpoints on every rank, as ``ModelCheckpoint`` does.

    Example::

        class MyData(ResumableDataModule, L.LightningDataModule):
            def train_dataloader(self):
                return DataLoader(self.dataset, batch_size=32, shuffle=True, num_workers=2)

        trainer = L.Trainer(strategy="ddp", devices=2, callbacks=[ResumableDataCallback()])
        trainer.fit(model, MyData(), ckpt_path="last.ckpt")
    """

    def __init__(
        self,
        allow_world_size_change: bool = True,
        seed_samples: bool = True,
        seed_steps: bool = True,
        verify: bool = True,
    ) -> None:
        self.allow_world_size_change = allow_world_size_change
        self.seed_samples = seed_samples
        self.seed_steps = seed_steps
        self.verify = verify
        self._trainer: pl.Trainer | None = None
        self._loader: DataLoader[Any] | None = None
        self._sampler: ResumableSampler | None = None
        # A restored state not yet applied to a loader.
        self._pending: _Saved | None = None
        # An applied restore whose batches are checked at on_train_start.
        self._to_verify: tuple[DataState, list[BatchFingerprint]] | None = None
        self._seed: int | None = None
        self._resized_epoch: int | None = None

    @property
    def state_key(self) -> str:
        return "ResumableDataCallback"

    @property
    def sampler(self) -> ResumableSampler | None:
        """The train sampler this callback persists, once ``train_dataloader()`` has built it."""
        return self._sampler

    # ------------------------------------------------------------------- building the loader
    def shuffle_seed(self, trainer: pl.Trainer) -> int:
        """The run's shuffle seed: the checkpoint's, else ``seed_everything``'s, else drawn once by rank 0."""
        if self._pending is not None:
            return self._pending.state.seed
        if self._seed is None:
            global_seed = os.environ.get("PL_GLOBAL_SEED")
            if global_seed is not None:
                self._seed = int(global_seed)
            else:
                drawn = random.SystemRandom().randrange(2**31)
                self._seed = int(trainer.strategy.broadcast(drawn, src=0))
        return self._seed

    def attach(self, loader: DataLoader[Any], current_epoch: int) -> None:
        """Take ownership of ``loader``'s :class:`ResumableSampler` before it is iterated: check the
        pass-through contract, apply a restored state (the sampler's and the dataset's) once, or else
        select the trainer's current epoch (a loader reloaded mid-run may be iterated, with
        prefetching workers, before Lightning's ``set_epoch``)."""
        sampler = loader.sampler
        if not isinstance(sampler, ResumableSampler):
            raise TypeError(f"the loader's sampler must be a ResumableSampler, got {type(sampler).__name__}")
        check_contract(loader, owned=(sampler,))
        self._loader, self._sampler = loader, sampler
        if self._pending is None:
            sampler.set_epoch(current_epoch)
            return
        restored, self._pending = self._pending, None
        saved, fingerprints = restored.state, restored.fingerprints
        if saved.world_size != sampler.num_replicas:
            message = (
                f"the checkpoint was written on {saved.world_size} processes and resumes on {sampler.num_replicas},"
                f" at epoch {saved.epoch}, global position {saved.position}"
            )
            if not self.allow_world_size_change:
                raise WorldSizeChangedError(message + "; ResumableDataCallback(allow_world_size_change=False)")
            rank_zero_info(f"lightning_resumable: {message}; the rest of the epoch is split across the new ranks")
            self._resized_epoch = saved.epoch
        sampler.load_state_dict(saved.to_dict())  # refuses another setup before anything is changed
        self._restore_dataset(restored.dataset)
        self._seed = saved.seed
        if not self.verify:
            return
        if fingerprints is None:
            rank_zero_info("lightning_resumable: the checkpoint holds no batch fingerprint; the resume is not verified")
        else:
            self._to_verify = (saved, fingerprints)

    def _user_dataset(self) -> object:
        assert self._loader is not None
        return getattr(self._loader.dataset, "dataset", self._loader.dataset)  # inside the SampleSeededDataset

    def _restore_dataset(self, state: Mapping[str, Any] | None) -> None:
        dataset = self._user_dataset()
        load = getattr(dataset, "load_state_dict", None)
        if state is None:
            if callable(getattr(dataset, "state_dict", None)):
                raise IncompatibleStateError(
                    f"the dataset {type(dataset).__name__} has its own state, but the checkpoint holds none: it was"
                    " written by a setup whose dataset had no state_dict"
                )
            return
        if not callable(load):
            raise IncompatibleStateError(
                f"the checkpoint holds a dataset state (keys {sorted(state)}), but the dataset"
                f" {type(dataset).__name__} has no load_state_dict"
            )
        load(state)

    def _dataset_state(self) -> Mapping[str, Any] | None:
        """The dataset's own state, checked to be the same on every rank (only rank 0 writes it); collective."""
        state_dict = getattr(self._user_dataset(), "state_dict", None)
        if not callable(state_dict):
            return None
        state: Mapping[str, Any] = state_dict()
        digests = all_gather_objects(digest_of(state))
        differing = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
        if differing:
            raise InconsistentRankStateError(
                f"the dataset {type(self._user_dataset()).__name__} holds a different state on rank(s) {differing}"
                f" than on rank 0 ({state!r} here, on rank {self._trainer.global_rank if self._trainer else 0});"
                " only rank 0's checkpoint is written, so the other ranks would resume from rank 0's state."
                " Change the dataset's state on every rank alike (for example in on_train_epoch_end)"
            )
        return state

    # ----------------------------------------------------------------------------- persisting
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        silence_not_resumable_warning()

    def state_dict(self) -> dict[str, Any]:
        """``{"train": DataState, "next_batch": one [ids, content] fingerprint per rank, "dataset": its
        own state, if it has one}``; collective.

        Lightning calls it on every rank when a checkpoint is saved; every rank's fingerprint is
        gathered, and the dataset's state compared across ranks, because only rank 0 writes the file.
        """
        if self._loader is None or self._sampler is None or self._trainer is None:
            # Nothing trained yet in this process: keep a restored state that was not applied.
            return self._pending.to_dict() if self._pending is not None else {}
        check_contract(self._loader, owned=(self._sampler,))
        trainer, sampler = self._trainer, self._sampler
        batches = batches_processed(trainer)
        if batches >= trainer.num_training_batches:
            # The epoch is complete: the resume starts the next one (Lightning does the same).
            state = replace(sampler.data_state(), epoch=sampler.epoch + 1, position=0, batches=0)
        else:
            sampler.set_consumed_batches(batches)
            state = sampler.data_state()
        fingerprints = None
        if self.verify:
            mine = fingerprint_next_batch(self._loader, state, sampler.rank, sampler.num_replicas)
            fingerprints = [BatchFingerprint.from_list(entry) for entry in all_gather_objects(mine.to_list())]
        return _Saved(state, fingerprints, self._dataset_state()).to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self._sampler is not None:
            raise ResumeError(
                "the data state was restored after the train loader was built (the strategy restores"
                " checkpoints after setup); the stream cannot be repositioned exactly"
            )
        self._pending = _Saved.from_dict(state_dict)

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
        elif self._sampler is not None:
            # A batch sampler's epochs may hold different numbers of batches: Lightning counts them
            # once per loader build.
            draws, seed, epoch = self._sampler.draws, self._sampler.seed, trainer.current_epoch
            if draws.epoch_length(seed, epoch + 1) != draws.epoch_length(seed, epoch):
                rebuild_train_loader_at_next_epoch(trainer)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.seed_steps and self._seed is not None:
            seed_training_step(self._seed, trainer.current_epoch, batch_idx)

    # ---------------------------------------------------------------------------- verifying
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        sampler, loader = self._sampler, self._loader
        if sampler is None or loader is None:
            raise MissingCallbackError(
                "ResumableDataCallback found no resumable train loader: make the datamodule a"
                " ResumableDataModule (class MyData(ResumableDataModule, L.LightningDataModule))"
            )
        epoch, _, batches = sampler.origin
        if epoch != trainer.current_epoch:
            raise IncompatibleStateError(
                f"the data state resumes epoch {epoch} but the trainer resumes epoch {trainer.current_epoch}"
            )
        if batches and batches != batches_processed(trainer):
            raise IncompatibleStateError(
                f"the data state resumes after {batches} batches of epoch {epoch} but the trainer resumes"
                f" after {batches_processed(trainer)}"
            )
        if self._to_verify is not None:
            saved, fingerprints = self._to_verify
            self._to_verify = None
            check_fingerprints(loader, saved, fingerprints, trainer.global_rank, trainer.world_size)

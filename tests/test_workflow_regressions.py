"""The workflows issue 35 found broken or silent, each shown on one process with a real Trainer (the
DDP versions run in the workflow matrix, tests/e2e/test_workflow_matrix.py). Every test here failed on
the commit before the fixes."""

from __future__ import annotations

import io
import random
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import CombinedLoader
from lightning.pytorch.utilities.data import _is_dataloader_shuffled
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset

from lightning_resumable import (
    Mixture,
    ResumableDataCallback,
    ResumableDataModule,
    ResumableSampler,
    UnsupportedLoaderError,
)

from .helpers import Data, Model, SaveAtStep, trainer


def seeded_fit(root: Path, data: L.LightningDataModule, *callbacks: L.Callback, **options: Any) -> Model:
    """A fit from ``seed_everything(3)`` (the same shuffle seed in every run); the model records its steps."""
    L.seed_everything(3, verbose=False)
    ckpt_path = options.pop("ckpt_path", None)
    model = options.pop("model", Model)()
    trainer(root, [ResumableDataCallback(), *callbacks], **options).fit(model, data, ckpt_path=ckpt_path)
    return model


# ----------------------------------------------------------------------- A: before and after a fit
class LimitedData(Data):
    """The train data with a validation loader."""

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=2)


class ValidationModel(Model):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch[0]).mean())


@pytest.mark.parametrize("how", ["save_last", "save_after_fit", "max_steps", "max_steps_mid_epoch"])
def test_a_finished_fit_extended_trains_on_as_the_longer_run(tmp_path: Path, how: str) -> None:
    """A1: ``Trainer(max_epochs=2)`` to its end, then ``max_epochs=4`` from its last checkpoint: the steps of an
    uninterrupted 4-epoch run (refused before with "the data state resumes epoch 1 but the trainer resumes epoch 2");
    the same with ``max_steps`` ending at an epoch's end, and inside one (Lightning skipped the epoch's rest)."""
    stop = {"max_steps": 16, "max_steps_mid_epoch": 13}.get(how)
    longer: dict[str, Any] = {"max_steps": 32, "max_epochs": -1} if stop else {"max_epochs": 4}
    shorter: dict[str, Any] = {"max_steps": stop, "max_epochs": -1} if stop else {"max_epochs": 2}
    full = seeded_fit(tmp_path / "full", LimitedData(), model=ValidationModel, **longer)
    last = ModelCheckpoint(dirpath=tmp_path, save_last=True)  # written at the last validation's end
    L.seed_everything(3, verbose=False)
    first = ValidationModel()
    finished = trainer(tmp_path / "first", [ResumableDataCallback(), last], enable_checkpointing=True, **shorter)
    finished.fit(first, LimitedData())
    path = tmp_path / "last.ckpt"
    if how == "save_after_fit":
        path = tmp_path / "after.ckpt"
        finished.save_checkpoint(path)
    resumed = seeded_fit(tmp_path / "resumed", LimitedData(), model=ValidationModel, ckpt_path=path, **longer)
    assert len(first.seen) == (stop or 16)
    assert first.seen + resumed.seen == full.seen


def test_a_finished_fit_of_limited_epochs_extended_trains_on_as_the_longer_run(tmp_path: Path) -> None:
    """Found by the last soak: ``limit_train_batches=4`` of 8, a 2-epoch fit saved once ``fit()`` returned and
    extended to 3 epochs was refused ("the data state resumes epoch 1 but the trainer resumes epoch 2"): the
    limit, not the sampler, had ended the saved epoch."""
    options: dict[str, Any] = dict(limit_train_batches=4, num_sanity_val_steps=0)
    full = seeded_fit(tmp_path / "full", Data(), max_epochs=3, **options)
    L.seed_everything(3, verbose=False)
    first = Model()
    finished = trainer(tmp_path / "first", [ResumableDataCallback()], max_epochs=2, **options)
    finished.fit(first, Data())
    finished.save_checkpoint(tmp_path / "after.ckpt")
    resumed = seeded_fit(tmp_path / "resumed", Data(), ckpt_path=tmp_path / "after.ckpt", max_epochs=3, **options)
    assert first.seen + resumed.seen == full.seen


@pytest.mark.parametrize("before", ["validate", "no_train_batch"])
def test_a_checkpoint_written_before_the_first_train_batch_fits_from_the_start(tmp_path: Path, before: str) -> None:
    """A2: after ``validate()``, or a fit of ``limit_train_batches=0``, a checkpoint holds no data state; a fit
    from it starts at batch 0 (refused before, as "written without ResumableDataCallback")."""

    class WithValidation(Data):
        def val_dataloader(self) -> DataLoader[Any]:
            return DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=2)

    path = tmp_path / "early.ckpt"
    limit = 0 if before == "no_train_batch" else None
    early = trainer(tmp_path / "early", [ResumableDataCallback()], limit_train_batches=limit)
    if before == "validate":
        early.validate(ValidationModel(), WithValidation())
    else:
        early.fit(Model(), WithValidation())
    early.save_checkpoint(path)
    full = seeded_fit(tmp_path / "full", Data(), max_epochs=2)
    resumed = seeded_fit(tmp_path / "resumed", Data(), ckpt_path=path, max_epochs=2)
    assert resumed.seen == full.seen


def test_a_resume_from_the_validation_ending_a_limited_epoch_goes_on_exactly(tmp_path: Path) -> None:
    """A3: ``limit_train_batches=4`` of 8 and ``val_check_interval=4``: a checkpoint at that validation's end
    resumes into the next epoch (``PendingRestoreError`` at its ``set_epoch`` before)."""

    class SaveAtValidation(L.Callback):
        def on_validation_end(self, trainer: L.Trainer, module: Any) -> None:
            if trainer.current_epoch == 0:
                trainer.save_checkpoint(tmp_path / "val.ckpt")

    options: dict[str, Any] = dict(limit_train_batches=4, val_check_interval=4, max_epochs=3, num_sanity_val_steps=0)
    L.seed_everything(3, verbose=False)
    full = ValidationModel()
    trainer(tmp_path / "full", [ResumableDataCallback()], **options).fit(full, LimitedData())
    L.seed_everything(3, verbose=False)
    trainer(tmp_path / "stop", [ResumableDataCallback(), SaveAtValidation()], **options).fit(
        ValidationModel(), LimitedData()
    )
    L.seed_everything(3, verbose=False)
    resumed = ValidationModel()
    trainer(tmp_path / "resume", [ResumableDataCallback()], **options).fit(
        resumed, LimitedData(), ckpt_path=tmp_path / "val.ckpt"
    )
    assert resumed.seen == full.seen[4:]


class SaveAtBatch(L.Callback):
    """Saves at batch ``batch`` of epoch ``epoch`` and ends the fit after it (as a kill after the save would)."""

    def __init__(self, epoch: int, batch: int, path: Path) -> None:
        self.target, self.path = (epoch, batch), path

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == self.target:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True  # the fit ends after this batch: what it trains later is not the test's


@pytest.mark.parametrize("batch", [3, 0])
def test_a_run_resumed_twice_through_an_epochs_end_goes_on_exactly(tmp_path: Path, batch: int) -> None:
    """Found by the workflow matrix: a resume from an epoch's last batch, then a save inside the next epoch, then
    a resume from that: Lightning's progress did not mark the new epoch started, so the second resume was refused
    ("the data state resumes epoch 1 but the trainer resumes epoch 0"). The second soak found the same after the
    new epoch's first batch (Lightning counts it completed only after the save): Lightning numbered the epoch's
    batches from 0 again, one behind the data, and a third resume was refused."""
    full = seeded_fit(tmp_path / "full", Data(), max_epochs=3)
    first, second, third = tmp_path / "first.ckpt", tmp_path / "second.ckpt", tmp_path / "third.ckpt"
    a = seeded_fit(tmp_path / "a", Data(), SaveAtBatch(0, 7, first), max_epochs=3)
    b = seeded_fit(tmp_path / "b", Data(), SaveAtBatch(1, batch, second), ckpt_path=first, max_epochs=3)
    c = seeded_fit(tmp_path / "c", Data(), SaveAtBatch(1, 5, third), ckpt_path=second, max_epochs=3)
    d = seeded_fit(tmp_path / "d", Data(), ckpt_path=third, max_epochs=3)
    assert a.seen + b.seen + c.seen + d.seen == full.seen


def test_a_fit_resumed_from_an_epochs_end_then_extended_goes_on_exactly(tmp_path: Path) -> None:
    """Found by the second soak: a fit resumed from an epoch's last batch runs to its end, is saved once ``fit()``
    returned, and is extended: Lightning never marked the epoch after the restart started, not even once it
    ended, so the extended fit resumed inside the finished one and trained a single batch of the next epoch."""
    full = seeded_fit(tmp_path / "full", Data(), max_epochs=3)
    first, after = tmp_path / "first.ckpt", tmp_path / "after.ckpt"
    a = seeded_fit(tmp_path / "a", Data(), SaveAtBatch(0, 7, first), max_epochs=2)
    L.seed_everything(3, verbose=False)
    b = Model()
    finished = trainer(tmp_path / "b", [ResumableDataCallback()], max_epochs=2)
    finished.fit(b, Data(), ckpt_path=first)
    finished.save_checkpoint(after)
    c = seeded_fit(tmp_path / "c", Data(), ckpt_path=after, max_epochs=3)
    assert a.seen + b.seen + c.seen == full.seen


class SavesInStep(Model):
    """Saves inside the step of batch ``batch`` of epoch ``epoch`` (a preemption's save: the resume trains that
    batch again) and ends the fit after it."""

    def __init__(self, epoch: int, batch: int, path: Path) -> None:
        super().__init__()
        self.target, self.path = (epoch, batch), path

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if (self.current_epoch, batch_idx) == self.target:
            self.trainer.save_checkpoint(self.path)
            self.trainer.should_stop = True
        return super().training_step(batch, batch_idx)


def test_a_run_resumed_from_inside_a_step_then_from_an_epochs_end_goes_on_exactly(tmp_path: Path) -> None:
    """Found by the workflow matrix: Lightning's restart resets only the ``current`` batch progress, so after a
    resume from inside a step its ``total`` stays a batch ahead, and the next resume, from an epoch's last batch,
    was not read as one (Lightning resumed the ended epoch, the data the next: refused as "the data state resumes
    epoch 1 but the trainer resumes epoch 0", or for several loaders a step trained twice)."""
    full = seeded_fit(tmp_path / "full", Data(), max_epochs=3)
    first, second = tmp_path / "first.ckpt", tmp_path / "second.ckpt"
    a = seeded_fit(tmp_path / "a", Data(), model=lambda: SavesInStep(0, 2, first), max_epochs=3)
    b = seeded_fit(tmp_path / "b", Data(), SaveAtBatch(0, 7, second), ckpt_path=first, max_epochs=3)
    c = seeded_fit(tmp_path / "c", Data(), ckpt_path=second, max_epochs=3)
    assert a.seen[:-1] + b.seen + c.seen == full.seen  # the step the first save was in is trained again


class SlowThirdBatch(TensorDataset):
    """Three workers, unshuffled batches of two: batch 1 (worker 1) is slow, so the main process, waiting for it,
    takes batch 3 (worker 0) in ahead of its turn; batch 2 (worker 2) is slower still, owed when the exception
    below ends the fit in step 1."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        if torch.utils.data.get_worker_info() is not None:
            time.sleep(
                {2: 0.3, 3: 0.3, 4: 1.0, 5: 1.0}.get(index, 0)
            )  # provokes the race; the result cannot depend on it
        return super().__getitem__(index)


class WorkersData(ResumableDataModule, L.LightningDataModule):
    """Two loaders in ``max_size`` mode (Lightning reads no batch ahead of them: the save reads it)."""

    def train_dataloader(self) -> CombinedLoader:
        slow = DataLoader(SlowThirdBatch(torch.arange(16).float().unsqueeze(1)), batch_size=2, num_workers=3)
        other = DataLoader(TensorDataset(torch.arange(8).float().unsqueeze(1)), batch_size=2)
        return CombinedLoader({"slow": slow, "other": other}, "max_size")


class FailsInStep(Model):
    """Fails once batch 1 is done (as a SIGTERM acted on there does): the checkpoint resumes at batch 2."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (self.current_epoch, batch_idx) == (0, 1) and self.fails:
            raise RuntimeError("the node went away")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append([batch[key][0].flatten().tolist() for key in sorted(batch) if batch[key] is not None])
        return self.layer(batch["slow"][0]).mean()

    fails = True


class Trains(FailsInStep):
    fails = False


def test_a_save_on_the_exception_path_reads_the_next_batch_before_the_workers_end(tmp_path: Path) -> None:
    """Found by the workflow matrix: the callback ends the train loaders' workers in ``on_exception``, before
    ``OnExceptionCheckpoint`` saves; the save then read the batch it fingerprints from a retired iterator, which
    skips the batches its workers still owed, and the resume refused the checkpoint (``ResumeVerificationError``).
    The data state is now taken before the workers end."""
    from lightning.pytorch.callbacks import OnExceptionCheckpoint

    full = seeded_fit(tmp_path / "full", WorkersData(), model=Trains)
    on_exception = OnExceptionCheckpoint(tmp_path, "failed")
    with pytest.raises(RuntimeError, match="the node went away"):
        seeded_fit(tmp_path / "a", WorkersData(), on_exception, model=FailsInStep, enable_checkpointing=True)
    resumed = seeded_fit(tmp_path / "b", WorkersData(), model=Trains, ckpt_path=tmp_path / "failed.ckpt")
    assert resumed.seen == full.seen[2:]


class ShuffledValidationData(Data):
    """A validation loader that shuffles on one process: ``RandomSampler`` draws its order from torch's generator."""

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.arange(8).float().unsqueeze(1)), batch_size=2, shuffle=True)


class RecordsValidations(Model):
    def __init__(self) -> None:
        super().__init__()
        self.validated: list[Any] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.validated.append(batch[0].flatten().tolist())


def test_a_validation_a_resume_runs_again_draws_what_it_drew_in_the_uninterrupted_run(tmp_path: Path) -> None:
    """Found by the workflow matrix: a checkpoint at an epoch's last batch resumes with that epoch's validation,
    whose shuffled loader drew its order from the global generators as the resume left them (a validation of
    other batches, other metrics). With ``seed_steps`` they are seeded at each step's end too, and a resume after
    a step seeds them as its end did."""
    options: dict[str, Any] = dict(max_epochs=2, limit_val_batches=1, num_sanity_val_steps=0)
    full = seeded_fit(tmp_path / "full", ShuffledValidationData(), model=RecordsValidations, **options)
    path = tmp_path / "last.ckpt"
    seeded_fit(tmp_path / "a", ShuffledValidationData(), SaveAtBatch(0, 7, path), model=RecordsValidations, **options)
    resumed = seeded_fit(tmp_path / "b", ShuffledValidationData(), model=RecordsValidations, ckpt_path=path, **options)
    assert len(full.validated) == 2
    assert resumed.validated == full.validated


# ------------------------------------------------------------------------------ B: saves are free
class GeneratorsAroundSave(L.Callback):
    """Saves at step 3 and records whether the global generators were the same after the save as before."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.unchanged: list[bool] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step != 3:
            return
        before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
        trainer.save_checkpoint(self.path)
        after = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
        self.unchanged = [torch.equal(before[0], after[0]), before[1] == after[1], bool((before[2] == after[2]).all())]


@pytest.mark.parametrize("options", [{}, {"seed_samples": False}, {"seed_steps": False}])
def test_a_save_leaves_the_global_generators_as_they_were(tmp_path: Path, options: dict[str, bool]) -> None:
    """B4: with ``num_workers=0`` a save fetched the next batch again in the main process and moved torch's,
    Python's and NumPy's generators: a run that checkpoints drew other numbers than one that does not."""
    around = GeneratorsAroundSave(tmp_path / "mid.ckpt")
    trainer(tmp_path, [ResumableDataCallback(**options), around], max_epochs=1).fit(Model(), Data())
    assert around.unchanged == [True, True, True]


def test_after_a_fit_the_trainer_and_its_train_loader_pickle(tmp_path: Path) -> None:
    """B5: ``torch.save(trainer)`` and pickling ``trainer.train_dataloader`` failed on a local lambda."""
    fitted = trainer(tmp_path, [ResumableDataCallback()])
    fitted.fit(Model(), Data())
    for value in (fitted.train_dataloader, fitted):
        torch.save(value, io.BytesIO())
    loader = torch.load(io.BytesIO(_saved(fitted.train_dataloader)), weights_only=False)
    assert len(list(loader)) == 8, "an unpickled loader iterates as its own"


def _saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


# ------------------------------------------------------------------------------ C: validation loaders
class ValidationLoaders(Data):
    def val_dataloader(self) -> list[DataLoader[Any]]:
        numbers = TensorDataset(torch.arange(64).float().unsqueeze(1))
        return [
            DataLoader(numbers, batch_sampler=BatchSampler(SequentialSampler(numbers), 4, False)),
            DataLoader(numbers, batch_size=8, shuffle=True),
        ]


class RecordsValidationBatches(Model):
    def __init__(self) -> None:
        super().__init__()
        self.validated: list[tuple[int, int]] = []

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.validated.append((dataloader_idx, len(batch[0])))


def test_validation_loaders_keep_their_batch_sampler_and_their_shuffle(tmp_path: Path) -> None:
    """C6: a validation loader with ``batch_sampler=BatchSampler(..., 4)`` came back with ``batch_size=1`` (64
    batches of one, not 16 of four); C7: ``shuffle=True`` was lost, so Lightning's ``DistributedSampler`` under
    DDP did not shuffle (Lightning reads it from the loader's arguments)."""
    model = RecordsValidationBatches()
    fitted = trainer(tmp_path, [ResumableDataCallback()], num_sanity_val_steps=0)
    fitted.fit(model, ValidationLoaders())
    assert sorted(set(model.validated)) == [(0, 4), (1, 8)]
    assert len(model.validated) == 16 + 8
    assert [_is_dataloader_shuffled(loader) for loader in fitted.val_dataloaders] == [False, True]


# ------------------------------------------------------------------------------------- D: mixtures
def numbers(size: int, offset: int = 0) -> TensorDataset:
    return TensorDataset(torch.arange(offset, offset + size).float().unsqueeze(1))


@pytest.mark.parametrize("order", ["shuffle", "random_sampler", "sequential_sampler", "batch_sampler"])
def test_a_loader_that_orders_a_mixture_itself_is_refused(tmp_path: Path, order: str) -> None:
    """D8: ``shuffle=True``, ``sampler=RandomSampler(...)`` or ``SequentialSampler(...)`` over a ``Mixture``
    trained, silently overridden by the mixture's order; docs/mixtures.md says they are refused."""

    class OrderedMixture(ResumableDataModule, L.LightningDataModule):
        def train_dataloader(self) -> DataLoader[Any]:
            mixture = Mixture({"a": numbers(8), "b": numbers(8, 100)}, {"a": 1, "b": 1})
            arguments: dict[str, Any] = {
                "shuffle": {"shuffle": True},
                "random_sampler": {"sampler": RandomSampler(mixture)},
                "sequential_sampler": {"sampler": SequentialSampler(mixture)},
                "batch_sampler": {"batch_sampler": BatchSampler(SequentialSampler(mixture), 2, False)},
            }[order]
            return DataLoader(mixture, **({"batch_size": 2} if order != "batch_sampler" else {}), **arguments)

    with pytest.raises(UnsupportedLoaderError, match="sets its own order"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), OrderedMixture())


class MixtureData(ResumableDataModule, L.LightningDataModule):
    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names

    def train_dataloader(self) -> DataLoader[Any]:
        sources = {"a": numbers(10), "b": numbers(6, 100), "c": numbers(8, 200)}
        weights = {"a": 2, "b": 1, "c": 1}
        mixture = Mixture({name: sources[name] for name in self.names}, {name: weights[name] for name in self.names})
        return DataLoader(mixture, batch_size=2)


@pytest.mark.parametrize("names", [["c", "b", "a"], ["b", "a", "c"]])
def test_a_mixtures_sources_are_taken_by_name_in_any_order(tmp_path: Path, names: list[str]) -> None:
    """D9: the same sources listed in another order were refused by the resume check (its sample keys were
    the mixture's indices, which depend on the order) though the stream was the right one."""
    path = tmp_path / "mid.ckpt"
    full = seeded_fit(tmp_path / "full", MixtureData(["a", "b", "c"]), max_epochs=2)
    stopped = seeded_fit(tmp_path / "stop", MixtureData(["a", "b", "c"]), SaveAtStep(5, path), max_epochs=2)
    resumed = seeded_fit(tmp_path / "resume", MixtureData(names), ckpt_path=path, max_epochs=2)
    assert stopped.seen[:5] + resumed.seen == full.seen


def test_a_removed_source_brought_back_where_it_stood_resumes(tmp_path: Path) -> None:
    """D9: a source removed at one resume and brought back at the next, at its old place in the dict, was
    refused the same way."""
    first, second = tmp_path / "first.ckpt", tmp_path / "second.ckpt"
    seeded_fit(tmp_path / "stop", MixtureData(["a", "b", "c"]), SaveAtStep(3, first), max_epochs=2)
    seeded_fit(tmp_path / "without", MixtureData(["a", "c"]), SaveAtStep(6, second), ckpt_path=first, max_epochs=2)
    back = seeded_fit(tmp_path / "back", MixtureData(["a", "b", "c"]), ckpt_path=second, max_epochs=2)
    assert back.seen, "the resume trained on"


# ------------------------------------------------------------------------- E: code written for 0.2.0
def test_the_fabric_helpers_have_their_public_home_again() -> None:
    """E11: ``from lightning_resumable.fabric import loader_state, restore_loader`` (0.2.0's spelling)."""
    from lightning_resumable.fabric import loader_state, restore_loader
    from lightning_resumable.lightning import fabric

    assert (loader_state, restore_loader) == (fabric.loader_state, fabric.restore_loader)


def test_set_consumed_batches_is_a_deprecated_alias_of_state_dict_batches() -> None:
    """E11: 0.2.0's ``set_consumed_batches(n)`` then ``state_dict()``: the state of ``state_dict(n)``, with a
    ``DeprecationWarning`` naming the new spelling."""
    sampler = ResumableSampler(range(20), num_replicas=1, rank=0, batch_size=2)
    iterator = iter(sampler)
    for _ in range(8):
        next(iterator)  # a worker read ahead of the trained batches
    with pytest.warns(DeprecationWarning, match=r"state_dict\(batches=n\)"):
        sampler.set_consumed_batches(3)
    assert sampler.state_dict() == sampler.state_dict(3)
    sampler.set_epoch(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sampler.state_dict() == sampler.data_state().to_dict(), "a new epoch forgets the declared count"


def test_an_empty_list_of_train_loaders_is_refused_naming_the_way_out(tmp_path: Path) -> None:
    """E12: ``train_dataloader()`` returning ``[]`` is refused as documented (docs/guarantees.md)."""

    class NoLoader(ResumableDataModule, L.LightningDataModule):
        def train_dataloader(self) -> list[DataLoader[Any]]:
            return []

    with pytest.raises(UnsupportedLoaderError, match=r"empty list: no train loader.*trainer\.validate"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), NoLoader())

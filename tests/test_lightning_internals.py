"""The Lightning internals in ``_lightning.py`` still exist in the installed Lightning version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_resumable.internals._lightning import batches_processed

from .helpers import Data, Model
from .helpers import trainer as make_trainer


def test_batch_progress_is_readable_from_a_fresh_trainer() -> None:
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert batches_processed(trainer) == 0
    trainer.fit_loop.epoch_loop.batch_progress.increment_processed()
    assert batches_processed(trainer) == 1


def test_the_not_resumable_warning_text_still_matches_lightnings() -> None:
    import inspect

    from lightning.pytorch.loops import training_epoch_loop

    from lightning_resumable.internals._lightning import _NOT_RESUMABLE_WARNING

    assert _NOT_RESUMABLE_WARNING in inspect.getsource(training_epoch_loop)


def test_the_fit_loop_still_rebuilds_the_train_loader_when_its_combined_loader_is_cleared() -> None:
    import inspect

    from lightning.pytorch.loops.fit_loop import _FitLoop

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert trainer.fit_loop._combined_loader is None
    assert "if self._combined_loader is not None and not self._should_reload_train_dl" in inspect.getsource(
        _FitLoop.setup_data
    )


def test_lightning_still_rebuilds_a_dataloader_subclass_from_its_recorded_arguments() -> None:
    from lightning.fabric.utilities.data import _replace_dunder_methods
    from torch.utils.data import DataLoader, SequentialSampler

    from lightning_resumable.internals._lightning import reinstantiate_loader

    class Renamed(DataLoader):  # type: ignore[type-arg]
        def __init__(self, data: object, size: int, **kwargs: object) -> None:
            super().__init__(data, batch_size=size, **kwargs)  # type: ignore[arg-type]
            self.width = size

    with _replace_dunder_methods(DataLoader, "dataset"):
        original = Renamed(range(10), 4)
    rebuilt = reinstantiate_loader(original, range(20), SequentialSampler(range(20)))
    assert type(rebuilt) is Renamed and rebuilt.width == 4 and list(rebuilt.dataset) == list(range(20))


def test_a_combined_loaders_mode_is_readable() -> None:
    from lightning.pytorch.utilities import CombinedLoader

    from lightning_resumable.internals._lightning import combined_loader_mode

    for mode in ("max_size_cycle", "max_size", "min_size", "sequential"):
        assert combined_loader_mode(CombinedLoader({"a": [1]}, mode)) == mode  # type: ignore[arg-type]


def test_lightning_does_not_take_the_stream_loader_for_a_stateful_one() -> None:
    """Lightning saves and restores loaders that match its _Stateful protocol: rank 0's state, after its
    look-ahead. The stream loader hides its state methods so that only the callback owns its state."""
    from lightning.fabric.utilities.types import _Stateful
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lightning_resumable.readers.streams import StreamLoader

    assert isinstance(StatefulDataLoader([1, 2]), _Stateful)  # the protocol still detects a plain one
    assert not isinstance(StreamLoader([1, 2]), _Stateful)


def test_lightnings_signal_handling_is_where_the_preemption_helpers_reach(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGTERM marks ``received_sigterm`` (read by the epoch loop) and runs a user's own handler (the one in
    place before the fit, which Lightning composes with its own) where it was received; the SLURM requeue
    handler saves an HPC checkpoint; a requeue signal that has a handler already is not Lightning's."""
    import signal

    from lightning_resumable.internals._lightning_signals import handle_preemption_signal, preemption_signals

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert preemption_signals(trainer) == (signal.SIGTERM,)
    calls: list[object] = []
    users = lambda signum, frame: calls.append(signum)  # noqa: E731
    handle_preemption_signal(trainer, signal.SIGTERM, received_here=False, original=users)
    assert trainer.received_sigterm and calls == []
    handle_preemption_signal(trainer, signal.SIGTERM, received_here=True, original=users)
    assert calls == [signal.SIGTERM]
    handle_preemption_signal(trainer, signal.SIGTERM, received_here=True, original=signal.SIG_DFL)
    assert calls == [signal.SIGTERM]  # the default is no handler to run

    for name, value in {
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }.items():
        monkeypatch.setenv(name, value)
    slurm = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    assert preemption_signals(slurm) == (signal.SIGTERM, signal.SIGUSR1)
    previous = signal.signal(signal.SIGUSR1, users)
    try:  # Lightning's register_signal_handlers leaves a requeue signal's handler in place: so does the library
        assert preemption_signals(slurm) == (signal.SIGTERM,)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    saved: list[str] = []
    monkeypatch.setattr(slurm, "save_checkpoint", lambda path, *args, **kwargs: saved.append(str(path)))
    connector_module = "lightning.pytorch.trainer.connectors.signal_connector"
    monkeypatch.setattr(f"{connector_module}.call", lambda cmd: calls.append(cmd) or 0)
    handle_preemption_signal(slurm, signal.SIGUSR1, received_here=True, original=None)
    assert saved == [str(tmp_path / "hpc_ckpt_1.ckpt")] and calls[-1] == ["scontrol", "requeue", "7"]


def test_lightning_sets_no_handler_of_the_held_signals_until_its_teardown_which_calls_back() -> None:
    """``register_signal_handlers`` (after the restore) and ``teardown`` go through the connector's
    ``_register_signal``: kept off the held signals, Lightning sets every other one as it does, its teardown
    calls back once, and a trainer pickled meanwhile gets Lightning's own methods back."""
    import pickle
    import signal

    from lightning_resumable.internals._lightning_signals import (
        give_signals_back_to_lightning,
        keep_lightning_from_signals,
    )

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    connector = trainer._signal_connector
    held = lambda signum, frame: None  # noqa: E731
    before = {signum: signal.signal(signum, held) for signum in (signal.SIGTERM, signal.SIGUSR1)}
    torn_down: list[bool] = []
    try:
        keep_lightning_from_signals(trainer, (int(signal.SIGTERM),), lambda: torn_down.append(True))
        copied = pickle.loads(pickle.dumps(connector))  # Lightning's own methods, bound to the copy
        assert vars(copied)["_register_signal"] is type(connector)._register_signal
        assert (
            vars(copied)["teardown"].__func__ is type(connector).teardown
            and vars(copied)["teardown"].__self__ is copied
        )
        connector.register_signal_handlers()
        assert signal.getsignal(signal.SIGTERM) is held  # not Lightning's composed handler
        connector._register_signal(signal.SIGUSR1, signal.SIG_DFL)
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # any other signal: as Lightning sets it
        connector.teardown()
        assert torn_down == [True] and signal.getsignal(signal.SIGTERM) is held
        assert signal.getsignal(signal.SIGUSR1) is held  # Lightning put back what it found
        assert "teardown" not in vars(connector) and "_register_signal" not in vars(connector)
        give_signals_back_to_lightning(trainer)  # idempotent
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_save_inside_a_lightning_signal_handler_is_off_the_training_path() -> None:
    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose

    from lightning_resumable.internals._lightning import saving_off_the_training_path

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert not saving_off_the_training_path(trainer)
    seen: list[bool] = []
    _HandlersCompose(lambda signum, frame: seen.append(saving_off_the_training_path(trainer)))(15, None)  # type: ignore[arg-type]
    assert seen == [True]


def test_fabric_still_sets_the_epoch_of_each_pass_from_the_count_restore_loader_sets() -> None:
    from torch.utils.data import DataLoader

    from lightning_resumable.internals._lightning import set_fabric_pass_count

    epochs: list[int] = []

    class Sampler(list[int]):
        def set_epoch(self, epoch: int) -> None:
            epochs.append(epoch)

    loader = L.Fabric(accelerator="cpu", devices=1).setup_dataloaders(DataLoader([0, 1], sampler=Sampler([0, 1])))
    assert set_fabric_pass_count(loader, 4) and not set_fabric_pass_count(DataLoader([0]), 4)
    list(loader)
    list(loader)
    assert epochs == [4, 5]


class _Saves(L.Callback):
    """Saves a checkpoint at each named point of a 1-process fit: after batch 2's on_train_batch_end (a
    validation follows, val_check_interval=3), after batch 0's (none follows), inside the validation
    after batch 2, and at its end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        batch_idx = args[-1]
        if trainer.current_epoch == 0 and batch_idx in (0, 2):
            trainer.save_checkpoint(self.directory / f"batch_end_{batch_idx}.ckpt")

    def on_validation_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == 3 and not trainer.sanity_checking:
            trainer.save_checkpoint(self.directory / "inside.ckpt")

    def on_validation_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == 3 and not trainer.sanity_checking:
            trainer.save_checkpoint(self.directory / "at_end.ckpt")


def _fit_with_validations(tmp_path: Path, callbacks: list[L.Callback], ckpt_path: Path | None = None) -> list[int]:
    """A 1-process fit of 6 batches validating every 3; the global steps of its validations."""
    import torch
    from torch.utils.data import DataLoader

    from lightning_resumable import ResumableDataCallback, ResumableDataModule

    steps: list[int] = []

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch.float().unsqueeze(1)).sum()

        def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            pass

        def on_validation_end(self) -> None:
            steps.append(self.trainer.global_step)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(ResumableDataModule, L.LightningDataModule):
        def train_dataloader(self) -> DataLoader[int]:
            return DataLoader(list(range(12)), batch_size=2)  # type: ignore[arg-type]

        def val_dataloader(self) -> DataLoader[int]:
            return DataLoader(list(range(4)), batch_size=2)  # type: ignore[arg-type]

    options = dict(val_check_interval=3, num_sanity_val_steps=0)
    trainer = make_trainer(tmp_path, [ResumableDataCallback(), *callbacks], **options)
    trainer.fit(Model(), Data(), ckpt_path=ckpt_path)
    return steps


@pytest.mark.parametrize(
    ("checkpoint", "validations"),
    [
        ("batch_end_0.ckpt", [3, 6]),  # none due after batch 0
        ("batch_end_2.ckpt", [3, 6]),  # the validation after batch 2 first (Lightning skipped it)
        ("inside.ckpt", [3, 6]),  # that validation again, whole (Lightning skipped it)
        ("at_end.ckpt", [6]),  # complete: not again
    ],
)
def test_lightnings_restart_runs_a_validation_written_as_restarted_before_its_first_batch(
    tmp_path: Path, checkpoint: str, validations: list[int]
) -> None:
    """The loop-progress keys and restart stages `validation_resumes_from_its_start` writes for, read by
    Lightning's own restart (``_TrainingEpochLoop.advance``, ``_EvaluationLoop.restarted_mid_evaluation``)."""
    assert _fit_with_validations(tmp_path / "full", [_Saves(tmp_path)]) == [3, 6]
    assert _fit_with_validations(tmp_path / "resumed", [], tmp_path / checkpoint) == validations


class _Unstated(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter([torch.zeros(1)])


class _Refused(Data):
    def train_dataloader(self) -> Any:
        return DataLoader(_Unstated())


def test_a_refused_train_loader_leaves_no_argument_recording_behind(tmp_path: Path) -> None:
    # Lightning's recording puts DataLoader's methods back only when train_dataloader() returns (lightning 2.6);
    # the library undoes it when its refusal raises there, so later loaders are built as plain ones.
    from lightning_resumable import ResumableDataCallback, UnsupportedLoaderError

    with pytest.raises(UnsupportedLoaderError):
        make_trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), datamodule=_Refused())
    assert not any(name.startswith("__old") for name in vars(DataLoader)), sorted(vars(DataLoader))
    assert not hasattr(DataLoader(range(4), batch_size=2), "__pl_saved_args")

"""The Lightning internals in ``_lightning.py`` still exist in the installed Lightning version."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest

from lightning_resumable._lightning import batches_processed


def test_batch_progress_is_readable_from_a_fresh_trainer() -> None:
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert batches_processed(trainer) == 0
    trainer.fit_loop.epoch_loop.batch_progress.increment_processed()
    assert batches_processed(trainer) == 1


def test_the_not_resumable_warning_text_still_matches_lightnings() -> None:
    import inspect

    from lightning.pytorch.loops import training_epoch_loop

    from lightning_resumable._lightning import _NOT_RESUMABLE_WARNING

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

    from lightning_resumable._lightning import reinstantiate_loader

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

    from lightning_resumable._lightning import combined_loader_mode

    for mode in ("max_size_cycle", "max_size", "min_size", "sequential"):
        assert combined_loader_mode(CombinedLoader({"a": [1]}, mode)) == mode  # type: ignore[arg-type]


def test_lightning_does_not_take_the_stream_loader_for_a_stateful_one() -> None:
    """Lightning saves and restores loaders that match its _Stateful protocol: rank 0's state, after its
    look-ahead. The stream loader hides its state methods so that only the callback owns its state."""
    from lightning.fabric.utilities.types import _Stateful
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lightning_resumable.streams import StreamLoader

    assert isinstance(StatefulDataLoader([1, 2]), _Stateful)  # the protocol still detects a plain one
    assert not isinstance(StreamLoader([1, 2]), _Stateful)


def test_lightnings_signal_handling_is_where_the_preemption_helpers_reach(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGTERM marks ``received_sigterm`` (read by the epoch loop); a user's handler sits in a
    ``_HandlersCompose`` with Lightning's; the SLURM requeue handler saves an HPC checkpoint."""
    import signal

    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose

    from lightning_resumable._lightning import handle_preemption_signal, preemption_signals

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert preemption_signals(trainer) == (signal.SIGTERM,)
    calls: list[object] = []
    users = lambda signum, frame: calls.append(signum)  # noqa: E731
    composed = _HandlersCompose([trainer._signal_connector._sigterm_notifier_fn, users])
    handle_preemption_signal(trainer, signal.SIGTERM, received_here=False, previous=composed)
    assert trainer.received_sigterm and calls == []
    handle_preemption_signal(trainer, signal.SIGTERM, received_here=True, previous=composed)
    assert calls == [signal.SIGTERM]  # the user's handler, not Lightning's broadcasting notifier

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
    saved: list[str] = []
    monkeypatch.setattr(slurm, "save_checkpoint", lambda path, *args, **kwargs: saved.append(str(path)))
    connector_module = "lightning.pytorch.trainer.connectors.signal_connector"
    monkeypatch.setattr(f"{connector_module}.call", lambda cmd: calls.append(cmd) or 0)
    handle_preemption_signal(slurm, signal.SIGUSR1, received_here=True, previous=None)
    assert saved == [str(tmp_path / "hpc_ckpt_1.ckpt")] and calls[-1] == ["scontrol", "requeue", "7"]


def test_a_save_inside_a_lightning_signal_handler_is_off_the_training_path() -> None:
    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose

    from lightning_resumable._lightning import saving_off_the_training_path

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert not saving_off_the_training_path(trainer)
    seen: list[bool] = []
    _HandlersCompose(lambda signum, frame: seen.append(saving_off_the_training_path(trainer)))(15, None)  # type: ignore[arg-type]
    assert seen == [True]


def test_fabric_still_sets_the_epoch_of_each_pass_from_the_count_restore_loader_sets() -> None:
    from torch.utils.data import DataLoader

    from lightning_resumable._lightning import set_fabric_pass_count

    epochs: list[int] = []

    class Sampler(list[int]):
        def set_epoch(self, epoch: int) -> None:
            epochs.append(epoch)

    loader = L.Fabric(accelerator="cpu", devices=1).setup_dataloaders(DataLoader([0, 1], sampler=Sampler([0, 1])))
    assert set_fabric_pass_count(loader, 4) and not set_fabric_pass_count(DataLoader([0]), 4)
    list(loader)
    list(loader)
    assert epochs == [4, 5]

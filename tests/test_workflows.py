"""Checkpoint loads that are not a resume of fitting (one process; the DDP versions are in tests/e2e).

``validate``, ``test`` and ``predict`` with ``ckpt_path`` load the callback's state too; they read no
train stream, so they must work before and after a ``fit`` on the same trainer, and leave a later
resume of fitting exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable import PartialAccumulationError, ResumableDataCallback, ResumableDataModule
from lightning_resumable.lightning import sampled_loader as sampled_loader_module


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same initial weights in every run
        self.layer = torch.nn.Linear(1, 1)
        self.trained: list[list[float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.trained.append(batch[0].flatten().tolist())
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", self.layer(batch[0]).pow(2).mean())

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.001)


def numbers(size: int) -> TensorDataset:
    return TensorDataset(torch.arange(size).float().unsqueeze(1))


class Data(ResumableDataModule, L.LightningDataModule):
    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(numbers(16), batch_size=2, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(numbers(4), batch_size=2)

    test_dataloader = val_dataloader
    predict_dataloader = val_dataloader


class SaveAt(L.Callback):
    def __init__(self, path: Path, batch: int) -> None:
        self.path, self.batch = path, batch

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (0, self.batch):
            trainer.save_checkpoint(self.path)


def trainer(root: Path, *callbacks: L.Callback, **options: Any) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        callbacks=[ResumableDataCallback(), *callbacks],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **options,
    )


def test_fit_then_validate_test_and_predict_from_best_and_a_path_on_the_same_and_a_new_trainer(tmp_path: Path) -> None:
    best = ModelCheckpoint(dirpath=tmp_path / "best", monitor="val_loss", save_top_k=1)
    fitted = trainer(tmp_path, best)
    model = Model()
    fitted.fit(model, Data())
    assert best.best_model_path

    results = {}
    for which, on in (("best", fitted), (best.best_model_path, trainer(tmp_path / "new"))):
        for name in ("validate", "test"):
            results[name, on is fitted] = getattr(on, name)(model, Data(), ckpt_path=which)
        assert len(on.predict(model, Data(), ckpt_path=which)) == 2  # type: ignore[arg-type]
    assert results["validate", True] == results["validate", False]
    assert results["test", True] == results["test", False]


def test_evaluating_before_a_resume_on_the_same_trainer_leaves_the_resume_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")  # the shuffle seed of every run (seed_everything's)
    full = Model()
    trainer(tmp_path / "full").fit(full, Data())
    checkpoint = tmp_path / "mid.ckpt"
    stopped = Model()
    stop = trainer(tmp_path / "stop", SaveAt(checkpoint, batch=3))
    stop.fit(stopped, Data())

    resumed, same = Model(), trainer(tmp_path / "resume")
    same.validate(resumed, Data(), ckpt_path=checkpoint)
    same.test(resumed, Data(), ckpt_path=checkpoint)
    same.predict(resumed, Data(), ckpt_path=checkpoint)
    same.fit(resumed, Data(), ckpt_path=checkpoint)
    assert stopped.trained[:4] + resumed.trained == full.trained

    # And a second resume on that trainer, after its fit: the fit's loader does not block the load.
    again = Model()
    same.fit_loop.max_epochs = 2
    same.fit(again, Data(), ckpt_path=checkpoint)
    assert stopped.trained[:4] + again.trained == full.trained


def test_a_save_inside_an_accumulation_window_is_refused_and_one_at_its_boundary_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    full = Model()
    trainer(tmp_path / "full", accumulate_grad_batches=3).fit(full, Data())
    for batch in (3, 5):  # 4 batches trained (1 of 3 accumulated), then 6 (a boundary)
        checkpoint = tmp_path / f"at{batch}.ckpt"
        stopped = Model()
        trainer(tmp_path / "stop", SaveAt(checkpoint, batch), accumulate_grad_batches=3).fit(stopped, Data())
        resumed = Model()
        resume = trainer(tmp_path / "resume", accumulate_grad_batches=3)
        if batch == 3:
            with pytest.raises(PartialAccumulationError, match="1 of accumulate_grad_batches=3 batches"):
                resume.fit(resumed, Data(), ckpt_path=checkpoint)
            continue
        resume.fit(resumed, Data(), ckpt_path=checkpoint)
        assert stopped.trained[: batch + 1] + resumed.trained == full.trained
        assert torch.equal(resumed.layer.weight, full.layer.weight), "the same optimizer steps, bit for bit"


class FailAt(L.Callback):
    """An exception inside training, as a SIGTERM becomes Lightning's SIGTERMException."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (0, self.batch):
            raise KeyboardInterrupt  # Lightning's graceful-shutdown path; any exception reaches on_exception


def test_a_save_from_the_exception_path_gathers_nothing_and_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    full = Model()
    trainer(tmp_path / "full").fit(full, Data())

    def no_collective(value: object) -> list[object]:
        raise AssertionError("a collective on the exception path: the ranks may be in different places")

    stopped = Model()
    on_exception = OnExceptionCheckpoint(dirpath=tmp_path, filename="interrupted")
    with monkeypatch.context() as patched:
        patched.setattr(sampled_loader_module, "all_gather_objects", no_collective)
        with pytest.raises(SystemExit):
            trainer(tmp_path / "stop", FailAt(batch=4), on_exception).fit(stopped, Data())
    checkpoint = tmp_path / "interrupted.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["callbacks"]["ResumableDataCallback"]["state"]
    assert len(saved["next_batch"]) == 1, "rank 0 fingerprinted every rank's next batch itself"

    resumed = Model()
    trainer(tmp_path / "resume").fit(resumed, Data(), ckpt_path=checkpoint)
    assert stopped.trained + resumed.trained == full.trained

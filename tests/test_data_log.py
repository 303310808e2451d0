"""The mixture in the trainer's logger, read back from what the CSV and TensorBoard loggers wrote: the weights
each logged step was drawn under and each source's share of the samples trained since the last log (computed
here from the audit log, independently), at Lightning's interval; a skip logged at its step; off with one option."""

from __future__ import annotations

import csv
import struct
from fractions import Fraction
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import Mixture, ResumableDataCallback, ResumableDataModule, WeightSchedule
from lightning_resumable.format.audit import read_audit

SIZES = {"a": 40, "b": 30}
SCHEDULE = {0: {"a": 3, "b": 1}, 6: {"a": 1, "b": 1}}
STEPS, EVERY = 12, 3


class Ids(Dataset[torch.Tensor]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])


class Data(ResumableDataModule, L.LightningDataModule):
    def train_dataloader(self) -> Any:
        mixture = Mixture({name: Ids(size) for name, size in SIZES.items()}, WeightSchedule(SCHEDULE))
        return DataLoader(mixture, batch_size=4)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def csv_rows(logger: CSVLogger) -> list[dict[str, str]]:
    with Path(logger.log_dir, "metrics.csv").open() as file:
        return list(csv.DictReader(file))


def fit(tmp_path: Path, logger: Any, **options: Any) -> Path:
    audit = tmp_path / "audit"
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=STEPS, logger=logger, log_every_n_steps=EVERY,
        callbacks=[ResumableDataCallback(audit_dir=str(audit), **options)], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Model(), Data())
    return audit


def expected(audit: Path, skipped: int = 0) -> dict[int, dict[str, float]]:
    """Per logged step (Lightning's: every EVERY-th, counted from 0 as ``self.log`` counts), the weights its
    batch was drawn under and each source's share of the samples trained since the last log."""
    steps = read_audit(audit)[0]
    metrics = {}
    for last in range(EVERY - 1, STEPS, EVERY):
        window = [name for step in steps[last - EVERY + 1 : last + 1] for name, _ in step["ids"]]
        weights = {name: float(Fraction(weight)) for name, weight in steps[last]["weights"].items()}
        metrics[last] = {f"mixture/weight/{name}": weights[name] for name in SIZES}
        metrics[last].update({f"mixture/share/{name}": window.count(name) / len(window) for name in SIZES})
    return metrics


def test_the_csv_logger_gets_the_weights_and_the_shares_at_its_interval(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name="csv")
    audit = fit(tmp_path, logger)
    rows = csv_rows(logger)
    logged = {
        int(row["step"]): {key: float(value) for key, value in row.items() if key != "step" and value} for row in rows
    }
    want = expected(audit)
    assert {step: values for step, values in logged.items() if values} == want
    assert want[2]["mixture/weight/a"] == 0.75 and want[11]["mixture/weight/a"] == 0.5  # the schedule's change shows


def tensorboard_scalars(directory: str) -> dict[int, dict[str, float]]:
    """The scalars of the event files under ``directory``: TFRecord framing (length, its CRC, the Event, its CRC)."""
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    scalars: dict[int, dict[str, float]] = {}
    for path in Path(directory).rglob("events.out.tfevents.*"):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(event.step, {})[value.tag] = value.simple_value
    return scalars


def test_the_tensorboard_logger_gets_the_same(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    logger = TensorBoardLogger(tmp_path, name="tb")
    audit = fit(tmp_path, logger)
    logger.finalize("success")
    scalars = tensorboard_scalars(logger.log_dir)
    want = expected(audit)
    for step, values in want.items():  # TensorBoard keeps 32-bit floats
        assert scalars[step] == pytest.approx(values, rel=1e-6)


def test_a_skip_is_logged_at_its_step_and_the_mixture_can_be_turned_off(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name="csv")
    fit(tmp_path, logger, skip_steps="4-5", log_mixture=False)
    rows = csv_rows(logger)
    assert [(int(row["step"]), float(row["data/skipped_steps"])) for row in rows if row.get("data/skipped_steps")] == [
        (4, 2.0)
    ]
    assert not any(key.startswith("mixture/") for row in rows for key, value in row.items() if value)

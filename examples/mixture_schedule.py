"""Stop a 2-process DDP run on a mixture of three sources, change the weights, resume, and compare.

Run: ``python examples/mixture_schedule.py``. A tiny model trains on a ``Mixture`` of three sources
("web", "code", "books": samples carry their source in their id, and a random augmentation drawn from
torch, ``random`` and NumPy), with 2 workers per process, three times:

1. straight through, with a schedule that changes the weights at step 12:
   ``WeightSchedule({0: {"web": 6, "code": 3, "books": 1}, 12: {"web": 2, "code": 2, "books": 6}})``;
2. with the first weights only, stopped by ``max_steps`` at step 12 after a checkpoint;
3. resumed from that checkpoint with the new weights, as a user edits a config before a resume.

It then prints, per rank, how many steps of the stopped and resumed run read the same sample ids,
the same augmentations and the same loss (bit for bit) as the uninterrupted run whose schedule
changed there, each source's share of the samples before and after the change, and one verdict line
(``EXACT``, or ``DIFFERENT`` and the exit status 1).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import Mixture, ResumableDataCallback, ResumableDataModule, WeightSchedule

FIRST = {"web": 6, "code": 3, "books": 1}
LATER = {"web": 2, "code": 2, "books": 6}
SWITCH_STEP = 12
SOURCES = {"web": (0, 60), "code": (1000, 30), "books": (2000, 20)}  # name: (first id, size)
STEPS = 30
BATCH_SIZE = 4


class Source(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """One source: sample ``i`` has id ``first + i`` and features under a random augmentation."""

    def __init__(self, first: int, size: int) -> None:
        self.first, self.size = first, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.randn(8, generator=torch.Generator().manual_seed(self.first + index))
        features = features * (0.5 + torch.rand(())) + float(np.random.normal(scale=0.1))
        return torch.tensor(self.first + index), features.flip(0) if random.random() < 0.5 else features


class MixtureData(ResumableDataModule, L.LightningDataModule):
    def __init__(self, weights: Any) -> None:
        super().__init__()
        self.weights = weights

    def train_dataloader(self) -> DataLoader[Any]:
        sources = {name: Source(first, size) for name, (first, size) in SOURCES.items()}
        mixture = Mixture(sources, self.weights, samples_per_epoch=64)
        return DataLoader(mixture, batch_size=BATCH_SIZE, num_workers=2)


class Model(L.LightningModule):
    def __init__(self, record_path: str) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.record_path = record_path

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[1]).pow(2).mean()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        record = {"step": self.global_step, "ids": batch[0].tolist(), "aug": batch[1][:, 0].tolist()}
        with open(f"{self.record_path}.rank{self.global_rank}.jsonl", "a") as file:
            file.write(json.dumps({**record, "loss": outputs["loss"].item()}) + "\n")
        if self.global_step == SWITCH_STEP and self.trainer.max_steps == SWITCH_STEP:
            self.trainer.save_checkpoint(Path(self.record_path).with_name("stopped.ckpt"))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def train(work: Path, phase: str) -> None:
    """One run, on 2 processes (Lightning starts the second by running this command again)."""
    warnings.filterwarnings("ignore")
    L.seed_everything(7, verbose=False)
    weights = {"full": WeightSchedule({0: FIRST, SWITCH_STEP: LATER}), "stop": FIRST, "resume": LATER}[phase]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=SWITCH_STEP if phase == "stop" else STEPS,
        deterministic=True,
        callbacks=[ResumableDataCallback()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=work,
    )
    checkpoint = work / "stopped.ckpt" if phase == "resume" else None
    trainer.fit(Model(str(work / phase)), MixtureData(weights), ckpt_path=checkpoint)


def records(work: Path, phase: str, rank: int) -> list[dict[str, Any]]:
    path = work / f"{phase}.rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def source_of(sample: int) -> str:
    return next(name for name, (first, size) in SOURCES.items() if first <= sample < first + size)


def shares(steps: list[dict[str, Any]]) -> str:
    counts = Counter(source_of(sample) for step in steps for sample in step["ids"])
    total = sum(counts.values())
    return ", ".join(f"{name} {counts[name] / total:.2f}" for name in SOURCES)


def compare(work: Path) -> bool:
    exact = True
    for rank in range(2):
        full = records(work, "full", rank)
        interrupted = records(work, "stop", rank) + records(work, "resume", rank)
        same = {
            name: sum(a[name] == b[name] for a, b in zip(full, interrupted, strict=False))
            for name in ("ids", "aug", "loss")
        }
        steps = len(full)
        exact &= len(interrupted) == steps and all(count == steps for count in same.values())
        print(
            f"rank {rank}: {steps} steps; the stopped and resumed run has the same ids in {same['ids']},"
            f" augmentations in {same['aug']}, loss bits in {same['loss']}"
        )
        before = [step for step in interrupted if step["step"] <= SWITCH_STEP]
        after = [step for step in interrupted if step["step"] > SWITCH_STEP]
        print(f"        shares before the change: {shares(before)}; after it: {shares(after)}")
    print(f"weights {FIRST} -> {LATER} at step {SWITCH_STEP}, changed at the resume")
    return exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=["full", "stop", "resume"])
    parser.add_argument("--work", type=Path)
    arguments = parser.parse_args()
    if arguments.phase:
        train(arguments.work, arguments.phase)
        return
    with tempfile.TemporaryDirectory(prefix="mixture-") as directory:
        work = Path(directory)
        for phase in ("full", "stop", "resume"):
            command = [sys.executable, __file__, "--phase", phase, "--work", str(work)]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        exact = compare(work)
    print("EXACT: the resumed run equals the run whose schedule changed there" if exact else "DIFFERENT")
    sys.exit(0 if exact else 1)


if __name__ == "__main__":
    main()

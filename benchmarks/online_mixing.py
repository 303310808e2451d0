"""What a change of a mixture's weights set by the training costs, in a real 2-process DDP fit (gloo, CPU).

``python benchmarks/online_mixing.py [STEPS [REPEATS]]`` trains a small model on a ``Mixture`` of 3 sources of
10^6 samples each (batch 32 a rank), with 0 and 2 loader workers, three times each: the weights never
set, set every 50 steps, and set every step (alternating two weight vectors, so every call changes the
stream). Per setting, on rank 0: the mean time of a training step over the run's steps after the
first 20 (and its ratio to the run without changes), the mean time of one ``set_mixture_weights`` call
(its all-gather across ranks included), and the time from the call to the start of the first step drawn
under the new weights, in steps and in milliseconds (the delay is the loader's read-ahead, by design).
Prints a table; numbers move by 10 to 20% from run to run on a 2-core machine.
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import Mixture, ResumableDataCallback, ResumableDataModule

SIZE, BATCH = 10**6, 32
WEIGHTS = ({"web": 6.0, "code": 3.0, "books": 1.0}, {"web": 2.0, "code": 3.0, "books": 5.0})


class Features(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((16,), float(index % 97))


class Data(ResumableDataModule, L.LightningDataModule):
    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers

    def train_dataloader(self) -> DataLoader[Any]:
        mixture = Mixture({name: Features() for name in WEIGHTS[0]}, WEIGHTS[0])
        return DataLoader(mixture, batch_size=BATCH, num_workers=self.workers)


class Model(L.LightningModule):
    def __init__(self, every: int, out: str) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.every, self.out = every, out
        self.starts: list[float] = []
        self.calls: list[tuple[int, float, int]] = []  # (asked at, its duration, the step it takes effect)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.starts.append(time.perf_counter())

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.every and batch_idx % self.every == self.every - 1:
            data = ResumableDataCallback.of(self.trainer)
            start = time.perf_counter()
            change = data.set_mixture_weights(WEIGHTS[len(self.calls) % 2 == 0])
            self.calls.append((batch_idx, time.perf_counter() - start, change.step))
        return self.net(batch).pow(2).mean()

    def on_train_end(self) -> None:
        if self.global_rank == 0:
            Path(self.out).write_text(json.dumps({"starts": self.starts, "calls": self.calls}))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def fit(workers: int, every: int, steps: int, out: str) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=steps,
        callbacks=[ResumableDataCallback()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(every, out), Data(workers))


def measured(workers: int, every: int, steps: int, repeats: int) -> dict[str, float]:
    """The best of ``repeats`` fits (by step time)."""
    return min((measured_once(workers, every, steps) for _ in range(repeats)), key=lambda result: result["step_ms"])


def measured_once(workers: int, every: int, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        out = str(Path(directory) / "times.json")
        command = [sys.executable, __file__, "--fit", str(workers), str(every), str(steps), out]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
        times = json.loads(Path(out).read_text())
    starts, calls = times["starts"], times["calls"]
    step_ms = statistics.mean(b - a for a, b in itertools.pairwise(starts[20:])) * 1e3
    result = {"step_ms": step_ms, "call_ms": 0.0, "delay_steps": 0.0, "delay_ms": 0.0}
    if calls:
        result["call_ms"] = statistics.mean(duration for _, duration, _ in calls) * 1e3
        timed = [(asked, effect) for asked, _, effect in calls if effect < len(starts)]
        result["delay_steps"] = statistics.mean(effect - asked for asked, effect in timed)
        result["delay_ms"] = statistics.mean((starts[effect] - starts[asked]) * 1e3 for asked, effect in timed)
    return result


def main() -> None:
    if sys.argv[1:2] == ["--fit"]:
        fit(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    print(
        f"2 processes (gloo, CPU), a Mixture of 3 sources of {SIZE:,}, batch {BATCH} a rank, {steps} steps;"
        f" best of {repeats} fits"
    )
    print("| workers | weights set | step | x unchanged | one call | to the first batch drawn under them |")
    print("|---:|---|---:|---:|---:|---:|")
    for workers in (0, 2):
        base = None
        for every, label in ((0, "never"), (50, "every 50 steps"), (1, "every step")):
            result = measured(workers, every, steps, repeats)
            base = base or result["step_ms"]
            call = f"{result['call_ms']:.2f} ms" if every else "-"
            delay = f"{result['delay_steps']:.0f} steps, {result['delay_ms']:.1f} ms" if every else "-"
            step = f"{result['step_ms']:.2f} ms | {result['step_ms'] / base:.2f}x"
            print(f"| {workers} | {label} | {step} | {call} | {delay} |")


if __name__ == "__main__":
    main()

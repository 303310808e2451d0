"""Lightning steps per second with the two lines against plain Lightning, in the same run.

``python benchmarks/step_overhead.py [ROUNDS] [STEPS]`` fits a small conv net with dropout (1 process,
batch 32) on 3x40x40 images that ``__getitem__`` crops at random to 32x32 and flips (torch's global
generator), with 0 and 2 workers, plain and with the library, each fit in a fresh process. Within a
round the four configurations run in an order that alternates from round to round. Prints, per worker
count, the median steps/s of each, the median of the per-round ratios, a 95% bootstrap interval of
that median and the lowest and highest ratio. On this 2-core machine one fit's rate varies by about
15% from the next one's (with 1 intra-op thread too), so a gap is real only where the interval
excludes 1.0 and its width is smaller than the gap; add rounds until it is. Then (alone with
``--cost``) what the library adds per batch, measured in-process where noise hardly reaches: the
per-sample seeding of a batch's fetch against the plain fetch and the step.
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import time
import timeit
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from lightning_resumable import ResumableDataCallback, ResumableDataModule, ResumableSampler, SampleSeededDataset

BATCH = 32


class Images(Dataset[tuple[torch.Tensor, int]]):
    """3x40x40 images, cropped at random to 32x32 and flipped (torch's global generator)."""

    def __init__(self) -> None:
        self.images = torch.rand(1024, 3, 40, 40)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        top, left = torch.randint(0, 9, (2,)).tolist()
        image = self.images[index, :, top : top + 32, left : left + 32]
        return (image.flip(-1) if torch.rand(()) < 0.5 else image), index % 10


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(512, 10),
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clock(L.Callback):
    """Starts at the 10th step: the workers' start and the first steps are not timed."""

    start = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == 10:
            self.start = time.perf_counter()


def fit(workers: int, library: bool, steps: int) -> float:
    """One fit's steps per second, from the 10th step on."""

    class Plain(L.LightningDataModule):
        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(Images(), batch_size=BATCH, num_workers=workers, shuffle=True)

    class Resumable(ResumableDataModule, Plain):
        pass

    clock = Clock()
    callbacks: list[L.Callback] = [clock, *([ResumableDataCallback()] if library else [])]
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(Net(), datamodule=Resumable() if library else Plain())
    return (steps - 10) / (time.perf_counter() - clock.start)


def steps_per_second(workers: int, variant: str, steps: int) -> float:
    command = [sys.executable, __file__, "--fit", str(workers), variant, str(steps)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def interval(ratios: list[float], resamples: int = 10000) -> str:
    """A 95% bootstrap interval of the median ratio (a fixed seed: the same rates print the same interval)."""
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return f"{medians[int(0.025 * resamples)]:.3f}x-{medians[int(0.975 * resamples)]:.3f}x"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 160
    configurations = [(workers, variant) for workers in (0, 2) for variant in ("plain", "library")]
    rates: dict[tuple[int, str], list[float]] = {each: [] for each in configurations}
    for round_index in range(rounds):
        order = configurations if round_index % 2 == 0 else configurations[::-1]
        for workers, variant in order:
            rates[workers, variant].append(steps_per_second(workers, variant, steps))
    print(f"Lightning steps/s, 1 process, batch 32, {steps} steps ({steps - 10} timed), {rounds} alternating rounds")
    print("| num_workers | plain Lightning | with the library | ratio (median) | 95% interval | lowest, highest |")
    print("|---|---|---|---|---|---|")
    for workers in (0, 2):
        plain, ours = rates[workers, "plain"], rates[workers, "library"]
        ratios = sorted(mine / theirs for mine, theirs in zip(ours, plain, strict=True))
        print(
            f"| {workers} | {statistics.median(plain):.1f} | {statistics.median(ours):.1f} |"
            f" {statistics.median(ratios):.3f}x | {interval(ratios)} | {ratios[0]:.3f}x, {ratios[-1]:.3f}x |"
        )


def cost_per_batch(rounds: int = 40) -> None:
    """What the library adds to a step, measured in-process: each variant's best time over ``rounds``
    interleaved repeats (so a slow moment of the machine reaches every variant alike). A batch's fetch
    as a worker does it (each sample seeded) and as the main process does it (the global generators
    put back), the plain fetch with one global generator seeded per sample, and the step itself."""
    dataset, sampler = Images(), ResumableSampler(Images(), 1, 0, batch_size=BATCH, sample_keys=True)
    keys = list(sampler)[:BATCH]
    seeded = SampleSeededDataset(dataset)
    net, batch = Net(), default_collate([dataset[index] for index, _ in keys])
    optimizer = net.configure_optimizers()

    def step() -> None:
        optimizer.zero_grad()
        net.training_step(batch, 0).backward()
        optimizer.step()

    def fetch_seeding(seed_one: Any) -> Any:
        return lambda: default_collate([(seed_one(seed), dataset[index])[1] for index, seed in keys])

    variants = {
        "plain fetch": lambda: default_collate([dataset[index] for index, _ in keys]),
        "plain fetch, torch's generator seeded per sample": fetch_seeding(torch.default_generator.manual_seed),
        "plain fetch, Python's random seeded per sample": fetch_seeding(random.seed),
        "plain fetch, NumPy's seeded per sample": fetch_seeding(lambda seed: np.random.seed(seed & 0xFFFFFFFF)),
        "fetch, each sample seeded (a worker)": lambda: default_collate(seeded.fetch(keys, restore_globals=False)),
        "fetch, seeded, generators put back (0 workers)": lambda: default_collate(seeded.fetch(keys)),
    }
    best = dict.fromkeys([*variants, "step"], float("inf"))
    for _ in range(rounds):
        for name, run in [*variants.items(), ("step", step)]:
            best[name] = min(best[name], timeit.timeit(run, number=5) / 5 * 1e6)
    plain, trained = best["plain fetch"], best["step"]
    print(f"\nPer batch of {BATCH}, in-process (best of {rounds} interleaved repeats):")
    print("| what | time | added to a step (fetch + step) |")
    print("|---|---|---|")
    print(f"| the step (forward, backward, SGD) | {trained:.0f} µs | |")
    for name in variants:
        added = "" if name == "plain fetch" else f"{(best[name] - plain) / (plain + trained):+.1%}"
        print(f"| {name} | {best[name]:.0f} µs | {added} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fit"]:
        print(fit(int(sys.argv[2]), sys.argv[3] == "library", int(sys.argv[4])))
    elif sys.argv[1:2] == ["--cost"]:
        cost_per_batch()
    else:
        main()
        cost_per_batch()

"""Lightning steps per second with the two lines against plain Lightning, in the same run.

``python benchmarks/step_overhead.py [ROUNDS] [STEPS]`` (``STEP_OVERHEAD_WORKERS=0`` for the 0-worker pair
alone, twice the rounds in the same time) fits a small conv net with dropout (1 process,
batch 32) on 3x40x40 images that ``__getitem__`` crops at random to 32x32 and flips (torch's global
generator), with 0 and 2 workers, plain and with the library, each fit in a fresh process forked from
this one (torch and Lightning imported once: a fit starts in a fraction of a second, so many short
rounds fit in the time of a few long ones). Within a round the four configurations run in an order
that alternates from round to round. Prints, per worker
count, the median steps/s of each, the median of the per-round ratios, a 95% bootstrap interval of
that median and the lowest and highest ratio. On this 2-core machine one fit's rate varies by about
15% from the next one's (with 1 intra-op thread too), so a gap is real only where the interval
excludes 1.0 and its width is smaller than the gap; add rounds until it is. Then (alone with
``--cost``) what the library adds per batch, measured in-process where noise hardly reaches: the
per-sample seeding of a batch's fetch against the plain fetch and the step, and the callback's per-batch hooks.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import statistics
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


def _fit_and_send(connection: Any, workers: int, library: bool, steps: int) -> None:
    quiet = os.open(os.devnull, os.O_WRONLY)  # Lightning's banners, once per fit
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    connection.send(fit(workers, library, steps))


def steps_per_second(workers: int, variant: str, steps: int) -> float:
    """One fit in a process forked from this one, which has imported torch and Lightning once: a fresh
    process per fit (nothing of one fit's state reaches the next) that starts in a fraction of a second,
    so that many short rounds fit in the time of a few long ones, and adjacent fits meet the same machine."""
    context = multiprocessing.get_context("fork")
    receiving, sending = context.Pipe(duplex=False)
    child = context.Process(target=_fit_and_send, args=(sending, workers, variant == "library", steps))
    child.start()
    rate = float(receiving.recv())
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"the fit with {workers} workers ({variant}) ended with exit code {child.exitcode}")
    return rate


def interval(ratios: list[float], resamples: int = 10000) -> str:
    """A 95% bootstrap interval of the median ratio (a fixed seed: the same rates print the same interval)."""
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return f"{medians[int(0.025 * resamples)]:.3f}x-{medians[int(0.975 * resamples)]:.3f}x"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 160
    worker_counts = [int(each) for each in os.environ.get("STEP_OVERHEAD_WORKERS", "0,2").split(",")]
    configurations = [(workers, variant) for workers in worker_counts for variant in ("plain", "library")]
    rates: dict[tuple[int, str], list[float]] = {each: [] for each in configurations}
    for round_index in range(rounds):
        order = configurations if round_index % 2 == 0 else configurations[::-1]
        for workers, variant in order:
            rates[workers, variant].append(steps_per_second(workers, variant, steps))
    print(f"Lightning steps/s, 1 process, batch 32, {steps} steps ({steps - 10} timed), {rounds} alternating rounds")
    print("| num_workers | plain Lightning | with the library | ratio (median) | 95% interval | lowest, highest |")
    print("|---|---|---|---|---|---|")
    for workers in worker_counts:
        plain, ours = rates[workers, "plain"], rates[workers, "library"]
        ratios = sorted(mine / theirs for mine, theirs in zip(ours, plain, strict=True))
        print(
            f"| {workers} | {statistics.median(plain):.1f} | {statistics.median(ours):.1f} |"
            f" {statistics.median(ratios):.3f}x | {interval(ratios)} | {ratios[0]:.3f}x, {ratios[-1]:.3f}x |"
        )


def cost_per_batch(rounds: int = 40) -> None:
    """What the library adds to a step, measured in-process: each variant's best time over ``rounds``
    interleaved repeats (so a slow moment of the machine reaches every variant alike). Every fetch seeds
    torch's generator per sample from the library's seeds (1 µs a sample), so that each crops and flips
    the same way: a flip costs 18 µs, and a best-of over unseeded fetches would pick their fewest flips.
    Then each of the other global generators seeded as well, the library's fetch as a worker does it
    (this dataset draws from neither of the others, so they are left alone) and as the main process
    does it (the caller's generators put back after the batch), and the step itself."""
    dataset, sampler = Images(), ResumableSampler(Images(), 1, 0, batch_size=BATCH, sample_keys=True)
    keys = list(sampler)[:BATCH]
    seeded = SampleSeededDataset(dataset)
    net, batch = Net(), default_collate([dataset[index] for index, _ in keys])
    optimizer = net.configure_optimizers()

    def step() -> None:
        optimizer.zero_grad()
        net.training_step(batch, 0).backward()
        optimizer.step()

    def fetch_seeding(seed_others: Any) -> Any:
        seed_torch = torch.default_generator.manual_seed
        return lambda: default_collate([(seed_torch(s), seed_others(s), dataset[index])[2] for index, s in keys])

    baseline = "plain fetch (torch's generator seeded per sample)"
    variants = {
        baseline: fetch_seeding(lambda seed: None),
        "plain fetch, Python's random seeded per sample too": fetch_seeding(random.seed),
        "plain fetch, NumPy's seeded per sample too": fetch_seeding(lambda seed: np.random.seed(seed & 0xFFFFFFFF)),
        "the library's fetch in a worker": lambda: default_collate(seeded.watched.fetch(keys, seeded._fetch_one)),
        "the library's fetch with 0 workers (the generators put back)": lambda: default_collate(seeded.fetch(keys)),
    }
    best = dict.fromkeys([*variants, "step"], float("inf"))
    for _ in range(rounds):
        for name, run in [*variants.items(), ("step", step)]:
            best[name] = min(best[name], timeit.timeit(run, number=5) / 5 * 1e6)
    plain, trained = best[baseline], best["step"]
    print(f"\nPer batch of {BATCH}, in-process (best of {rounds} interleaved repeats):")
    print("| what | time | added to a step (fetch + step) |")
    print("|---|---|---|")
    print(f"| the step (forward, backward, SGD) | {trained:.0f} µs | |")
    for name in variants:
        added = "" if name == baseline else f"{(best[name] - plain) / (plain + trained):+.1%}"
        print(f"| {name} | {best[name]:.0f} µs | {added} |")


def hook_cost(steps: int = 400) -> None:
    """The callback's per-batch hooks, timed inside a 0-worker fit (each call's time; medians): what the
    library adds to every step outside the fetch, measured where a fit's noise hardly reaches."""
    spent: dict[str, list[float]] = {}
    for name in ("on_train_batch_start", "on_train_batch_end"):
        hook = getattr(ResumableDataCallback, name)

        def timed(self: Any, *args: Any, _hook: Any = hook, _name: str = name) -> None:
            start = time.perf_counter()
            _hook(self, *args)
            spent.setdefault(_name, []).append(time.perf_counter() - start)

        setattr(ResumableDataCallback, name, timed)
    quiet = os.open(os.devnull, os.O_WRONLY)
    shown = os.dup(1)
    os.dup2(quiet, 1)
    try:
        fit(0, True, 30)
        spent.clear()
        fit(0, True, steps)
    finally:
        os.dup2(shown, 1)
    print(f"\nThe callback's hooks per batch, 0 workers, {steps} steps (median of each call):")
    print("| hook | time |")
    print("|---|---|")
    for name, times in spent.items():
        print(f"| {name} | {statistics.median(times) * 1e6:.0f} µs |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cost"]:
        cost_per_batch()
        hook_cost()
    else:
        main()
        cost_per_batch()
        hook_cost()

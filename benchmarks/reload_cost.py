"""What ``reload_dataloaders_every_n_epochs=1`` costs with the two lines, against plain Lightning.

``python benchmarks/reload_cost.py [ROUNDS]`` fits 4 epochs of a small map-style loader (2,048 samples,
batch 32, 1 process) with and without the library, with and without a reload every epoch, with 0 and 2
workers, each fit in a fresh process, the configurations alternating within each round. Prints the
median fit time of each, the ratio of the library's to plain Lightning's in the same run, and what a
reload adds per epoch to each.

Every rebuild of the train loader used to retire the last loader's iterator only when the garbage
collector reached it, right after the new loader had forked its workers; its workers then took the
join's full timeout (5 s each) to end: 11.4 s against plain Lightning's 1.5 s for 4 epochs with 2 workers.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

FIT = r"""
import sys, time
import lightning as L, torch
from torch.utils.data import DataLoader, Dataset
from lightning_resumable import ResumableDataCallback, ResumableDataModule

class Samples(Dataset):
    def __len__(self): return 2048
    def __getitem__(self, index): return torch.full((4,), float(index))

class Model(L.LightningModule):
    def __init__(self): super().__init__(); self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx): return self.layer(batch).sum()
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)

workers, reload, library = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "library"

class Plain(L.LightningDataModule):
    def train_dataloader(self): return DataLoader(Samples(), batch_size=32, num_workers=workers, shuffle=True)

class Resumable(ResumableDataModule, Plain):
    def train_dataloader(self): return super().train_dataloader()

trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=4, logger=False, enable_progress_bar=False,
    enable_checkpointing=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=reload,
    callbacks=[ResumableDataCallback()] if library else [])
start = time.perf_counter()
trainer.fit(Model(), Resumable() if library else Plain())
print(time.perf_counter() - start)
"""


def fit_seconds(workers: int, reload: int, who: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", FIT, str(workers), str(reload), who], capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def main(rounds: int) -> None:
    configurations = [(workers, reload) for workers in (0, 2) for reload in (0, 1)]
    times: dict[tuple[int, int, str], list[float]] = {}
    started = time.perf_counter()
    for _ in range(rounds):
        for workers, reload in configurations:
            for who in ("plain", "library"):
                times.setdefault((workers, reload, who), []).append(fit_seconds(workers, reload, who))
    print(f"4 epochs, 1 process, median of {rounds} fits each ({time.perf_counter() - started:.0f} s in all)\n")
    print("| num_workers | reload every epoch | plain Lightning | with the library | ratio |")
    print("|---|---|---|---|---|")
    median = {key: statistics.median(values) for key, values in times.items()}
    for workers, reload in configurations:
        plain, library = median[workers, reload, "plain"], median[workers, reload, "library"]
        print(f"| {workers} | {'yes' if reload else 'no'} | {plain:.2f} s | {library:.2f} s | {library / plain:.2f}x |")
    print("\nWhat a reload adds per epoch (4 epochs, 3 reloads):")
    for workers in (0, 2):
        added = {who: (median[workers, 1, who] - median[workers, 0, who]) / 3 for who in ("plain", "library")}
        print(
            f"- {workers} workers: plain Lightning {added['plain']:+.3f} s, with the library {added['library']:+.3f} s"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)

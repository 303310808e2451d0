"""Lightning steps per second with the two lines against plain Lightning, in the same run.

``python benchmarks/step_overhead.py [ROUNDS] [STEPS]`` fits a small conv net with dropout (1 process,
batch 32) on 3x40x40 images that ``__getitem__`` crops at random to 32x32 and flips (torch's global
generator), with 0 and 2 workers, plain and with the library, each fit in a fresh process. Within a
round the four configurations run in an order that alternates from round to round. Prints, per worker
count, the median steps/s of each and the median of the per-round ratios with their spread (lowest and
highest): a gap is real only where it is larger than that spread.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

FIT = r"""
import sys, time
import lightning as L, torch
from torch.utils.data import DataLoader, Dataset
from lightning_resumable import ResumableDataCallback, ResumableDataModule

workers, library, steps = int(sys.argv[1]), sys.argv[2] == "library", int(sys.argv[3])

class Images(Dataset):
    def __init__(self): self.images = torch.rand(1024, 3, 40, 40)
    def __len__(self): return len(self.images)
    def __getitem__(self, index):
        top, left = torch.randint(0, 9, (2,)).tolist()
        image = self.images[index, :, top:top + 32, left:left + 32]
        return (image.flip(-1) if torch.rand(()) < 0.5 else image), index % 10

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(), torch.nn.Dropout(0.2), torch.nn.Linear(512, 10))
    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)

class Plain(L.LightningDataModule):
    def train_dataloader(self): return DataLoader(Images(), batch_size=32, num_workers=workers, shuffle=True)

class Resumable(ResumableDataModule, Plain): pass

class Clock(L.Callback):  # from the 10th step on: the workers' start and the first steps are not timed
    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == 10: self.start = time.perf_counter()

clock = Clock()
callbacks = [clock] + ([ResumableDataCallback()] if library else [])
L.seed_everything(0, verbose=False)
trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
trainer.fit(Net(), datamodule=Resumable() if library else Plain())
print((steps - 10) / (time.perf_counter() - clock.start))
"""


def steps_per_second(workers: int, variant: str, steps: int) -> float:
    command = [sys.executable, "-c", FIT, str(workers), variant, str(steps)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


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
    print("| num_workers | plain Lightning | with the library | ratio (median of rounds) | lowest, highest |")
    print("|---|---|---|---|---|")
    for workers in (0, 2):
        plain, ours = rates[workers, "plain"], rates[workers, "library"]
        ratios = sorted(mine / theirs for mine, theirs in zip(ours, plain, strict=True))
        print(
            f"| {workers} | {statistics.median(plain):.1f} | {statistics.median(ours):.1f} |"
            f" {statistics.median(ratios):.3f}x | {ratios[0]:.3f}x, {ratios[-1]:.3f}x |"
        )


if __name__ == "__main__":
    main()

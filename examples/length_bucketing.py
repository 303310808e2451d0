"""A length-bucketing batch sampler, made exactly resumable by subclassing ``ResumableBatchSampler``.

Run: ``python examples/length_bucketing.py``. Sequences of different lengths are batched with
others of similar length under a budget of padded tokens, so batches have different sizes, and the
number of batches changes from epoch to epoch. The script trains straight through, then again with a
stop mid-epoch and a resume from that checkpoint, and checks that the resumed run trained the very
same batches (ids and losses) as the uninterrupted one.

Under DDP the library splits each epoch's batches across ranks (rank r takes batches r, r + W, ...),
so every rank runs the same number of steps, and a checkpoint resumes on any number of processes.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import ResumableBatchSampler, ResumableDataCallback, ResumableDataModule

MAX_TOKENS = 64
"""The budget of a batch: its size times its longest sequence."""


class LengthBucketing(ResumableBatchSampler):
    """Shuffle, cut into pools of ``pool`` samples, sort each pool by length, and fill batches up to
    ``max_tokens`` padded tokens; then shuffle the batches. A pure function of (epoch, generator)."""

    def __init__(self, lengths: Sequence[int], max_tokens: int, pool: int = 32, drop_last: bool = False) -> None:
        super().__init__()
        self.lengths, self.max_tokens, self.pool, self.drop_last = list(lengths), max_tokens, pool, drop_last

    def epoch_batches(self, epoch: int, generator: torch.Generator) -> list[list[int]]:
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        batches: list[list[int]] = []
        for start in range(0, len(order), self.pool):
            batch: list[int] = []
            for index in sorted(order[start : start + self.pool], key=self.lengths.__getitem__):
                if batch and (len(batch) + 1) * self.lengths[index] > self.max_tokens:
                    batches.append(batch)
                    batch = []
                batch.append(index)
            batches.append(batch)
        shuffled = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[position] for position in shuffled]


class Sequences(Dataset[tuple[int, torch.Tensor]]):
    """Sequence ``i`` has its own length (1 to 16) and its id in every token."""

    def __init__(self, size: int = 200) -> None:
        self.lengths = [1 + (index * 7919) % 16 for index in range(size)]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        return index, torch.full((self.lengths[index],), float(index % 10)) + 0.1 * torch.rand(self.lengths[index])


def pad(samples: list[tuple[int, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([index for index, _ in samples])
    return ids, torch.nn.utils.rnn.pad_sequence([sequence for _, sequence in samples], batch_first=True)


class Data(ResumableDataModule, L.LightningDataModule):
    def train_dataloader(self) -> DataLoader[Any]:
        dataset = Sequences()
        return DataLoader(dataset, batch_sampler=LengthBucketing(dataset.lengths, MAX_TOKENS), collate_fn=pad)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.steps: list[tuple[int, list[int], float]] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[1].unsqueeze(-1)).pow(2).mean()
        self.steps.append((self.current_epoch, batch[0].tolist(), loss.item()))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StopAfter(L.Callback):
    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def fit(callbacks: list[L.Callback], ckpt_path: Path | None = None) -> Model:
    L.seed_everything(3, verbose=False)  # before the model: its initial weights are drawn too
    model = Model()
    trainer = L.Trainer(
        max_epochs=3,
        callbacks=[ResumableDataCallback(), *callbacks],
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, Data(), ckpt_path=ckpt_path)
    if torch.distributed.is_initialized():  # a clean shutdown: at the interpreter's exit, gloo's threads can abort
        torch.distributed.destroy_process_group()
    return model


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "mid-epoch.ckpt"
        full = fit([])
        stopped = fit([StopAfter(step=len(full.steps) // 2, path=checkpoint)])
        resumed = fit([], ckpt_path=checkpoint)
    sizes = {epoch: sorted({len(ids) for e, ids, _ in full.steps if e == epoch}) for epoch in range(3)}
    counts = {epoch: sum(e == epoch for e, _, _ in full.steps) for epoch in range(3)}
    print(f"batches per epoch: {counts}; batch sizes seen: {sizes}")
    print(f"stopped after step {len(stopped.steps)} (epoch {stopped.steps[-1][0]}); resumed {len(resumed.steps)} steps")
    exact = stopped.steps + resumed.steps == full.steps
    print("VERDICT:", "EXACT - the resumed run trained the very batches and losses" if exact else "MISMATCH")
    if not exact:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""Recover from a loss spike: find it, list its samples, roll back, skip their steps, and check the result.

Run: ``python examples/loss_spike.py`` (about a minute). A one-layer GPT-style model trains on a mixture of two
token sources, "web" and "code", read in order (``Mixture(..., shuffle=False)``), 2 processes (DDP) with 2 loader
workers each. Blocks 150 to 189 of "code" are corrupt (random tokens), so the loss jumps when the run reaches
them. The script then does what a user of a long run does:

1. trains the spiking run, with a checkpoint every 5 steps;
2. detects the spike with a simple rule (a rank's loss above 1.5 times the median of the 10 steps before);
3. lists the samples of the steps around it from the checkpoint before, without a Trainer
   (``lightning_resumable.tools.step_batches``, the ``batches`` command's function): the steps that read
   corrupt blocks are the ones to skip;
4. rolls back to the last checkpoint before them and resumes with ``ResumableDataCallback(skip_steps=...)``;
   the recovered run is killed with SIGKILL (its whole process group, workers included) after a checkpoint at
   step 50 and resumed from it, its config unchanged (the skip is in the checkpoint);
5. trains a reference run given the same skip from the start, and compares step by step, on every rank, the
   blocks each step read and its loss, bit for bit.

It prints the spike, the skipped steps and their corrupt blocks, and one verdict line (``EXACT``, or
``DIFFERENT`` and exit status 1).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import Mixture, ResumableDataCallback, ResumableDataModule
from lightning_resumable.tools.step_batches import step_batches

SOURCES = {"web": (0, 300), "code": (100_000, 300)}  # name: (first block id, blocks)
CORRUPT = range(100_150, 100_190)  # block ids of "code" whose tokens are noise
BLOCK, VOCAB, BATCH_SIZE, STEPS, SEED, EVERY, KILL_AT = 32, 97, 4, 60, 7, 5, 50


class Blocks(Dataset[torch.Tensor]):
    """A source's token blocks: the first token is the block's id (the sample id the records keep), then text-like
    tokens (counting modulo 8, which the model learns within a few steps), or noise in a corrupt block."""

    def __init__(self, first: int, blocks: int) -> None:
        self.first, self.blocks = first, blocks

    def __len__(self) -> int:
        return self.blocks

    def __getitem__(self, index: int) -> torch.Tensor:
        block_id = self.first + index
        if block_id in CORRUPT:
            tokens = torch.randint(VOCAB, (BLOCK - 1,), generator=torch.Generator().manual_seed(block_id))
        else:
            tokens = (torch.arange(1, BLOCK) + block_id) % 8  # counting on: each token the one before, plus 1
        return torch.cat([torch.tensor([block_id]), tokens])


def mixture() -> Mixture:
    sources = {name: Blocks(first, blocks) for name, (first, blocks) in SOURCES.items()}
    return Mixture(sources, {"web": 0.5, "code": 0.5}, shuffle=False)


class TokenData(ResumableDataModule, L.LightningDataModule):
    def train_dataloader(self) -> Any:
        return DataLoader(mixture(), batch_size=BATCH_SIZE, num_workers=2)


class TinyGPT(L.LightningModule):
    def __init__(self, record_path: str, kill_at: Path | None = None) -> None:
        super().__init__()
        self.kill_at = kill_at  # save there after step KILL_AT, then wait for the driver's SIGKILL
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.position = torch.nn.Parameter(torch.randn(BLOCK - 1, 32) * 0.02)
        self.block = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        self.head = torch.nn.Linear(32, VOCAB)
        self.record_path = record_path

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        tokens = batch.long() % VOCAB  # the first token is the block's id: taken modulo the vocabulary
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(inputs.shape[1])
        hidden = self.block(self.embed(inputs) + self.position, src_mask=mask, is_causal=True)
        return torch.nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), targets.flatten())

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        record = {"step": self.global_step - 1, "ids": batch[:, 0].tolist(), "loss": outputs["loss"].item()}
        with open(f"{self.record_path}.rank{self.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")
        if self.kill_at is not None and self.global_step == KILL_AT:
            self.trainer.save_checkpoint(self.kill_at)  # every rank takes part; rank 0 writes it
            Path(f"{self.kill_at}.rank{self.global_rank}.saved").touch()
            while True:  # the driver kills the whole process group with SIGKILL, as a lost node ends a job
                time.sleep(1)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def train(work: Path, phase: str, skip: str | None, checkpoint: str | None, kill_at: Path | None) -> None:
    """One run, on 2 processes (Lightning starts the second by running this command again)."""
    warnings.filterwarnings("ignore")
    L.seed_everything(SEED, verbose=False)
    saves = ModelCheckpoint(dirpath=work / "checkpoints", filename="{step}", every_n_train_steps=EVERY, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        deterministic=True,
        callbacks=[ResumableDataCallback(skip_steps=skip), *([saves] if phase == "spiking" else [])],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=work,
    )
    trainer.fit(TinyGPT(str(work / phase), kill_at), TokenData(), ckpt_path=checkpoint)


def run(
    work: Path, phase: str, skip: str | None = None, checkpoint: Path | None = None, kill_at: Path | None = None
) -> list[list[dict[str, Any]]]:
    """Run a phase in a process group of its own; with ``kill_at``, SIGKILL the group once both ranks saved there."""
    command = [sys.executable, __file__, "--phase", phase, "--work", str(work)]
    command += ["--skip", skip] if skip else []
    command += ["--checkpoint", str(checkpoint)] if checkpoint else []
    command += ["--kill-at", str(kill_at)] if kill_at else []
    with (work / f"{phase}.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        if kill_at is not None:
            saved = [Path(f"{kill_at}.rank{rank}.saved") for rank in (0, 1)]
            while not all(path.exists() for path in saved) and process.poll() is None:
                time.sleep(0.1)
            os.killpg(process.pid, signal.SIGKILL)  # the launcher, both ranks and their loader workers
            process.wait()
        elif process.wait(timeout=600):
            sys.exit(f"the {phase} run failed; see {work / phase}.log")
    return [
        [json.loads(line) for line in (work / f"{phase}.rank{rank}.jsonl").read_text().splitlines()] for rank in (0, 1)
    ]


def spike_step(ranks: list[list[dict[str, Any]]]) -> int:
    """The first step whose loss, on some rank, is above 1.5 times the median of that rank's 10 steps before."""
    for step in range(15, STEPS):
        for steps in ranks:
            before = [entry["loss"] for entry in steps[step - 10 : step]]
            if steps[step]["loss"] > 1.5 * statistics.median(before):
                return step
    raise SystemExit("no spike found")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--skip")
    parser.add_argument("--checkpoint")
    parser.add_argument("--kill-at", type=Path)
    arguments = parser.parse_args()
    if arguments.phase:
        train(arguments.work, arguments.phase, arguments.skip, arguments.checkpoint, arguments.kill_at)
        return
    with tempfile.TemporaryDirectory(prefix="loss-spike-") as directory:
        work = Path(directory)
        spiking = run(work, "spiking")
        spike = spike_step(spiking)
        losses = [round(steps[spike]["loss"], 2) for steps in spiking]
        print(
            f"spike at step {spike}: losses {losses} on the 2 ranks, {spiking[0][spike - 1]['loss']:.2f} a step before"
        )
        saved = {int(path.stem.split("=")[1]): path for path in (work / "checkpoints").glob("step=*.ckpt")}
        before = max(step for step in saved if step <= spike - EVERY)
        listed = step_batches(saved[before], f"{spike - 10}-{min(spike + 15, STEPS - 1)}", mixture=mixture())
        offsets = dict(zip(SOURCES, [first for first, _ in SOURCES.values()], strict=True))
        corrupt: dict[int, list[int]] = {}  # step: the corrupt blocks its batches hold, on every rank
        for entry in listed:
            blocks = [offsets[name] + index for name, index in entry.samples]
            corrupt.setdefault(entry.step, []).extend(block for block in blocks if block in CORRUPT)
        steps = sorted(step for step, blocks in corrupt.items() if blocks)
        first, last = steps[0], steps[-1]
        checkpoint_step = max(step for step in saved if step <= first)
        print(
            f"steps {first}-{last} read the {sum(len(b) for b in corrupt.values())} corrupt blocks of the window"
            f" (by `batches` from step={before}.ckpt); rolling back to step={checkpoint_step}.ckpt and skipping them"
        )
        skip = f"{first}-{last}"
        killed = run(work, "recovered", skip, saved[checkpoint_step], kill_at=work / "killed.ckpt")
        print(f"the recovered run was killed (SIGKILL to its process group) after a checkpoint at step {KILL_AT}")
        recovered = [steps[: KILL_AT - checkpoint_step] for steps in killed]  # what its checkpoint holds
        resumed = run(work, "resumed", skip, work / "killed.ckpt")  # the same config: the skip is the checkpoint's
        recovered = [before + after for before, after in zip(recovered, resumed, strict=True)]
        reference = run(work, "reference", skip)
        exact = True
        for rank in (0, 1):
            history = [entry for entry in spiking[rank] if entry["step"] < checkpoint_step] + recovered[rank]
            same_ids = sum(a["ids"] == b["ids"] for a, b in zip(history, reference[rank], strict=False))
            same_loss = sum(a["loss"] == b["loss"] for a, b in zip(history, reference[rank], strict=False))
            trained_corrupt = sum(block in CORRUPT for entry in recovered[rank] for block in entry["ids"])
            exact &= len(history) == len(reference[rank]) == same_ids == same_loss and trained_corrupt == 0
            print(
                f"rank {rank}: {len(reference[rank])} steps; the rolled-back run equals the reference in ids at"
                f" {same_ids}, loss bits at {same_loss}; corrupt blocks trained after the rollback: {trained_corrupt}"
            )
    print("EXACT: the recovered run equals the run given the skip from the start" if exact else "DIFFERENT")
    sys.exit(0 if exact else 1)


if __name__ == "__main__":
    main()

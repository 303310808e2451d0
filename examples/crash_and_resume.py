"""Crash a 2-process DDP run mid-epoch with SIGKILL, resume it, and verify every rank's stream.

Run: ``python examples/crash_and_resume.py`` (add ``--skip-plain`` to skip the plain-Lightning
comparison). It trains a tiny model with dropout on a synthetic dataset whose samples carry their
ids and a random augmentation (drawn from torch, ``random`` and NumPy, as augmentation libraries
do), three times per setup: straight through; killed with SIGKILL from outside while training (a
checkpoint is written every 5 steps); resumed from the newest complete checkpoint. It then prints,
per rank, how many resumed steps got the same sample ids, the same augmentation values and the same
loss (bit for bit) as the uninterrupted run, and one verdict line.

The same is done for plain Lightning (``DataLoader(shuffle=True)``, no library) to show the bug.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import ResumableDataCallback, ResumableDataModule

WORLD_SIZE = 2
DATASET_SIZE = 64
BATCH_SIZE = 4
EPOCHS = 3
CHECKPOINT_EVERY = 5
KILL_AT_STEP = 12  # rank 0 has finished 12 steps: epoch 1, batch 3 (8 steps per epoch)
STEP_SECONDS = 0.05  # a slow step, so the kill lands where we aim it


# ---------------------------------------------------------------------------------- training side
class AugmentedDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample ``index``: its id, and its features under a random augmentation (scale, noise, flip)."""

    def __len__(self) -> int:
        return DATASET_SIZE

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.randn(8, generator=torch.Generator().manual_seed(index))
        features = features * (0.5 + torch.rand(()))  # torch's global generator
        features = features + float(np.random.normal(scale=0.1))  # NumPy's global RandomState
        if random.random() < 0.5:  # Python's random
            features = features.flip(0)
        return torch.tensor(index), features


class PlainData(L.LightningDataModule):
    def train_dataloader(self) -> DataLoader[Any]:
        dataset = AugmentedDataset()
        return DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, num_workers=2, persistent_workers=True)


class ResumableData(ResumableDataModule, PlainData):  # the user's one-line change
    def train_dataloader(self) -> DataLoader[Any]:
        return super().train_dataloader()


class Model(L.LightningModule):
    def __init__(self, record_path: str) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.record_path = record_path

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(STEP_SECONDS)
        return self.net(batch[1]).pow(2).mean()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # repr-exact floats: equal records mean bit-identical augmentations and losses
        record = {
            "epoch": self.current_epoch,
            "batch": batch_idx,
            "ids": batch[0].tolist(),
            "aug": batch[1].tolist(),
            "loss": outputs["loss"].item(),
        }
        with open(f"{self.record_path}.rank{self.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def train(record_path: str, checkpoint_dir: str, resumable: bool, ckpt_path: str | None) -> None:
    warnings.filterwarnings("ignore")
    L.seed_everything(7, verbose=False)
    torch.set_num_threads(1)
    callbacks: list[L.Callback] = [
        ModelCheckpoint(dirpath=checkpoint_dir, filename="{step}", every_n_train_steps=CHECKPOINT_EVERY, save_top_k=-1)
    ]
    if resumable:
        callbacks.append(ResumableDataCallback())  # the user's other one-line change
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy="ddp",
        max_epochs=EPOCHS,
        deterministic=True,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = ResumableData() if resumable else PlainData()
    trainer.fit(Model(record_path), datamodule=data, ckpt_path=ckpt_path)
    if torch.distributed.is_initialized():  # a clean shutdown: at the interpreter's exit, gloo's threads can abort
        torch.distributed.destroy_process_group()


# ------------------------------------------------------------------------------------ driver side
def read_records(record_path: Path) -> dict[int, list[dict[str, Any]]]:
    records = {}
    for rank in range(WORLD_SIZE):
        path = Path(f"{record_path}.rank{rank}.jsonl")
        records[rank] = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return records


def launch(work: Path, phase: str, resumable: bool, ckpt_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Start one training run; it records to ``work/PHASE.rankR.jsonl`` and checkpoints to ``work/PHASE-ckpt``."""
    checkpoints = str(work / f"{phase}-ckpt")
    command = [sys.executable, __file__, "train", "--record", str(work / phase), "--checkpoints", checkpoints]
    if resumable:
        command.append("--resumable")
    if ckpt_path is not None:
        command += ["--ckpt-path", str(ckpt_path)]
    log = (work / f"{phase}.log").open("wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def finish(process: subprocess.Popen[bytes], work: Path, phase: str) -> None:
    if process.wait(timeout=600) != 0:
        sys.exit(f"the {phase} run failed; see {work / (phase + '.log')}")


def newest_complete_checkpoint(checkpoint_dir: Path) -> tuple[Path, int]:
    """The newest checkpoint that loads: a kill can land in the middle of writing one."""
    candidates = sorted(checkpoint_dir.glob("step=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]), reverse=True)
    for path in candidates:
        try:
            return path, int(torch.load(path, weights_only=True, map_location="cpu")["global_step"])
        except Exception:  # a torn file from the kill
            continue
    sys.exit(f"no complete checkpoint in {checkpoint_dir}")


def run_setup(resumable: bool) -> tuple[list[str], bool]:
    """Straight through, killed, resumed; return the table rows and whether every rank was exact."""
    with tempfile.TemporaryDirectory(prefix="crash_and_resume_") as tmp:
        work = Path(tmp)
        finish(launch(work, "full", resumable), work, "full")
        full = read_records(work / "full")

        crashed = launch(work, "crashed", resumable)
        deadline = time.monotonic() + 600
        while len(read_records(work / "crashed")[0]) < KILL_AT_STEP:
            if crashed.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the run ended before the kill; see {work / 'crashed.log'}")
            time.sleep(0.01)
        os.killpg(crashed.pid, signal.SIGKILL)  # a real crash: no exception, no cleanup
        crashed.wait()
        checkpoint, steps_done = newest_complete_checkpoint(work / "crashed-ckpt")
        before = {rank: records[:steps_done] for rank, records in read_records(work / "crashed").items()}

        finish(launch(work, "resumed", resumable, checkpoint), work, "resumed")
        resumed = read_records(work / "resumed")

    rows, exact = [], True
    for rank in range(WORLD_SIZE):
        expected = full[rank][steps_done:]
        got = resumed[rank]
        pairs = list(zip(expected, got, strict=False))
        same = {name: sum(want[name] == have[name] for want, have in pairs) for name in ("ids", "aug", "loss")}
        first_bad = next((i for i, (w, h) in enumerate(pairs) if w != h), None)
        rank_exact = before[rank] == full[rank][:steps_done] and got == expected
        exact &= rank_exact
        where = (
            "-" if first_bad is None else f"epoch {expected[first_bad]['epoch']} batch {expected[first_bad]['batch']}"
        )
        counts = "  ".join(f"{same[name]:>5}/{len(expected):<5}" for name in same)
        verdict = "exact" if rank_exact else "WRONG"
        rows.append(f"  {rank:>4}  {steps_done:>12}  {len(got):>13}  {counts}  {where:<19}  {verdict}")
    killed_at = f"killed after step {KILL_AT_STEP}, resumed from the checkpoint at step {steps_done}"
    return [killed_at, *rows], exact


def print_table(title: str, rows: list[str]) -> None:
    print(f"\n{title}: {rows[0]}")
    print("  rank  steps before  steps resumed  same ids     same aug     same loss    first wrong step     verdict")
    for row in rows[1:]:
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="demo", choices=["demo", "train"])
    parser.add_argument("--record")
    parser.add_argument("--checkpoints")
    parser.add_argument("--resumable", action="store_true")
    parser.add_argument("--ckpt-path")
    parser.add_argument("--skip-plain", action="store_true", help="skip the plain-Lightning comparison")
    args = parser.parse_args()
    if args.mode == "train":
        train(args.record, args.checkpoints, args.resumable, args.ckpt_path)
        return

    print(f"{WORLD_SIZE} DDP processes (gloo, CPU), {DATASET_SIZE} samples, batch {BATCH_SIZE}, {EPOCHS} epochs,")
    print("shuffle=True, num_workers=2, persistent_workers=True, random augmentation, dropout, deterministic=True;")
    print("SIGKILL mid-epoch, resume from the checkpoint; 'same' counts resumed steps equal to the uninterrupted run.")
    rows, exact = run_setup(resumable=True)
    print_table("with lightning-resumable", rows)
    if not args.skip_plain:
        plain_rows, plain_exact = run_setup(resumable=False)
        print_table("plain Lightning (for comparison)", plain_rows)
        print(f"  plain Lightning resumed {'exactly' if plain_exact else 'WRONG data, silently'}")
    print()
    if exact:
        print(
            "VERDICT: EXACT - after the crash every rank got the very batches of the uninterrupted run, with the"
            " same augmentations and bit-identical losses."
        )
    else:
        print("VERDICT: MISMATCH - the resumed stream differs from the uninterrupted run.")
        sys.exit(1)


if __name__ == "__main__":
    main()

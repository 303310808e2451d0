"""MosaicML Streaming's StreamingDataLoader under DDP with workers, stopped mid-epoch and resumed exactly.

Run: ``python examples/mosaic_stream.py`` (about a minute; needs ``streaming``:
``pip install lightning-resumable[mosaic]``; in a CPU environment without torchvision, as CI's:
``PYTHONPATH=tests/mosaic_site python examples/mosaic_stream.py``). It writes 96 samples as MDS
shards with ``MDSWriter``, then reads them shuffled through Mosaic's ``StreamingDataLoader`` with 2
workers on 2 DDP processes; each sample is augmented at random in the dataset's ``__getitem__``, as
Mosaic's docs do it. The DataModule's ``setup()`` gives Mosaic the trainer's world
(``set_mosaic_environment``): Lightning's launcher does not set ``RANK`` nor ``LOCAL_WORLD_SIZE``.

Each setup trains three times: straight through; stopped right after a mid-epoch checkpoint (the
process ends at once, like a kill); resumed from it. Per rank, it prints how many resumed steps got
the same sample ids, augmentations and losses as the uninterrupted run. Plain Lightning (no library)
is run for comparison: Mosaic resumes its sample position, but not the augmentations.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import streaming
import torch
from streaming.base.util import clean_stale_shared_memory

from lightning_resumable import ResumableDataCallback, ResumableDataModule, set_mosaic_environment

WORLD_SIZE, STREAM_SIZE, BATCH_SIZE, EPOCHS = 2, 96, 4, 3
STOP_AT = (1, 4)  # epoch, batch: save after this batch, then end the process


class Augmented(streaming.StreamingDataset):  # type: ignore[misc]  # streaming is untyped
    """The shards, each sample augmented at random as it is read."""

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        sample_id = int(super().__getitem__(index)["id"])
        features = torch.full((8,), float(sample_id % 5)) * (0.5 + torch.rand(()))  # a random augmentation
        if random.random() < 0.5:
            features = -features
        return torch.tensor(sample_id), features


class PlainData(L.LightningDataModule):
    def __init__(self, shards: str) -> None:
        super().__init__()
        self.shards = shards

    def setup(self, stage: str) -> None:
        set_mosaic_environment(self.trainer)  # the world Mosaic reads from the environment: the trainer's
        clean_stale_shared_memory()  # Mosaic's own remedy for what a killed run left in shared memory

    def train_dataloader(self) -> streaming.StreamingDataLoader:
        dataset = Augmented(local=self.shards, shuffle=True, shuffle_seed=11, batch_size=BATCH_SIZE)
        return streaming.StreamingDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=2)


class ResumableData(ResumableDataModule, PlainData):  # the user's one-line change
    def train_dataloader(self) -> streaming.StreamingDataLoader:
        return super().train_dataloader()


class Model(L.LightningModule):
    def __init__(self, record: str, stop: str | None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.record, self.stop = record, stop

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[1]).pow(2).mean()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = {"epoch": self.current_epoch, "batch": batch_idx, "ids": batch[0].tolist()}
        step |= {"aug": batch[1][:, 0].tolist(), "loss": outputs["loss"].item()}  # repr-exact floats
        with open(f"{self.record}.rank{self.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(step) + "\n")
        if self.stop and (self.current_epoch, batch_idx) == STOP_AT:
            self.trainer.save_checkpoint(self.stop)
            os._exit(0)  # no cleanup, like a kill

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def train(record: str, shards: str, resumable: bool, stop: str | None, ckpt_path: str | None) -> None:
    warnings.filterwarnings("ignore")
    L.seed_everything(7, verbose=False)
    torch.set_num_threads(1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy="ddp",
        max_epochs=EPOCHS,
        deterministic=True,
        callbacks=[ResumableDataCallback()] if resumable else [],  # the other one-line change
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = ResumableData(shards) if resumable else PlainData(shards)
    trainer.fit(Model(record, stop), datamodule=data, ckpt_path=ckpt_path)
    if torch.distributed.is_initialized():  # a clean shutdown: at the interpreter's exit, gloo's threads can abort
        torch.distributed.destroy_process_group()


def run(work: Path, phase: str, resumable: bool, *options: str) -> dict[int, list[dict[str, Any]]]:
    command = [sys.executable, __file__, "train", "--record", str(work / phase), "--shards", str(work / "shards")]
    command += list(options)
    with (work / f"{phase}.log").open("wb") as log:
        if subprocess.run(command + (["--resumable"] if resumable else []), stdout=log, stderr=log).returncode:
            sys.exit(f"the {phase} run failed; see {work / phase}.log")
    return {
        rank: [json.loads(line) for line in Path(f"{work / phase}.rank{rank}.jsonl").read_text().splitlines()]
        for rank in range(WORLD_SIZE)
    }


def compare(resumable: bool) -> bool:
    with tempfile.TemporaryDirectory(prefix="mosaic_stream_") as tmp:
        work, checkpoint = Path(tmp), str(Path(tmp) / "mid-epoch.ckpt")
        with streaming.MDSWriter(out=str(work / "shards"), columns={"id": "int"}, size_limit=6 * 20) as writer:
            for sample_id in range(STREAM_SIZE):
                writer.write({"id": sample_id})
        full = run(work, "full", resumable)
        stopped = run(work, "stopped", resumable, "--stop", checkpoint)
        resumed = run(work, "resumed", resumable, "--ckpt-path", checkpoint)
    title = "with lightning-resumable" if resumable else "plain Lightning (for comparison)"
    print(f"\n{title}: stopped after epoch {STOP_AT[0]} batch {STOP_AT[1]}")
    print("  rank  steps expected  steps resumed  same ids  same aug  same loss  verdict")
    exact = True
    for rank in range(WORLD_SIZE):
        expected, got = full[rank][len(stopped[rank]) :], resumed[rank]
        same = [sum(w[name] == g[name] for w, g in zip(expected, got, strict=False)) for name in ("ids", "aug", "loss")]
        rank_exact = stopped[rank] + got == full[rank]
        exact &= rank_exact
        counts = "  ".join(f"{count:>5}/{len(expected):<2}" for count in same)
        print(f"  {rank:>4}  {len(expected):>14}  {len(got):>13}  {counts}  {'exact' if rank_exact else 'WRONG'}")
    return exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="demo", choices=["demo", "train"])
    parser.add_argument("--record")
    parser.add_argument("--shards")
    parser.add_argument("--resumable", action="store_true")
    parser.add_argument("--stop")
    parser.add_argument("--ckpt-path")
    args = parser.parse_args()
    if args.mode == "train":
        train(args.record, args.shards, args.resumable, args.stop, args.ckpt_path)
        return
    print(f"{WORLD_SIZE} DDP processes (gloo, CPU), MDS shards of {STREAM_SIZE} samples, shuffled, read by")
    print("Mosaic's StreamingDataLoader(num_workers=2), batch 4, 3 epochs, random augmentation, dropout.")
    exact = compare(resumable=True)
    compare(resumable=False)
    print()
    if not exact:
        print("VERDICT: MISMATCH - the resumed stream differs from the uninterrupted run.")
        sys.exit(1)
    print(
        "VERDICT: EXACT - every rank resumed Mosaic's stream at the batch after the checkpoint, with the same content."
    )


if __name__ == "__main__":
    main()

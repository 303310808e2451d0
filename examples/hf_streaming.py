"""A Hugging Face stream shuffled through a buffer, killed mid-epoch under DDP and resumed exactly.

Run: ``python examples/hf_streaming.py`` (about a minute). The data is what Hugging Face's streaming docs
start from: parquet files (written here, 8 of them), ``load_dataset("parquet", ..., streaming=True)``,
``.shuffle(seed=42, buffer_size=16)``, an augmenting ``.map`` and ``split_dataset_by_node``, read by a
``DataLoader`` with 2 workers on 2 DDP processes (gloo, CPU) for 3 epochs.

It trains three times: straight through; until a checkpoint in the second epoch, where the whole process
group is killed with SIGKILL (the run waits for it after the save); resumed from that checkpoint. Per rank
it prints how many resumed steps read the same sample ids, augmentations and losses as the uninterrupted
run, and EXACT if all did. ``datasets`` itself does not save its shuffle buffer (a resume loses about
``buffer_size`` samples and reads others); the library replaces the buffer with windows of its size that
resume from a few integers (docs/streams-and-loaders.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from lightning_resumable import ResumableDataCallback, ResumableDataModule

WORLD_SIZE, FILES, ROWS, BATCH_SIZE, EPOCHS, BUFFER = 2, 8, 24, 4, 3, 16
STOP_AT = (1, 5)  # epoch, batch: save after this batch, then wait to be killed


def write_parquet(directory: Path) -> list[str]:
    """``FILES`` parquet files of ``ROWS`` rows each: an id and a feature vector."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for number in range(FILES):
        ids = list(range(number * ROWS, (number + 1) * ROWS))
        table = pa.table({"id": ids, "features": [[float(i % 5)] * 8 for i in ids]})
        paths.append(str(directory / f"part-{number:02d}.parquet"))
        pq.write_table(table, paths[-1])
    return paths


def augment(row: dict[str, Any]) -> dict[str, Any]:
    """A random augmentation, drawn from torch's global generator (the library seeds it per sample)."""
    features = torch.tensor(row["features"]) * (0.5 + torch.rand(()))
    return {"id": row["id"], "features": features.tolist()}


def collate(rows: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([row["id"] for row in rows]), torch.tensor([row["features"] for row in rows])


class StreamData(ResumableDataModule, L.LightningDataModule):  # the user's one-line change
    def __init__(self, files: list[str]) -> None:
        super().__init__()
        self.files = files

    def train_dataloader(self) -> DataLoader[Any]:
        from datasets import load_dataset
        from datasets.distributed import split_dataset_by_node

        stream = load_dataset("parquet", data_files=self.files, split="train", streaming=True)
        stream = stream.shuffle(seed=42, buffer_size=BUFFER).map(augment)
        stream = split_dataset_by_node(stream, rank=self.trainer.global_rank, world_size=self.trainer.world_size)  # type: ignore[union-attr]
        return DataLoader(stream, batch_size=BATCH_SIZE, num_workers=2, collate_fn=collate)


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
            self.trainer.save_checkpoint(self.stop)  # every rank takes part; rank 0 writes it
            Path(f"{self.stop}.rank{self.global_rank}.saved").touch()
            while True:  # the driver kills the whole process group with SIGKILL, as a lost node ends a job
                time.sleep(1)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def train(files: list[str], record: str, stop: str | None, ckpt_path: str | None) -> None:
    warnings.filterwarnings("ignore")
    L.seed_everything(7, verbose=False)
    torch.set_num_threads(1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy="ddp",
        max_epochs=EPOCHS,
        callbacks=[ResumableDataCallback()],  # the other one-line change
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(record, stop), datamodule=StreamData(files), ckpt_path=ckpt_path)


def run(work: Path, files: list[str], phase: str, *options: str) -> dict[int, list[dict[str, Any]]]:
    command = [sys.executable, __file__, "train", "--record", str(work / phase), "--files", *files, *options]
    with (work / f"{phase}.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        if "--stop" in options:
            saved = [Path(f"{options[options.index('--stop') + 1]}.rank{rank}.saved") for rank in range(WORLD_SIZE)]
            while not all(path.exists() for path in saved) and process.poll() is None:
                time.sleep(0.1)
            os.killpg(process.pid, signal.SIGKILL)  # the launcher, both ranks and their loader workers
            process.wait()
        elif process.wait(timeout=600):  # its log goes with the temporary folder: its end is printed here
            tail = (work / f"{phase}.log").read_text(errors="replace")[-4000:]
            sys.exit(f"the {phase} run failed (exit {process.returncode}); the end of its log:\n{tail}")
    return {
        rank: [json.loads(line) for line in Path(f"{work / phase}.rank{rank}.jsonl").read_text().splitlines()]
        for rank in range(WORLD_SIZE)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="demo", choices=["demo", "train"])
    parser.add_argument("--record")
    parser.add_argument("--files", nargs="*")
    parser.add_argument("--stop")
    parser.add_argument("--ckpt-path")
    args = parser.parse_args()
    if args.mode == "train":
        train(args.files, args.record, args.stop, args.ckpt_path)
        return
    print(
        f"{WORLD_SIZE} DDP processes (gloo, CPU): {FILES} parquet files of {ROWS} rows, load_dataset(streaming=True),"
    )
    print(f".shuffle(seed=42, buffer_size={BUFFER}), an augmenting .map, split_dataset_by_node, 2 workers, batch 4.")
    with tempfile.TemporaryDirectory(prefix="hf_streaming_") as tmp:
        work = Path(tmp)
        files = write_parquet(work)
        checkpoint = str(work / "mid-epoch.ckpt")
        full = run(work, files, "full")
        stopped = run(work, files, "stopped", "--stop", checkpoint)
        resumed = run(work, files, "resumed", "--ckpt-path", checkpoint)
    print(f"\nkilled (SIGKILL to the process group) after the checkpoint at epoch {STOP_AT[0]} batch {STOP_AT[1]}")
    print("  rank  steps expected  steps resumed  same ids  same aug  same loss  verdict")
    exact = True
    for rank in range(WORLD_SIZE):
        expected, got = full[rank][len(stopped[rank]) :], resumed[rank]
        same = [sum(w[name] == g[name] for w, g in zip(expected, got, strict=False)) for name in ("ids", "aug", "loss")]
        rank_exact = stopped[rank] + got == full[rank]
        exact &= rank_exact
        counts = "  ".join(f"{count:>5}/{len(expected):<2}" for count in same)
        print(f"  {rank:>4}  {len(expected):>14}  {len(got):>13}  {counts}  {'exact' if rank_exact else 'WRONG'}")
    print()
    if not exact:
        print("VERDICT: MISMATCH - the resumed stream differs from the uninterrupted run.")
        sys.exit(1)
    print("VERDICT: EXACT - every rank resumed the shuffled stream at the batch after the checkpoint, same content.")


if __name__ == "__main__":
    main()

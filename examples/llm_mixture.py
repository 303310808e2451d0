"""Pretrain a tiny GPT on a LitData token mixture, stop mid-epoch, resume with other weights, and compare.

Run: ``python examples/llm_mixture.py`` (needs ``litdata``). It writes two token datasets with
``litdata.optimize`` (``TokensLoader``: "web", 96 blocks of 32 tokens in chunks of 16 blocks, and
"code", 48 blocks), and trains a one-layer GPT-style model (causal self-attention, dropout, next-token
loss) on their 0.7/0.3 mixture, written as LitData users write it:

    StreamingDataLoader(CombinedStreamingDataset([web, code], weights=[0.7, 0.3], iterate_over_all=False),
                        batch_size=4, num_workers=2)

with 2 processes (DDP), three times:

1. straight through, as a ``Mixture`` of the same sources whose schedule changes the weights to
   0.5/0.5 at step 12: ``WeightSchedule({0: {"web": 0.7, "code": 0.3}, 12: {"web": 0.5, "code": 0.5}})``;
2. the combined dataset at 0.7/0.3, stopped by ``max_steps`` at step 12 (mid-epoch) after a checkpoint;
3. resumed from that checkpoint with the combined dataset at 0.5/0.5, as a user edits a config.

The library reads the combined dataset as the equivalent ``Mixture`` (each source chunk by chunk), so
the stopped and resumed run equals the run whose schedule changed at the resume. It prints, per rank,
how many steps read the same blocks and computed the same loss (bit for bit), each source's share
before and after the change, and one verdict line (``EXACT``, or ``DIFFERENT`` and exit status 1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from lightning_resumable import Mixture, ResumableDataCallback, ResumableDataModule, WeightSchedule

SOURCES = {"web": (0, 96), "code": (100_000, 48)}  # name: (first block id, blocks)
FIRST, LATER = {"web": 0.7, "code": 0.3}, {"web": 0.5, "code": 0.5}
BLOCK, BLOCKS_PER_CHUNK, VOCAB = 32, 16, 97
SWITCH_STEP, STEPS, BATCH_SIZE, SEED = 12, 30, 4, 7


def token_block(block_id: int) -> torch.Tensor:
    """One block of 32 tokens: its first token is its id (recorded as the sample's id), then text-like tokens."""
    text = (torch.arange(1, BLOCK, dtype=torch.int32) * (block_id % 89 + 3)) % VOCAB
    return torch.cat([torch.tensor([block_id], dtype=torch.int32), text])


def write(root: Path) -> None:
    import litdata

    for name, (first, blocks) in SOURCES.items():
        litdata.optimize(
            fn=token_block,
            inputs=list(range(first, first + blocks)),
            output_dir=str(root / name),
            chunk_size=BLOCK * BLOCKS_PER_CHUNK,
            item_loader=litdata.TokensLoader(),
            num_workers=1,
        )


class TokenData(ResumableDataModule, L.LightningDataModule):
    """The mixture as LitData users write it (``weights``: a dict), or as a ``Mixture`` of the same sources
    (``weights``: a ``WeightSchedule``), for the reference run whose weights change at a step."""

    def __init__(self, root: Path, weights: dict[str, float] | WeightSchedule) -> None:
        super().__init__()
        self.root, self.weights = root, weights

    def train_dataloader(self) -> Any:
        import litdata

        datasets = {
            name: litdata.StreamingDataset(
                str(self.root / name), item_loader=litdata.TokensLoader(block_size=BLOCK), shuffle=True
            )
            for name in SOURCES
        }
        if isinstance(self.weights, WeightSchedule):
            return DataLoader(Mixture(datasets, self.weights), batch_size=BATCH_SIZE, num_workers=2)
        weights = [self.weights[name] for name in SOURCES]
        combined = litdata.CombinedStreamingDataset(
            list(datasets.values()),
            weights=weights,
            iterate_over_all=False,  # LitData's seed, 42: not the run's
        )
        return litdata.StreamingDataLoader(combined, batch_size=BATCH_SIZE, num_workers=2)


class TinyGPT(L.LightningModule):
    def __init__(self, record_path: str) -> None:
        super().__init__()
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
        record = {"step": self.global_step, "ids": batch[:, 0].tolist(), "loss": outputs["loss"].item()}
        with open(f"{self.record_path}.rank{self.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")
        if self.global_step == SWITCH_STEP and self.trainer.max_steps == SWITCH_STEP:
            self.trainer.save_checkpoint(Path(self.record_path).with_name("stopped.ckpt"))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def train(work: Path, phase: str) -> None:
    """One run, on 2 processes (Lightning starts the second by running this command again)."""
    warnings.filterwarnings("ignore")
    L.seed_everything(SEED, verbose=False)
    weights = {"full": WeightSchedule({0: FIRST, SWITCH_STEP: LATER}), "stop": FIRST, "resume": LATER}[phase]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=SWITCH_STEP if phase == "stop" else STEPS,
        deterministic=True,
        callbacks=[ResumableDataCallback()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=work,
    )
    checkpoint = work / "stopped.ckpt" if phase == "resume" else None
    trainer.fit(TinyGPT(str(work / phase)), TokenData(work / "data", weights), ckpt_path=checkpoint)


def records(work: Path, phase: str, rank: int) -> list[dict[str, Any]]:
    path = work / f"{phase}.rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def shares(steps: list[dict[str, Any]]) -> str:
    counts = Counter("code" if block >= SOURCES["code"][0] else "web" for step in steps for block in step["ids"])
    total = sum(counts.values())
    return ", ".join(f"{name} {counts[name] / total:.2f}" for name in SOURCES)


def compare(work: Path) -> bool:
    exact = True
    for rank in range(2):
        full = records(work, "full", rank)
        interrupted = records(work, "stop", rank) + records(work, "resume", rank)
        same = {
            name: sum(a[name] == b[name] for a, b in zip(full, interrupted, strict=False)) for name in ("ids", "loss")
        }
        steps = len(full)
        exact &= len(interrupted) == steps and all(count == steps for count in same.values())
        print(
            f"rank {rank}: {steps} steps; the stopped and resumed run has the same blocks in {same['ids']},"
            f" loss bits in {same['loss']}"
        )
        before = [step for step in interrupted if step["step"] <= SWITCH_STEP]
        after = [step for step in interrupted if step["step"] > SWITCH_STEP]
        print(f"        shares before the change: {shares(before)}; after it: {shares(after)}")
    print(f"weights {FIRST} -> {LATER} at step {SWITCH_STEP} (mid-epoch), changed at the resume")
    return exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=["full", "stop", "resume"])
    parser.add_argument("--work", type=Path)
    arguments = parser.parse_args()
    if arguments.phase:
        train(arguments.work, arguments.phase)
        return
    with tempfile.TemporaryDirectory(prefix="llm-mixture-") as directory:
        work = Path(directory)
        write(work / "data")
        for phase in ("full", "stop", "resume"):
            command = [sys.executable, __file__, "--phase", phase, "--work", str(work)]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        exact = compare(work)
    print("EXACT: the resumed run equals the run whose schedule changed there" if exact else "DIFFERENT")
    sys.exit(0 if exact else 1)


if __name__ == "__main__":
    main()

"""Mixture weights set by the training itself (online data mixing), exact through a SIGKILL and a SIGTERM.

Run: ``python examples/online_mixing.py``. A tiny model trains on a ``Mixture`` of three sources of
different difficulty ("web": noisy targets, "code": a learnable function, "books": in between), 2 DDP
processes with 2 loader workers each. Every 4 steps the training reweights the mixture as DoReMi-style
methods do: an exponentiated-gradient step from each source's mean loss over the global batch (each
sample's source from ``ResumableDataCallback.batch_sources()``, the sums all-reduced, so every rank
sets the same weights with ``set_mixture_weights``). Three runs:

1. straight through;
2. killed with SIGKILL from outside mid-epoch (``ModelCheckpoint`` saves every 5 steps), resumed from its
   newest checkpoint, and that run stopped by SIGTERM to its whole process group (a preemption:
   ``OnExceptionCheckpoint`` saves where the ranks agree to stop), resumed again to the end.

It prints, per rank, how many steps of the interrupted run trained the same sample ids and loss bits as
the uninterrupted run, whether the audit logs (each step's ids and the weights it was drawn under) are
the same, the weights history of both (each change: the step asked at, the step it took effect, the
weights), and one verdict line (``EXACT``, or ``DIFFERENT`` and the exit status 1).
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
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import Mixture, ResumableDataCallback, ResumableDataModule
from lightning_resumable.format.audit import first_divergence, read_audit

SOURCES = {"web": (0, 90, 1.0), "code": (1000, 60, 0.0), "books": (2000, 40, 0.3)}  # name: (first id, size, noise)
FIRST_WEIGHTS = {"web": 1.0, "code": 1.0, "books": 1.0}
REWEIGHT_EVERY = 4
STEP_SIZE = 0.2  # of the exponentiated-gradient update
SMOOTHING = 0.1  # the share of uniform weights mixed in, so no source starves
WORLD_SIZE, BATCH_SIZE, EPOCHS, SAMPLES_PER_EPOCH = 2, 4, 3, 128  # 16 steps an epoch
KILL_AFTER, SIGTERM_AFTER = 14, 33  # steps, counted by rank 0's records


class Source(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """Sample ``i``: id ``first + i``, features, and a target ``sum(x)`` plus ``noise`` times a fixed draw."""

    def __init__(self, first: int, size: int, noise: float) -> None:
        self.first, self.size, self.noise = first, size, noise

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        draw = torch.randn(9, generator=torch.Generator().manual_seed(self.first + index))
        features = draw[:8] + 0.05 * torch.randn(8)  # a random augmentation, drawn as the library seeds it
        return torch.tensor(self.first + index), features, features.sum() + self.noise * 3 * draw[8]


class MixtureData(ResumableDataModule, L.LightningDataModule):
    def train_dataloader(self) -> DataLoader[Any]:
        sources = {name: Source(first, size, noise) for name, (first, size, noise) in SOURCES.items()}
        mixture = Mixture(sources, FIRST_WEIGHTS, samples_per_epoch=SAMPLES_PER_EPOCH)
        return DataLoader(mixture, batch_size=BATCH_SIZE, num_workers=2)


class Model(L.LightningModule):
    def __init__(self, record_path: str) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.record_path = record_path

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, features, targets = batch
        per_sample = (self.net(features).squeeze(1) - targets).pow(2)
        data = ResumableDataCallback.of(self.trainer)
        asked = None
        if batch_idx % REWEIGHT_EVERY == REWEIGHT_EVERY - 1:
            sums, counts = data.batch_sources().totals(per_sample.detach().double())  # per source, this rank
            torch.distributed.all_reduce(sums)
            torch.distributed.all_reduce(counts)
            asked = data.set_mixture_weights(reweighted(data, sums, counts)).to_dict()
        record = {"step": self.global_step, "ids": ids.tolist(), "loss": per_sample.mean().item(), "asked": asked}
        with open(f"{self.record_path}.rank{self.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")
        return per_sample.mean()

    def on_train_end(self) -> None:
        history = [change.to_dict() for change in ResumableDataCallback.of(self.trainer).weight_changes()]
        Path(f"{self.record_path}.history.rank{self.global_rank}.json").write_text(json.dumps(history))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def reweighted(data: ResumableDataCallback, sums: torch.Tensor, counts: torch.Tensor) -> dict[str, float]:
    """``w * exp(step_size * mean loss)``, normalised and smoothed: sources with higher loss get more weight."""
    names, changes = data.batch_sources().names, data.weight_changes()
    current = dict(changes[-1].weights()) if changes else FIRST_WEIGHTS
    weights = torch.tensor([float(current[name]) for name in names], dtype=torch.float64)
    means = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
    weights = weights * torch.exp(STEP_SIZE * means.clamp(max=20))
    weights = (1 - SMOOTHING) * weights / weights.sum() + SMOOTHING / len(names)
    return dict(zip(names, weights.tolist(), strict=True))


def train(work: Path, phase: str, ckpt_path: str | None) -> None:
    """One run, on 2 processes (Lightning starts the second by running this command again)."""
    warnings.filterwarnings("ignore")
    L.seed_everything(7, verbose=False)
    torch.set_num_threads(1)
    audit = work / ("audit-full" if phase == "full" else "audit-interrupted")
    callbacks = [
        ModelCheckpoint(dirpath=work / f"{phase}-ckpt", filename="{step}", every_n_train_steps=5, save_top_k=-1),
        OnExceptionCheckpoint(dirpath=work / f"{phase}-ckpt", filename="on-exception"),
        ResumableDataCallback(audit_dir=str(audit)),
    ]
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
        default_root_dir=work,
    )
    trainer.fit(Model(str(work / phase)), MixtureData(), ckpt_path=ckpt_path)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# ------------------------------------------------------------------------------------ driver side
def records(work: Path, phase: str, rank: int) -> list[dict[str, Any]]:
    path = work / f"{phase}.rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def launch(work: Path, phase: str, ckpt_path: Path | None = None) -> subprocess.Popen[bytes]:
    command = [sys.executable, __file__, "--phase", phase, "--work", str(work)]
    if ckpt_path is not None:
        command += ["--ckpt-path", str(ckpt_path)]
    log = (work / f"{phase}.log").open("wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def interrupted_after(work: Path, phase: str, steps: int, how: signal.Signals, ckpt: Path | None) -> None:
    """Run ``phase`` and send ``how`` to its whole process group once rank 0 recorded ``steps`` steps."""
    process = launch(work, phase, ckpt)
    deadline = time.monotonic() + 600
    while len(records(work, phase, 0)) < steps:
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            sys.exit(f"the {phase} run ended before its interruption; see {work / (phase + '.log')}")
        time.sleep(0.01)
    os.killpg(process.pid, how)
    process.wait(timeout=600)


def steps_in(checkpoint: Path) -> int | None:
    try:
        return int(torch.load(checkpoint, weights_only=False, map_location="cpu")["global_step"])
    except Exception:  # a file torn by the kill
        return None


def newest_checkpoint(directory: Path) -> tuple[Path, int]:
    found = [(steps, path) for path in directory.glob("*.ckpt") if (steps := steps_in(path)) is not None]
    if not found:
        sys.exit(f"no complete checkpoint in {directory}")
    steps, path = max(found)
    return path, steps


def run_all(work: Path) -> bool:
    full = launch(work, "full")
    if full.wait(timeout=900) != 0:
        sys.exit(f"the uninterrupted run failed; see {work / 'full.log'}")
    interrupted_after(work, "killed", KILL_AFTER, signal.SIGKILL, None)
    first, first_steps = newest_checkpoint(work / "killed-ckpt")
    interrupted_after(work, "preempted", SIGTERM_AFTER - first_steps, signal.SIGTERM, first)
    second, second_steps = newest_checkpoint(work / "preempted-ckpt")
    last = launch(work, "resumed", second)
    if last.wait(timeout=900) != 0:
        sys.exit(f"the last resumed run failed; see {work / 'resumed.log'}")
    print(
        f"{WORLD_SIZE} processes, 2 workers each; weights set every {REWEIGHT_EVERY} steps from the sources' losses."
        f"\nSIGKILL after step {KILL_AFTER}: resumed from the checkpoint at step {first_steps}; SIGTERM after step"
        f" {SIGTERM_AFTER}: resumed from the preemption's checkpoint at step {second_steps}."
    )
    exact = True
    for rank in range(WORLD_SIZE):
        expected = records(work, "full", rank)
        killed, preempted = records(work, "killed", rank), records(work, "preempted", rank)
        got = killed[:first_steps] + preempted[: second_steps - first_steps] + records(work, "resumed", rank)
        same = {name: sum(a[name] == b[name] for a, b in zip(expected, got, strict=False)) for name in ("ids", "loss")}
        rank_exact = len(got) == len(expected) and got == expected
        exact &= rank_exact
        print(
            f"rank {rank}: {len(expected)} steps; the interrupted run has the same ids in {same['ids']},"
            f" loss bits in {same['loss']}, the same changes asked in each step: {rank_exact}"
        )
    divergence = first_divergence(read_audit(work / "audit-full"), read_audit(work / "audit-interrupted"))
    print(f"audit logs (each step's ids and the weights it was drawn under): {divergence or 'the same'}")
    histories = [
        json.loads((work / f"{phase}.history.rank{rank}.json").read_text())
        for phase in ("full", "resumed")
        for rank in range(WORLD_SIZE)
    ]
    same_history = all(history == histories[0] for history in histories)
    print(f"weights history ({len(histories[0])} changes), the same on every rank and in both runs: {same_history}")
    for change in histories[0]:
        parts, period = change["weights"]["parts"], change["weights"]["period"]
        shown = ", ".join(f"{name} {parts.get(name, 0) / period:.3f}" for name in SOURCES)
        print(f"  asked at step {change['asked']:>2}, drawn from step {change['step']:>2}: {shown}")
    return exact and divergence is None and same_history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--ckpt-path")
    arguments = parser.parse_args()
    if arguments.phase:
        train(arguments.work, arguments.phase, arguments.ckpt_path)
        return
    with tempfile.TemporaryDirectory(prefix="online-mixing-") as directory:
        exact = run_all(Path(directory))
    print("EXACT: the interrupted run equals the uninterrupted one" if exact else "DIFFERENT")
    sys.exit(0 if exact else 1)


if __name__ == "__main__":
    main()

"""Runs that write the release checkpoint fixtures, and resume from them.

``python -m tests.release_fixtures`` (from the repository root, with the release installed) writes
``tests/fixtures/<version>/``: for each scenario a checkpoint taken mid-run and ``expected.json``, the
steps the *uninterrupted* run of that release trained after it (sample ids and per-sample augmentation
draws). ``tests/test_release_fixtures.py`` resumes every stored release's checkpoints with the current
code and requires those very steps: a checkpoint written by a release resumes, under any later release,
to the batches the release that wrote it would have trained. Self-contained on purpose: the scenarios
must not change when other tests do.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader, Dataset, IterableDataset, WeightedRandomSampler

import lightning_resumable
from lightning_resumable import Mixture, ResumableDataCallback, ResumableDataModule

from .helpers import SaveAtStep  # used only to write fixtures, never to check them

FIXTURES = Path(__file__).parent / "fixtures"
SEED = 2026
EPOCHS = 2
SCENARIOS: dict[str, int] = {"shuffle": 13, "weighted": 5, "combined": 9, "stream": 11, "mixture": 7}
"""Each scenario and the optimizer step after which its checkpoint is written (mid-epoch)."""


class Samples(Dataset[tuple[int, float]]):
    """Sample ``i`` is ``(i, a draw from torch's global generator)``: the draw shows the sample's seed."""

    def __init__(self, size: int, offset: int = 0) -> None:
        self.size, self.offset = size, offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, float]:
        return self.offset + index, float(torch.rand(()))


class Stream(IterableDataset[tuple[int, float]]):
    """Ids ``0..size-1`` with a draw from ``random`` each; its state is the count it has yielded."""

    def __init__(self, size: int = 30) -> None:
        self.size, self.position, self._start = size, 0, 0

    def __iter__(self) -> Any:
        self.position, self._start = self._start, 0
        while self.position < self.size:
            self.position += 1
            yield self.position - 1, random.random()

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = self._start = state["position"]


class Data(ResumableDataModule, L.LightningDataModule):
    def __init__(self, scenario: str) -> None:
        super().__init__()
        self.scenario = scenario

    def train_dataloader(self) -> Any:
        if self.scenario == "shuffle":
            return DataLoader(Samples(30), batch_size=4, shuffle=True)
        if self.scenario == "weighted":
            weights = [0.0 if index % 4 == 0 else 1.0 + index % 3 for index in range(24)]
            return DataLoader(Samples(24), batch_size=3, sampler=WeightedRandomSampler(weights, num_samples=24))
        if self.scenario == "combined":
            long = DataLoader(Samples(20), batch_size=2, shuffle=True)
            short = DataLoader(Samples(7, offset=100), batch_size=2, shuffle=True)
            return CombinedLoader({"long": long, "short": short}, "max_size_cycle")
        if self.scenario == "mixture":  # from 0.3.0
            sources = {"a": Samples(18), "b": Samples(10, offset=100)}
            return DataLoader(Mixture(sources, {"a": 2, "b": 1}), batch_size=3)
        return DataLoader(Stream(), batch_size=4)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.steps: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        parts = batch if isinstance(batch, dict) else {"": batch}
        self.steps.append({key: [part[0].tolist(), part[1].tolist()] for key, part in parts.items()})
        return sum(self.layer(part[1].float().unsqueeze(1)).mean() for part in parts.values())  # type: ignore[return-value]

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def run(scenario: str, root: Path, ckpt_path: Path | None = None, save_at: Path | None = None) -> list[Any]:
    """Train ``scenario`` for ``EPOCHS`` epochs on one process; the steps it trained."""
    callbacks: list[L.Callback] = [ResumableDataCallback()]
    if save_at is not None:
        callbacks.append(SaveAtStep(SCENARIOS[scenario], save_at))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=EPOCHS,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    L.seed_everything(SEED, verbose=False)
    model = Model()
    trainer.fit(model, Data(scenario), ckpt_path=ckpt_path)
    return model.steps


def compact_json(value: Any, depth: int = 0) -> str:
    """JSON with one step per line: readable in a diff, exact for the floats (Python's repr round-trips)."""
    if isinstance(value, dict) and depth < 3:
        inner = ",\n".join(
            f"{'  ' * (depth + 1)}{json.dumps(key)}: {compact_json(item, depth + 1)}" for key, item in value.items()
        )
        return "{\n" + inner + "\n" + "  " * depth + "}" + ("\n" if depth == 0 else "")
    if isinstance(value, list) and depth < 4:
        inner = ",\n".join("  " * (depth + 1) + json.dumps(item) for item in value)
        return "[\n" + inner + "\n" + "  " * depth + "]"
    return json.dumps(value)


def write(root: Path, version: str, scenarios: list[str], content: bool) -> Path:
    """Write the fixtures of the installed release (``version``) under ``tests/fixtures/<version>/``.

    ``content=False`` keeps the sample ids only: for a release that did not seed samples yet, whose
    draws no later release reproduces.
    """
    target = FIXTURES / version
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    expected = {}
    for scenario in scenarios:
        stop = SCENARIOS[scenario]
        uninterrupted = run(scenario, root / scenario)
        run(scenario, root / scenario, save_at=target / f"{scenario}.ckpt")
        steps = uninterrupted[stop:] if content else [ids_of(step) for step in uninterrupted[stop:]]
        expected[scenario] = {"stop_step": stop, "steps_after": steps}
    written = {"written_by": version, "seed": SEED, "content": content, "scenarios": expected}
    (target / "expected.json").write_text(compact_json(written))
    return target


def ids_of(step: dict[str, Any]) -> dict[str, Any]:
    """A recorded step without its augmentation draws."""
    return {key: [ids] for key, (ids, _draws) in step.items()}


if __name__ == "__main__":
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=getattr(lightning_resumable, "__version__", None))
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--ids-only", action="store_true", help="record sample ids, not their draws")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        print(write(Path(scratch), options.version, options.scenarios, content=not options.ids_only), file=sys.stderr)

"""What the unit tests share: a tiny model and datamodule, a trainer for one process, a callback that
saves mid-run, and `assert_resumes_exactly`, the stop-and-resume check (torchdata's
``run_test_save_load_state`` is its model)."""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, get_worker_info

from lightning_resumable import Mixture, ResumableDataCallback, ResumableDataModule
from lightning_resumable.core.interleave import realised_parts
from lightning_resumable.core.mixture_sampler import MixtureSampler
from lightning_resumable.core.mixture_stream import source_key
from lightning_resumable.core.order import EpochOrder
from lightning_resumable.core.verification import digest_of
from lightning_resumable.format._keys import mixture_pass_seed
from lightning_resumable.format.envelope import MixtureState, parse
from lightning_resumable.lightning.mixture_owner import MixtureOwner
from lightning_resumable.lightning.progress import SavePoint
from lightning_resumable.readers.base import StreamReader
from lightning_resumable.readers.build import BuildOptions, build_resumable
from lightning_resumable.readers.streams import StreamLoader, make_stream_resumable

__all__ = [
    "Counting",
    "Data",
    "Model",
    "PlainData",
    "SaveAtStep",
    "Several",
    "assert_reader_resumes_exactly",
    "assert_resumes_exactly",
    "checkpoint_with_callback",
    "ids",
    "loader_state",
    "replayed_interleave",
    "replayed_mixture",
    "stream_loader",
    "trainer",
]


class Model(L.LightningModule):
    """Records what each step trained on in ``seen``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch[0].flatten().tolist())
        return self.layer(batch[0]).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class PlainData(L.LightningDataModule):
    def __init__(self, size: int = 16) -> None:
        super().__init__()
        self.size = size

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.arange(self.size).float().unsqueeze(1)), batch_size=2, shuffle=True)


class Data(ResumableDataModule, PlainData):
    def train_dataloader(self) -> DataLoader[Any]:
        return super().train_dataloader()


def trainer(tmp_path: Path, callbacks: list[L.Callback], **kwargs: Any) -> L.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    return L.Trainer(callbacks=callbacks, **{**options, **kwargs})


class SaveAtStep(L.Callback):
    """Saves a checkpoint to ``path`` when the trainer has done ``step`` optimizer steps; training goes on."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def checkpoint_with_callback(tmp_path: Path, *extra: L.Callback) -> Path:
    path = tmp_path / "mid.ckpt"
    trainer(tmp_path, [ResumableDataCallback(), SaveAtStep(3, path), *extra], max_epochs=2).fit(Model(), Data())
    return path


def assert_resumes_exactly(
    tmp_path: Path,
    make_model: Callable[[], L.LightningModule],
    make_data: Callable[[], L.LightningDataModule],
    *,
    stop: int,
    max_epochs: int = 2,
    make_callback: Callable[[], ResumableDataCallback] = ResumableDataCallback,
) -> list[Any]:
    """Train straight through; train again, saving after ``stop`` optimizer steps; resume a third model
    from that save. The stopped run's first ``stop`` steps and the resumed steps must be the
    uninterrupted run's, as each model records them in ``seen``. The uninterrupted steps."""
    full = make_model()
    trainer(tmp_path / "full", [make_callback()], max_epochs=max_epochs).fit(full, make_data())
    path = tmp_path / "stopped.ckpt"
    stopped = make_model()
    with_save = [make_callback(), SaveAtStep(stop, path)]
    trainer(tmp_path / "stop", with_save, max_epochs=max_epochs).fit(stopped, make_data())
    assert path.exists(), f"the run never reached step {stop}"
    resumed = make_model()
    trainer(tmp_path / "resume", [make_callback()], max_epochs=max_epochs).fit(resumed, make_data(), ckpt_path=path)
    steps: list[Any] = full.seen  # type: ignore[assignment]
    assert stopped.seen[:stop] + resumed.seen == steps  # type: ignore[operator]
    return steps


# Several map-style loaders, and a stream: shared by the tests of owners, the audit, the parser.
def ids(size: int, offset: int) -> TensorDataset:
    return TensorDataset(torch.arange(offset, offset + size).float().unsqueeze(1))


class Several(ResumableDataModule, L.LightningDataModule):
    def __init__(
        self,
        keys: tuple[str, str] = ("a", "b"),
        mode: str = "max_size_cycle",
        batch_size: int = 2,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.keys, self.mode, self.batch_size, self.num_workers = keys, mode, batch_size, num_workers

    def train_dataloader(self) -> Any:
        long, short = (
            DataLoader(ids(size, offset), batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)
            for size, offset in ((12, 0), (5, 100))
        )
        return CombinedLoader({self.keys[0]: long, self.keys[1]: short}, self.mode)  # type: ignore[arg-type]


class Counting(IterableDataset[torch.Tensor]):
    """Ids 0..size-1, split across workers; each sample carries a draw from the global generator."""

    def __init__(self, size: int = 24) -> None:
        self.size, self.position, self._start = size, 0, 0

    def __iter__(self) -> Any:
        worker = get_worker_info()
        mine = list(range(self.size))[worker.id :: worker.num_workers] if worker else list(range(self.size))
        self.position, self._start = self._start, 0
        while self.position < len(mine):
            self.position += 1
            yield torch.tensor([float(mine[self.position - 1]), random.random()])

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = self._start = state["position"]


def stream_loader(num_workers: int, epoch: int | list[int] = 0) -> StreamLoader:
    """A stream reader over `Counting`, at the trainer epoch ``epoch`` (a list: the epoch now in its cell)."""
    user = DataLoader(Counting(), batch_size=2, num_workers=num_workers)
    cell = epoch if isinstance(epoch, list) else [epoch]
    return make_stream_resumable(
        user, seed=5, rank=0, world_size=1, seed_samples=True, restore_globals=True, epoch_source=lambda: cell[0]
    )


def loader_state(num_workers: int) -> dict[str, Any]:
    """A real stream loader's state after 2 batches (torchdata's form, with each worker's stream state)."""
    loader = stream_loader(num_workers)
    batches = iter(loader)
    next(batches), next(batches)
    state = loader.state_after(2)
    loader.retire_workers()
    return state


def read(batches: Any, count: int | None = None) -> list[str]:
    """The digests of ``count`` batches of a pass (all of it: ``None``); a pass cut short is left
    unexhausted, as Lightning leaves a sized loader's."""
    return [digest_of(batch) for batch in itertools.islice(batches, count)]


def assert_restores_twice_exactly(
    make: Callable[[], StreamReader], full: list[Any], cut: int, state_bytes: int = 4096
) -> dict[str, Any]:
    """A reader (``make()``, one pass of the same epoch each) stopped after ``cut`` batches, resumed from its
    state, read one batch, saved again and resumed from that: its batches are ``full``'s, and the state,
    pickled, under ``state_bytes`` (no sample in it). Returns the first state."""
    import pickle

    def resumed_from(state: dict[str, Any], batches: int) -> StreamReader:
        resumed = make()
        resumed.resume_from(state, batches)
        return resumed

    stopped = make()
    reading = iter(stopped)
    head = [next(reading) for _ in range(cut)]
    state = stopped.state_after(cut)
    del reading
    assert len(pickle.dumps(state)) < state_bytes, "no sample in the state"
    assert head + list(resumed_from(state, cut)) == full, cut
    again = resumed_from(state, cut)
    reading = iter(again)
    one_more = next(reading)
    second = again.state_after(cut + 1)
    del reading
    assert [*head, one_more, *resumed_from(second, cut + 1)] == full, cut
    return state


def assert_reader_resumes_exactly(
    make: Callable[[list[int], int], StreamReader],
    *,
    stop: int,
    length: int | None = None,
    workers: tuple[int, int] = (0, 0),
) -> tuple[dict[str, Any], list[list[str]]]:
    """The save/restore/compare suite every stream reader passes (torchdata's ``run_test_save_load_state``
    is its model). ``make(epoch, num_workers)`` builds a reader whose trainer epoch is ``epoch[0]``;
    ``length``: batches a pass is read for (``None``: to its end); ``workers``: the stopped and the
    resumed reader's.

    Three epochs read straight through; another reader reads epoch 0, then ``stop`` batches of epoch 1
    and one ahead, as Lightning does before a save; a third resumes from its state there. The resumed
    reader hands out the restored state before it reads, its first batch is the one whose digest was
    saved, the rest of epoch 1 is the uninterrupted one's, and epoch 2 is read afresh. Returns the
    saved state and the uninterrupted epochs' digests.
    """
    epoch = [0]
    full = make(epoch, workers[0])
    expected = []
    for epoch[0] in range(3):
        expected.append(read(iter(full), length))
    stopped = make(epoch, workers[0])
    epoch[0] = 0
    read(iter(stopped), length)
    epoch[0] = 1
    seen = read(iter(stopped), stop + 1)  # ``stop`` trained, the next read ahead
    state, digest = stopped.state_after(stop), stopped.next_batch_digest(stop)
    resumed = make(epoch, workers[1])
    resumed.resume_from(state, stop, digest)
    assert resumed.state_after(stop) == state, "before its pass, a resumed reader hands out the restored state"
    assert seen[:stop] + read(iter(resumed), len(expected[1]) - stop) == expected[1]
    assert resumed.first_batch == (digest, digest)
    epoch[0] = 2
    assert read(iter(resumed), length) == expected[2], "the resumed pass ends, the next epoch is fresh"
    for each in (full, stopped, resumed):
        each.retire_workers()
    return state, expected


def replayed_interleave(parts: Sequence[int], length: int) -> list[int]:
    """A mixture's interleave replayed turn by turn from its definition (Tijdeman's), in exact fractions,
    with no table: of the turns at least 1/(2k - 2) due, the one with the earliest deadline goes first."""
    period, taking = sum(parts), [i for i, part in enumerate(parts) if part]
    slack = Fraction(1, max(1, 2 * len(taking) - 2))
    taken, order = [0] * len(parts), []
    for offset in range(length):
        may = [i for i in taking if len(taking) == 1 or Fraction(parts[i] * (offset + 1), period) - taken[i] >= slack]
        chosen = min(may, key=lambda i: ((taken[i] + 1 - slack) / Fraction(parts[i], period), i))
        order.append(chosen)
        taken[chosen] += 1
    return order


def replayed_mixture(
    sources: dict[str, int],
    seed: int,
    changes: Sequence[tuple[int, dict[str, float]]],
    length: int,
    shuffle: bool = True,
) -> list[tuple[str, int]]:
    """A mixture's first ``length`` draws, ``(source, index in it)``, replayed draw by draw: where the
    weights change (``changes``: ``(stream position, weights)``) the interleave starts afresh; each
    source's draws go through passes permuted by (seed, name, pass). ``sources``: name -> size."""
    counts, drawn, names = dict.fromkeys(sources, 0), [], sorted(sources)
    segments: list[tuple[int, tuple[int, ...]]] = []
    for start, weights in changes:
        parts, _ = realised_parts([(name, weights[name]) for name in names])
        if not segments or tuple(parts) != segments[-1][1]:  # the same weights again change nothing
            segments.append((start, tuple(parts)))
    bounds = [start for start, _ in segments[1:]] + [length]
    for (start, parts), end in zip(segments, bounds, strict=True):
        for source in replayed_interleave(parts, max(0, min(end, length) - start)):
            name = names[source]
            count, size = counts[name], sources[name]
            order = EpochOrder(size, mixture_pass_seed(seed, source_key(name), count // size), 0, shuffle)
            drawn.append((name, order.index_at(count % size)))
            counts[name] += 1
    return drawn[:length]


# ------------------------------------------------------------------------ mixtures, on one process
SEED = 11
SIZES = {"web": 13, "code": 7, "books": 5}


def mixture(weights: Any, sizes: dict[str, int] = SIZES, **options: Any) -> Mixture:
    return Mixture({name: list(range(size)) for name, size in sizes.items()}, weights, **options)


def owner_for(mix: Mixture, world_size: int = 1, rank: int = 0, batch_size: int = 4) -> MixtureOwner:
    built = build_resumable(DataLoader(mix, batch_size=batch_size), BuildOptions(SEED, world_size, rank))
    assert built.mixture is not None
    return MixtureOwner(built.loader)


def drawn(sampler: MixtureSampler, keys: list[Any]) -> list[tuple[str, int]]:
    return [sampler.mixture.locate(index) for index, _ in keys]


def in_stream_order(per_rank: list[list[Any]], batch_size: int) -> list[Any]:
    """What ranks read, in stream order: each global batch is rank 0's batch, then rank 1's, ..."""
    steps = len(per_rank[0]) // batch_size
    return [
        draw for step in range(steps) for rank in per_rank for draw in rank[step * batch_size : (step + 1) * batch_size]
    ]


def read_epochs(owner: MixtureOwner, epochs: int) -> list[tuple[str, int]]:
    """On one process: the rest of the current epoch, then ``epochs - 1`` more, as (source, index) draws."""
    sampler, found = owner.sampler, []
    for number in range(epochs):
        if number:
            sampler.set_epoch(sampler.epoch + 1)
        found += drawn(sampler, list(iter(sampler)))
    return found


def save(owner: MixtureOwner, batches: int) -> MixtureState:
    sampler = owner.sampler
    at = SavePoint(SEED, sampler.epoch, batches, False, False, 0, sampler.num_replicas, False, False)
    saved = owner.save(at)
    parsed = parse({"format": 1, "kind": "mixture", "keys": 1, "state": saved.to_dict()}).state  # as a checkpoint
    assert isinstance(parsed, MixtureState) and parsed == saved
    return parsed


def resumed(mix: Mixture, saved: MixtureState, world_size: int = 1) -> MixtureOwner:
    owner = owner_for(mix, world_size)
    owner.restore(saved, saved.loader.state.epoch, False, lambda *arguments: None)
    return owner


def scheduler_signals(pid: int, signum: int = signal.SIGTERM) -> None:
    """Signal ``pid`` from another process, as a cluster's scheduler does (torch's worker handler tells its
    parent's SIGTERM from anyone else's)."""
    subprocess.run(["kill", "-s", signal.Signals(signum).name.removeprefix("SIG"), str(pid)], check=True)

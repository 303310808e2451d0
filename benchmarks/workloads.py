"""The workloads of the benchmarks: datasets that cost nothing (so the library's cost is what is
measured), a realistic augmentation, a stateful stream, a restore, and a small Lightning run."""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from typing import Any

import torch
from timing import peak_rss_mb
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_resumable import ResumableSampler, sample_rng

WORLD_SIZE = 2
BATCH_SIZE = 32
RESUME_FRACTION = 0.9


class IndexDataset(Dataset[int]):
    """A dataset of ``size`` samples that costs nothing to read: the benchmark measures indices."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


class CropFlip(Dataset[torch.Tensor]):
    """A realistic ``__getitem__``: a random 224x224 crop of a 3x256x256 uint8 image, flipped half the time."""

    def __init__(self, size: int = 64, explicit_rng: bool = False) -> None:
        self.images = torch.randint(0, 256, (8, 3, 256, 256), dtype=torch.uint8)
        self.size = size
        self.explicit_rng = explicit_rng

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = sample_rng().torch if self.explicit_rng else None
        top, left = torch.randint(0, 33, (2,), generator=generator).tolist()
        crop = self.images[index % 8, :, top : top + 224, left : left + 224]
        if torch.rand((), generator=generator) < 0.5:
            crop = crop.flip(-1)
        return crop.contiguous()


class CountingStream(torch.utils.data.IterableDataset[int]):
    """``size`` ids split across workers; its state is how far this copy has read (torchdata's protocol)."""

    def __init__(self, size: int) -> None:
        self.size, self.position, self._start = size, 0, 0

    def __iter__(self) -> Any:
        worker = torch.utils.data.get_worker_info()
        first, step = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        self.position, self._start = self._start, 0
        for index in range(first + self.position * step, self.size, step):
            self.position += 1
            yield index

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = state["position"]


MIXTURE_WEIGHTS = {  # the weights of a mixture of 8 sources
    "mixture": [0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02],  # exact with a period of 100
    "mixture-longest-period": [0.3141, 0.2718, 0.1414, 0.1732, 0.0577, 0.0223, 0.0101, 0.0094001],  # 1/16384
}
"""A mixture of 8 sources: decimal weights, and weights that the longest period (16384) rounds."""


def built_restore(method: str, size: int, batches_done: int) -> tuple[Any, Any]:
    """What a restarted process does from the loader ``train_dataloader()`` returns to its first batch:
    the library builds it, its owner restores the state after ``batches_done`` batches (written by
    another loader of the same setup). ``plain``: a ``DataLoader(IndexDataset(size), shuffle=True)``;
    a mixture method: a ``Mixture`` of 8 ``IndexDataset`` sources of ``size`` samples together. Returns
    a function that does it all and returns the loader, and one that does it from the built loader on."""
    from lightning_resumable import Mixture
    from lightning_resumable.core.interleave import _kept_parts, interleave
    from lightning_resumable.lightning.mixture_owner import MixtureOwner
    from lightning_resumable.lightning.owners import LoaderOwner
    from lightning_resumable.lightning.progress import SavePoint
    from lightning_resumable.readers.build import BuildOptions, build_resumable

    def returned() -> DataLoader[Any]:
        if method == "plain":
            return DataLoader(IndexDataset(size), batch_size=BATCH_SIZE, shuffle=True)
        weights, sizes = MIXTURE_WEIGHTS[method], [size // 8 + (source < size % 8) for source in range(8)]
        sources = {f"source{source}": IndexDataset(sizes[source]) for source in range(8)}
        mixture = Mixture(sources, dict(zip(sources, weights, strict=True)), samples_per_epoch=size)
        return DataLoader(mixture, batch_size=BATCH_SIZE)

    def owner(loader: DataLoader[Any]) -> tuple[Any, Any]:
        built = build_resumable(loader, BuildOptions(seed=1, num_replicas=WORLD_SIZE, rank=0, seed_samples=False))
        return (LoaderOwner if method == "plain" else MixtureOwner)(built.loader), built.loader

    writer, _ = owner(returned())
    writer.start_fresh(0)
    state = writer.save(SavePoint(1, 0, batches_done, False, False, 0, WORLD_SIZE, False, False))
    interleave.cache_clear()  # as in a fresh process
    _kept_parts.cache_clear()

    def restored() -> Any:
        reader, loader = owner(returned())
        reader.restore(state, 0, False, lambda *arguments: None)
        return loader

    return restored, state


def measure_restore(method: str, size: int) -> dict[str, float]:
    """In this (fresh) process: seconds from load_state_dict to the first batch, and the peak memory added."""
    warnings.filterwarnings("ignore")
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    # Warm up torch and the DataLoader machinery the same way for every method: a restore happens in
    # a process that has already run torch code, and first-call costs belong to no sampler.
    next(iter(DataLoader(IndexDataset(64), batch_size=BATCH_SIZE, sampler=DistributedSampler(range(64), 2, 0))))
    dataset = IndexDataset(size)
    per_rank = -(-size // WORLD_SIZE)
    batches_done = int(per_rank * RESUME_FRACTION) // BATCH_SIZE
    samples_done = batches_done * BATCH_SIZE
    loader: Any
    if method == "lightning_resumable":
        sampler = ResumableSampler(dataset, WORLD_SIZE, 0, seed=1, batch_size=BATCH_SIZE)
        loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)
        state = sampler.state_dict(batches_done)
        restore = lambda: sampler.load_state_dict(state)  # noqa: E731
    elif method in ("plain", *MIXTURE_WEIGHTS):
        restored, _ = built_restore(method, size, batches_done)
        baseline = peak_rss_mb()
        start = time.perf_counter()
        first = next(iter(restored()))
        seconds = time.perf_counter() - start
        assert len(first) == BATCH_SIZE
        return {"seconds": seconds, "peak_mb": peak_rss_mb() - baseline}
    else:
        sampler_type = DistributedSampler if method.startswith("DistributedSampler") else StatefulDistributedSampler
        loader = StatefulDataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler_type(dataset, WORLD_SIZE, 0))
        state = {
            "_index_sampler_state": None,
            "_sampler_iter_state": {"samples_yielded": samples_done},
            "_sampler_iter_yielded": batches_done,
            "_num_yielded": batches_done,
            "_IterableDataset_len_called": None,
            "_shared_seed": None,
            "fetcher_state": None,
            "dataset_state": None,
            "_iterator_finished": False,
        }
        if sampler_type is StatefulDistributedSampler:
            state["_sampler_iter_state"]["sampler_state"] = {"yielded": samples_done}
        restore = lambda: loader.load_state_dict(state)  # noqa: E731
    baseline = peak_rss_mb()
    start = time.perf_counter()
    restore()
    first = next(iter(loader))
    seconds = time.perf_counter() - start
    assert len(first) == BATCH_SIZE
    return {"seconds": seconds, "peak_mb": peak_rss_mb() - baseline}


def lightning_steps_per_second(variant: str, steps: int) -> float:
    """Steps per second after a warm-up; ``variant``: plain, plain+empty_callback, or lightning_resumable."""
    import lightning as L

    from lightning_resumable import ResumableDataCallback, ResumableDataModule

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch.float().unsqueeze(1)).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.001)

    class Plain(L.LightningDataModule):
        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(IndexDataset(100_000), batch_size=8, shuffle=True)

    class Resumable(ResumableDataModule, Plain):
        def train_dataloader(self) -> DataLoader[Any]:
            return super().train_dataloader()

    class Clock(L.Callback):
        warmup = 100

        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step == self.warmup:
                self.start = time.process_time()

        def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
            self.rate = (trainer.global_step - self.warmup) / (time.process_time() - self.start)

    clock = Clock()
    audit_dir = tempfile.mkdtemp(prefix="audit_")
    extra = {
        "plain": [],
        "plain+empty_callback": [L.Callback()],
        "lightning_resumable": [ResumableDataCallback()],
        "lightning_resumable+audit": [ResumableDataCallback(audit_dir=audit_dir)],
    }
    callbacks: list[L.Callback] = [clock, *extra[variant]]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), Resumable() if variant.startswith("lightning_resumable") else Plain())
    shutil.rmtree(audit_dir)
    return float(clock.rate)

"""Bring your own order: a batch sampler whose epoch is a pure function of (epoch, generator).

Promise: subclass `ResumableBatchSampler`, implement `epoch_batches`
(the epoch's batches for all ranks together, of any sizes, as in length bucketing), and return
``DataLoader(dataset, batch_sampler=YourSampler(...))`` from ``train_dataloader()``. The library
seeds the generator from (run seed, epoch), computes each epoch's batches once, splits them across
ranks as lhotse does (rank ``r`` takes batches ``r, r + W, ...``, so every rank runs the same number
of steps; the uneven tail is dropped with the loader's ``drop_last``, else padded with the first
batches), persists the global batch position, and resumes exactly, on any world size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

from lightning_resumable.core.draws import Draws
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.format._keys import batch_epoch_seed

__all__ = ["BatchDraws", "ResumableBatchSampler"]


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator an epoch's batches are drawn with: seeded from (seed, epoch) only."""
    return torch.Generator().manual_seed(batch_epoch_seed(seed, epoch))


class ResumableBatchSampler(Sampler[list[int]]):
    """Base class for a batch sampler whose epochs the library can split across ranks and resume.

    A subclass implements `epoch_batches`; its constructor calls ``super().__init__()``. Without
    a ``ResumableDataModule`` it iterates the batches of ``self.epoch`` (see `set_epoch`) with
    ``self.seed``, on one process.

    Example:
        ```python
        class ByLength(ResumableBatchSampler):
            def __init__(self, lengths, max_tokens):
                super().__init__()
                self.lengths, self.max_tokens = lengths, max_tokens

            def epoch_batches(self, epoch, generator):
                order = torch.randperm(len(self.lengths), generator=generator).tolist()
                ...  # group similar lengths into batches of at most max_tokens
                return batches
        ```
    """

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0
        self.seed = 0

    def epoch_batches(self, epoch: int, generator: torch.Generator) -> Sequence[Sequence[int]]:
        """The batches of ``epoch`` for all ranks together: a pure function of ``epoch`` and ``generator``."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement epoch_batches(epoch, generator)")

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch``'s batches next (used without a ``ResumableDataModule``)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.epoch_batches(self.epoch, epoch_generator(self.seed, self.epoch)):
            yield list(batch)

    def __len__(self) -> int:
        return len(self.epoch_batches(self.epoch, epoch_generator(self.seed, self.epoch)))


class BatchDraws(Draws):
    """The global stream of an epoch's batches, each position one batch; computed once per epoch."""

    def __init__(self, batch_sampler: ResumableBatchSampler, dataset_size: int) -> None:
        self.batch_sampler = batch_sampler
        self.dataset_size = dataset_size
        self._epoch: tuple[int, int, list[list[int]]] | None = None  # (seed, epoch, batches)

    def describe(self) -> str:
        return f"batch-sampler({type(self.batch_sampler).__qualname__})"

    def batches(self, seed: int, epoch: int) -> list[list[int]]:
        if self._epoch is None or self._epoch[:2] != (seed, epoch):
            drawn = self.batch_sampler.epoch_batches(epoch, epoch_generator(seed, epoch))
            batches = [[int(index) for index in batch] for batch in drawn]
            for batch in batches:
                if not batch or min(batch) < 0 or max(batch) >= self.dataset_size:
                    raise UnsupportedLoaderError(
                        f"{type(self.batch_sampler).__qualname__}.epoch_batches({epoch}) returned a batch that is"
                        f" empty or holds an index outside [0, {self.dataset_size}): {batch[:8]}"
                    )
            self._epoch = (seed, epoch, batches)
        return self._epoch[2]

    def epoch_length(self, seed: int, epoch: int) -> int:
        return len(self.batches(seed, epoch))

    def __call__(self, seed: int, epoch: int, positions: torch.Tensor) -> list[list[int]]:  # type: ignore[override]
        batches = self.batches(seed, epoch)
        return [batches[position] for position in positions.tolist()]

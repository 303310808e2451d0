"""A mixture of named map-style sources: what it holds, and where a mixture's index lies.

Promise: a `Mixture` checks its sources and weights when it is made (a malformed one is refused
before any batch), and maps its index (a source's offset plus the index in it) to the sample; the
order is its stream's (`lightning_resumable.core.mixture_stream`), which its sampler reads.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Mapping
from typing import Any

from torch.utils.data import Dataset

from lightning_resumable.core.chunks import Chunks, chunks_of
from lightning_resumable.core.mixture_stream import realise
from lightning_resumable.core.order import MAX_SIZE
from lightning_resumable.core.schedule import Weights, WeightSchedule
from lightning_resumable.errors import MixtureError

__all__ = ["Mixture"]


class Mixture(Dataset[Any]):
    """A mixture of named map-style datasets: each read without replacement, pass after pass, the
    sources interleaved so that every window of the stream holds them in proportion to their weights.

    Return it in a ``DataLoader`` from ``train_dataloader()`` as any dataset (the loader's sampler is
    the mixture's own; leave ``shuffle`` and ``sampler`` unset). With ``ResumableDataCallback`` a resume
    continues every source's pass exactly, on any number of processes and workers; the weights may
    follow a `WeightSchedule` or change at a resume, which then equals a run whose schedule changed
    there. A source may be added at a resume (it starts its first pass) or removed (its position is
    kept, to continue if it comes back); a source whose size changed is refused, by name.

    A source stored in chunks (LitData's or Mosaic's ``StreamingDataset``, a Hugging Face ``Dataset``, or
    any dataset wrapped in `Chunked`) is read chunk by chunk: each pass permutes its chunks and, within
    windows of a few chunks, its samples (`lightning_resumable.core.chunks`), so a reader holds a few
    chunks at a time, not a different chunk for nearly every sample.

    Args:
        sources: the datasets by name (each sized and indexable; a chunked one sized by its chunks).
        weights: a weight per source name (ratios count: ``{"web": 3, "code": 1}`` is 0.75/0.25), or a
            `WeightSchedule`. A weight of 0 leaves a source out.
        samples_per_epoch: samples (all ranks together) an epoch holds, rounded up to whole global
            batches; ``None``: the checkpoint's on a resume, else the sources' sizes added up.
        shuffle: read each pass of a source in a permuted order (else in the source's own order).

    Raises:
        MixtureError: no source, a source that is empty or not sized, malformed weights.

    Example:
        ```python
        mixture = Mixture({"web": web, "code": code}, {"web": 0.7, "code": 0.3})
        return DataLoader(mixture, batch_size=32, num_workers=4)
        ```
    """

    def __init__(
        self,
        sources: Mapping[str, Dataset[Any]],
        weights: Weights | WeightSchedule,
        *,
        samples_per_epoch: int | None = None,
        shuffle: bool = True,
    ) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise MixtureError(f"a Mixture needs its sources as a non-empty mapping by name, got {sources!r:.80}")
        sizes: list[int] = []
        self.chunks: dict[str, Chunks] = {}
        for name, dataset in sources.items():
            if not isinstance(name, str) or not name:
                raise MixtureError(f"a source's name must be a non-empty string, got {name!r}")
            chunks = chunks_of(dataset, name)
            if chunks is not None:  # sized by its chunks: a data library's len is one rank's share under DDP
                self.chunks[name] = chunks
            try:
                size = len(dataset) if chunks is None else chunks.total  # type: ignore[arg-type]
            except TypeError:
                raise MixtureError(f"the source {name!r} ({type(dataset).__name__}) has no length") from None
            if not 1 <= size <= MAX_SIZE:
                raise MixtureError(f"the source {name!r} must hold 1 to 2**40 samples, got {size}")
            sizes.append(size)
        if samples_per_epoch is not None and (type(samples_per_epoch) is not int or samples_per_epoch < 1):
            raise MixtureError(f"samples_per_epoch must be a positive int or None, got {samples_per_epoch!r}")
        self.sources = dict(sources)
        self.names, self.sizes = tuple(self.sources), tuple(sizes)
        self.schedule = weights if isinstance(weights, WeightSchedule) else WeightSchedule.constant(weights)
        unknown = self.schedule.names() - set(self.names)
        if unknown:
            raise MixtureError(f"the schedule gives weights for {sorted(unknown)}, which the mixture does not hold")
        realise(self.schedule.weights_at(0), self.names, "at the start")  # refused now, not at the first batch
        self.samples_per_epoch = samples_per_epoch
        self.shuffle = shuffle
        self.offsets = [0]
        for size in self.sizes[:-1]:
            self.offsets.append(self.offsets[-1] + size)

    def __len__(self) -> int:
        """The samples of an epoch (all ranks together), before rounding to whole global batches."""
        return self.samples_per_epoch if self.samples_per_epoch is not None else sum(self.sizes)

    def __getitem__(self, index: int) -> Any:
        """The sample at the mixture's ``index``: its source's offset plus the index in the source."""
        name, within = self.locate(int(index))
        return self.sources[name][within]

    def reading(self, readers: Mapping[str, Any]) -> Mixture:
        """A copy of this mixture whose sources are read by index through ``readers`` (by name)."""
        made = copy.copy(self)
        made.sources = {name: readers[name] for name in self.names}
        return made

    def locate(self, index: int) -> tuple[str, int]:
        """The source and the index in it of the mixture's ``index``."""
        if not 0 <= index < sum(self.sizes):
            raise IndexError(f"index {index} is outside the mixture's {sum(self.sizes)} samples")
        source = bisect.bisect_right(self.offsets, index) - 1
        return self.names[source], index - self.offsets[source]

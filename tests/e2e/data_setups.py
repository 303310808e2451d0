"""The train data an end-to-end scenario reads, one object per kind (``Scenario.data`` names it): what
the harness knows of it (the batches of an epoch, its label, whether the library reads it through its
own loader whichever loader class the user returned) and the sizes ``train.py`` builds it with
(``train.py``'s ``TRAIN_LOADERS`` holds how each is built). No torch here: the harness imports it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

STREAM_SIZE = 48
"""Samples of each stream: 8 shards of 6, so 2 ranks with 2 workers read 12 each."""
COMBINED_SIZES = (38, 14)
"""Samples of the two map-style loaders ``a`` and ``b`` of the ``combined`` and ``dict`` data (ids of
``b`` start at 1000)."""


@dataclass(frozen=True)
class MapStyle:
    """One map-style loader over ``scenario.dataset_size`` samples (the default)."""

    name: str = "map"
    own_loader: bool = False

    def batches_per_epoch(self, scenario: Any) -> int:
        """(``bucketing``'s epochs differ in length: not known here.)"""
        samples = scenario.dataset_size
        if scenario.sampler == "subset":  # train.subset_of: the indices not 1 modulo 3
            samples = sum(1 for index in range(samples) if index % 3 != 1)
        elif scenario.sampler == "num_samples":  # train.make_sampler
            samples += 13
        per_rank = math.ceil(samples / scenario.world_size)
        return per_rank // scenario.batch_size if scenario.drop_last else math.ceil(per_rank / scenario.batch_size)

    def label(self, scenario: Any) -> str:
        return self.name


@dataclass(frozen=True)
class Stream(MapStyle):
    """A stream of `STREAM_SIZE` samples (``size_factor``: the streams it chains, each once, as a
    multiple of one), sharded evenly over the ranks."""

    size_factor: float = 1.0

    def batches_per_epoch(self, scenario: Any) -> int:
        return int(STREAM_SIZE * self.size_factor) // scenario.world_size // scenario.batch_size


MIXTURE_OFFSETS = {"a": 0, "b": 1000, "c": 2000, "d": 3000}
"""The ids of each source a ``mixture`` scenario may hold start at these (source ``b``'s sample 5 is id 1005)."""
MIXTURE_SOURCES = (("a", 19), ("b", 11), ("c", 7))
"""The sources of a ``mixture`` scenario unless it says otherwise: name and size."""
MIXTURE_WEIGHTS = ((0, (("a", 5), ("b", 3), ("c", 2))),)
"""Its weights unless it says otherwise: ``(step, weights)`` changes, as a ``WeightSchedule`` takes them."""


@dataclass(frozen=True)
class MixtureData(MapStyle):
    """A ``Mixture`` of named sources (``scenario.mixture_sources``, ``mixture_weights``) of
    ``scenario.dataset_size`` samples an epoch, rounded up to whole global batches."""

    def batches_per_epoch(self, scenario: Any) -> int:
        return math.ceil(scenario.dataset_size / (scenario.batch_size * scenario.world_size))


@dataclass(frozen=True)
class CombinedAsMixture(MapStyle):
    """LitData's ``CombinedStreamingDataset(iterate_over_all=False)`` of ``scenario.mixture_sources``, read as
    a ``Mixture`` of their sizes added up an epoch, rounded up to whole global batches."""

    def batches_per_epoch(self, scenario: Any) -> int:
        samples = sum(size for _, size in scenario.mixture_sources)
        return math.ceil(samples / (scenario.batch_size * scenario.world_size))


@dataclass(frozen=True)
class Several(MapStyle):
    """Two map-style loaders (`COMBINED_SIZES`) in a ``CombinedLoader`` of ``scenario.mode``, or a dict."""

    def batches_per_epoch(self, scenario: Any) -> int:
        lengths = [math.ceil(math.ceil(size / scenario.world_size) / scenario.batch_size) for size in COMBINED_SIZES]
        return min(lengths) if scenario.mode == "min_size" else max(lengths)

    def label(self, scenario: Any) -> str:
        return f"{self.name}-{scenario.mode}" if self.name == "combined" else self.name


SETUPS = {
    setup.name: setup
    for setup in (
        MapStyle(),
        Stream("stream", own_loader=True),
        Stream("hf", own_loader=True),  # a Hugging Face IterableDataset
        Stream("hf-arrow", own_loader=True),  # the same read as Arrow tables: no map, torch-formatted
        Stream("hf-interleaved", own_loader=True),  # two Hugging Face streams interleaved, augmented after
        Stream("wds", own_loader=True),  # a WebDataset pipeline over tar shards
        Stream("mosaic", own_loader=True),
        Stream("litdata"),
        Stream("litdata-combined", size_factor=1.5),  # the stream and a second one of half its size
        Several("combined"),
        Several("dict"),
        MixtureData("mixture"),
        MixtureData("sharded-mixture"),  # LitData chunks, token blocks and Mosaic shards as sources
        CombinedAsMixture("litdata-weighted"),
    )
}

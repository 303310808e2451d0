"""A data library's dataset (LitData's, Mosaic's ``StreamingDataset``) read each sample under its own seed.

Promise: the library reads a sample by ``__getitem__`` with a key of its own; the dataset's class becomes a subclass
of its own whose ``__getitem__`` begins the sample (`lightning_resumable.core.randomness.begin_sample`) under a seed
keyed by (the run's seed, the library's epoch, the dataset's place among those combined, the sample's index), so its
draws are the same wherever and whenever it is read; a spawned worker unpickles the user's class, seeded again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_resumable.core.held_generators import HeldGenerators
from lightning_resumable.core.randomness import begin_sample, end_sample
from lightning_resumable.format._keys import stream_key, stream_sample_seed

__all__ = ["seed_each_sample"]


def seed_each_sample(
    dataset: Any,
    seed: int,
    epoch_of: Callable[[Any], int],
    index_of: Callable[[Any], int],
    stream: int = 0,
    seed_globals: bool = True,
) -> None:
    """Make a data library's ``dataset`` read each sample under its own seed, keyed by (``seed``, its
    epoch, ``stream``: the dataset's place among those a loader combines, the sample's index in the
    dataset): its class becomes a subclass of its own whose ``__getitem__`` wraps the user's.
    ``epoch_of(dataset)`` and ``index_of(key)`` read the library's epoch and ``__getitem__``'s key
    (module-level functions: a spawned worker unpickles them). ``seed_globals``: the global generators start from
    the sample's seed (the callback's ``seed_samples``); `sample_rng` answers either way.

    The global generators are not put back here: without workers, the library's loader puts the main
    process's back after each batch when asked (`BuildOptions`' ``restore_globals``).
    """
    base, held = type(dataset), HeldGenerators()
    last = [(-1, 0)]  # the last epoch read and its key (4 of a sample's 5 SplitMix64 steps), one tuple: read whole

    def __getitem__(self: Any, key: Any) -> Any:  # the dunder of the subclass
        try:
            epoch, epoch_key = last[0]
            if epoch != epoch_of(self):
                epoch = epoch_of(self)
                epoch_key = stream_key(seed, epoch, stream, 0)
                last[0] = epoch, epoch_key
            sample_seed = stream_sample_seed(epoch_key, index_of(key))
            begin_sample(sample_seed, seed_globals)
            if seed_globals:
                held.reseed(self, sample_seed)
            return base.__getitem__(self, key)
        finally:
            end_sample()

    def __reduce__(self: Any) -> tuple[Any, ...]:  # a spawned worker gets the user's class, seeded again
        plain = object.__new__(base)
        plain.__dict__.update(self.__dict__)
        return _seeded_again, (plain, seed, epoch_of, index_of, stream, seed_globals)

    members = {"__getitem__": __getitem__, "__reduce__": __reduce__, "__module__": base.__module__}
    dataset.__class__ = type(base.__name__, (base,), members)


def _seeded_again(
    dataset: Any,
    seed: int,
    epoch_of: Callable[[Any], int],
    index_of: Callable[[Any], int],
    stream: int,
    seed_globals: bool,
) -> Any:
    seed_each_sample(dataset, seed, epoch_of, index_of, stream, seed_globals)
    return dataset

"""Randomness that survives a restart: per-sample seeds for the data, per-step seeds for training.

Promise: a sample's random draws are a pure function of ``(seed, epoch, global position)``, and a
training step's are a pure function of ``(seed, epoch, batch index)``. Neither depends on
``num_workers``, worker id, rank, world size, persistent workers, prefetching, when an iterator was
created, or whether the run was interrupted. Nothing is persisted: the seeds are derived again.

- `sample_seeds` gives each position of an epoch its own 63-bit seed (vectorised, computed by
  the sampler together with the order).
- `SampleSeededDataset` wraps the user's dataset: before each sample is fetched it seeds the
  global generators that augmentation code draws from (torch's default CPU generator, Python's
  ``random``, NumPy's global ``RandomState``; the last two only while the dataset draws from them,
  `lightning_resumable.core.watched_globals`), and the generators the dataset and its transforms
  hold themselves (`lightning_resumable.core.held_generators`: albumentations' ``Compose``). In the
  main process (``num_workers=0``) it can restore their state after the batch, so fetching does
  not disturb the training step's stream; under Lightning that is needed only when the callback
  does not reseed each step, since each batch is fetched before ``on_train_batch_start``.
- `sample_rng` is the explicit API: a ``torch.Generator`` and a ``numpy.random.Generator`` of
  the sample being fetched, as Grain gives each record its own RNG.
- `seed_training_step` reseeds the global generators (and CUDA's, where initialised) at the
  start of each training step.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from lightning_resumable.core.held_generators import HeldGenerators
from lightning_resumable.core.order import position_hash
from lightning_resumable.core.watched_globals import WatchedGlobals, seed_generators
from lightning_resumable.errors import NotInSampleFetchError
from lightning_resumable.format._keys import (
    Domain,
    after_step_seed,
    explicit_generator_seed,
    step_seed,
)

__all__ = [
    "SampleKey",
    "SampleRng",
    "SampleSeededDataset",
    "sample_rng",
    "sample_seeds",
    "seed_global_generators",
    "seed_training_step",
    "step_seed",
]

SampleKey = tuple[int, int]
"""What the sampler hands to `SampleSeededDataset` per sample: ``(dataset index, sample seed)``."""


T_co = TypeVar("T_co", covariant=True)


# ------------------------------------------------------------------------------------------ seeds
def sample_seeds(seed: int, epoch: int, positions: torch.Tensor) -> torch.Tensor:
    """The seed of each global position of an epoch, as non-negative int64 values below 2**63.

    Within an epoch, positions below 2**32 get distinct low 32 bits, so no two samples of an epoch of
    up to 4B samples share torch's seed.
    """
    return position_hash(seed, epoch, positions, Domain.SAMPLE)


_PLACE_BITS = 20
"""A sample's key in a batch sampler's stream is ``batch position << 20 | place in the batch``."""


def keyed_batches(seed: int, epoch: int, batches: list[list[int]], positions: torch.Tensor) -> list[list[SampleKey]]:
    """Each sample of each batch (at stream ``positions``) with its seed, keyed by (batch position, place)."""
    places = [
        (position << _PLACE_BITS) + torch.arange(len(batch))
        for position, batch in zip(positions.tolist(), batches, strict=True)
    ]
    seeds = iter(sample_seeds(seed, epoch, torch.cat(places)).tolist())
    return [[(index, next(seeds)) for index in batch] for batch in batches]


def seed_global_generators(seed: int) -> None:
    """Seed torch's default CPU generator, Python's ``random`` and NumPy's global ``RandomState``.

    Each generator gets other bits of ``seed`` (torch uses 32 of them, NumPy's legacy seeding takes
    32), so their streams are not copies of one another. ``torch.manual_seed`` is not used: it also
    seeds every accelerator backend and costs about 100 times more.
    """
    seed_generators(seed)


def seed_training_step(seed: int, epoch: int, batch_index: int, ended: bool = False) -> None:
    """Reseed the generators a training step draws from (dropout, random layers), CUDA's included; with
    ``ended``, the ones what runs after it draws from (a validation's shuffle and augmentations), which a
    resume after that step seeds alike."""
    derived = (after_step_seed if ended else step_seed)(seed, epoch, batch_index)
    seed_global_generators(derived)
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.manual_seed(derived)


class GlobalGeneratorState:
    """A snapshot of the three global generators, to put back after a fetch in the main process."""

    def __init__(self) -> None:
        self.torch_state = torch.default_generator.get_state()
        self.python_state = random.getstate()
        self.numpy_state = np.random.get_state()

    def restore(self) -> None:
        torch.default_generator.set_state(self.torch_state)
        random.setstate(self.python_state)
        np.random.set_state(self.numpy_state)


@contextlib.contextmanager
def global_generators_kept() -> Iterator[None]:
    """Whatever runs inside leaves the global generators (torch's CPU and CUDA ones, ``random``, NumPy's)
    as it found them: a save fetches samples again in the main process to fingerprint them, and a run
    that checkpoints must draw what a run that does not draws."""
    kept = GlobalGeneratorState()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    cuda_states = torch.cuda.get_rng_state_all() if cuda else None
    try:
        yield
    finally:
        kept.restore()
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def begin_sample(seed: int, seed_globals: bool) -> None:
    """A sample's fetch begins: `sample_rng` answers for ``seed``, and with ``seed_globals`` the global
    generators start from it. With `end_sample` (in a ``finally``), the one writer of the current
    sample, for a map-style fetch and a stream's next sample alike; plain functions, not a context
    manager, which would add about 2 µs a sample."""
    global _current
    _current = seed
    if seed_globals:
        seed_global_generators(seed)


@contextlib.contextmanager
def inner_samples() -> Iterator[None]:
    """Samples read under their own `begin_sample` while another is fetched: its seed and generators kept."""
    global _current
    outer, kept = _current, GlobalGeneratorState()
    try:
        yield
    finally:
        kept.restore()
        _current = outer


def end_sample() -> None:
    """The sample's fetch has ended: `sample_rng` refuses until the next one begins."""
    global _current
    _current = None


# ------------------------------------------------------------------------------- the explicit API
class SampleRng:
    """The random generators of one sample: seeded from ``(seed, epoch, global position)``.

    ``torch`` and ``numpy`` are created on first use and kept for the rest of the sample's fetch, so
    successive draws continue one stream. They are independent of the global generators that
    `SampleSeededDataset` seeds for the same sample.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._torch: torch.Generator | None = None
        self._numpy: np.random.Generator | None = None

    @property
    def torch(self) -> torch.Generator:
        """A CPU ``torch.Generator`` for this sample."""
        if self._torch is None:
            self._torch = torch.Generator().manual_seed(explicit_generator_seed(self.seed, Domain.EXPLICIT_TORCH))
        return self._torch

    @property
    def numpy(self) -> np.random.Generator:
        """A ``numpy.random.Generator`` (Philox) for this sample."""
        if self._numpy is None:
            key = explicit_generator_seed(self.seed, Domain.EXPLICIT_NUMPY)
            self._numpy = np.random.Generator(np.random.Philox(key=key))
        return self._numpy


_current: SampleRng | int | None = None
"""The sample being fetched in this process: its seed, or its `SampleRng` once asked for."""


def sample_rng() -> SampleRng:
    """The generators of the sample being fetched; call it inside your dataset's ``__getitem__``.

    Example:
        ```python
        def __getitem__(self, index):
            rng = lightning_resumable.sample_rng()
            top, left = torch.randint(0, 32, (2,), generator=rng.torch).tolist()
            flip = rng.numpy.random() < 0.5
        ```

    Raises:
        NotInSampleFetchError: called outside a fetch by a loader that a ``ResumableDataModule`` built.
    """
    global _current
    if _current is None:
        raise NotInSampleFetchError(
            "sample_rng() was called outside a sample fetch: it works inside the __getitem__ of a dataset"
            " whose train loader a ResumableDataModule built"
        )
    if isinstance(_current, int):
        _current = SampleRng(_current)
    return _current


# ---------------------------------------------------------------------------- the dataset wrapper
_WATCHED_FROM = 4
"""Batches of this many samples or more seed Python's and NumPy's generators only while drawn from
(`lightning_resumable.core.watched_globals`: a batch's comparison costs what seeding 3 samples costs)."""


class SampleSeededDataset(Dataset[T_co], Generic[T_co]):
    """A pass-through wrapper that fetches each sample under its own seed.

    It takes `SampleKey` pairs ``(index, sample seed)`` from a
    `ResumableSampler` built with ``sample_keys=True``; any other index
    is passed to the wrapped dataset unchanged, unseeded. Attributes it does not have are read
    from the wrapped dataset, which is ``.dataset``.

    A batch is fetched sample by sample through ``__getitem__``, each under its own seed, even if the
    wrapped dataset defines ``__getitems__`` (PyTorch defines that as a faster equivalent).

    Args:
        dataset: the user's map-style dataset.
        seed_globals: seed the global generators before each sample. ``False`` keeps only
            `sample_rng` (whose seeds cost nothing until asked for).
        restore_globals: in the main process, put the global generators back after each batch (about
            70 µs a batch, mostly NumPy's state), so the fetch leaves the caller's stream as it was.
        collate_fn: for a sampler that yields whole batches (a list of keys per index, with the
            loader's ``batch_size=None``): the batch is fetched and collated here, in the worker.
    """

    def __init__(
        self,
        dataset: Dataset[T_co],
        seed_globals: bool = True,
        restore_globals: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        self.dataset = dataset
        self.seed_globals = seed_globals
        self.restore_globals = restore_globals
        self.collate_fn = collate_fn
        self.held = HeldGenerators()
        self.watched = WatchedGlobals()

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # map-style datasets are sized

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling): don't recurse
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key: SampleKey | list[SampleKey] | Any) -> Any:
        if isinstance(key, tuple):
            return self.fetch([key])[0]
        if isinstance(key, list) and self.collate_fn is not None:
            return self.collate_fn(self.fetch(key))  # a whole batch from a batch sampler's stream
        return self.dataset[key]  # a plain index (int, NumPy integer, ...): unseeded

    def __getitems__(self, keys: Sequence[SampleKey]) -> list[T_co]:
        return self.fetch(keys)

    def fetch(
        self, keys: Sequence[SampleKey], seed_globals: bool | None = None, restore_globals: bool | None = None
    ) -> list[T_co]:
        """The samples at ``keys``, each under its own seed (arguments override the wrapper's settings)."""
        seed_globals = self.seed_globals if seed_globals is None else seed_globals
        restore_globals = self.restore_globals if restore_globals is None else restore_globals
        in_main_process = get_worker_info() is None
        saved = GlobalGeneratorState() if seed_globals and restore_globals and in_main_process else None
        try:
            if not seed_globals:
                return [self._fetch_one(index, seed, seeded=False) for index, seed in keys]
            if len(keys) < _WATCHED_FROM:  # comparing their states would cost more than seeding them
                return [self._fetch_one(index, seed) for index, seed in keys]
            return self.watched.fetch(keys, self._fetch_one)  # Python's and NumPy's seeded while drawn from
        finally:
            end_sample()
            if saved is not None:
                saved.restore()

    def _fetch_one(self, index: int, seed: int, python: bool = True, numpy: bool = True, seeded: bool = True) -> T_co:
        begin_sample(seed, False)
        if seeded:
            seed_generators(seed, python, numpy)
            self.held.reseed(self.dataset, seed)
        return self.dataset[index]

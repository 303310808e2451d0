"""Python's and NumPy's global generators are seeded per sample only while the dataset draws from them.

Seeding both before every sample costs about 15 µs a sample inside a fetch (0.46 ms of a 1.0 ms batch
of 32 random crops, measured by ``benchmarks/step_overhead.py --cost``), taken from the training step
(on the same cores with workers, in its own thread without), and most datasets never draw from them
(torchvision v2, kornia and timm draw from torch's generator, which stays seeded before every sample).

Promise: every sample of a map-style fetch is what it would be with all three generators seeded
before it. A process's first batch seeds all three before each sample and watches which of Python's
and NumPy's each sample draws from. A generator no sample of it drew from is left alone from then on,
and its state is compared after each batch (about 30 µs a batch for Python's, 1 µs for NumPy's). A
sample that draws from none of them is the same whatever their state; a batch in which a sample drew
from one left alone is fetched again with every generator seeded, and that generator is seeded
before every sample from then on. So a dataset that draws from one only now and then has at most one
batch per process and generator fetched twice.

A draw from NumPy's legacy generator can return a normal value cached by the draw before, without
moving the state compared (Python's cached value is part of the state compared); so while NumPy's
is left alone it is seeded once at each batch's start, which clears the cache (in the main process
it holds the training step's state between batches).
"""

from __future__ import annotations

import ctypes
import os
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["WatchedGlobals", "seed_generators"]

_MASK32 = 0xFFFFFFFF
_MT19937_BYTES = 624 * 4 + 4
"""NumPy's MT19937 state struct: 624 32-bit words and the position in them."""

FetchOne = Callable[[int, int, bool, bool], Any]
"""``fetch_one(index, seed, python, numpy)``: one sample, fetched with torch's generator and the ones named seeded."""


def seed_generators(seed: int, python: bool = True, numpy: bool = True) -> None:
    """Seed torch's default CPU generator and, if asked, Python's ``random`` and NumPy's global
    ``RandomState``, each from other bits of ``seed`` (torch and NumPy take 32 of them)."""
    torch.default_generator.manual_seed(seed)
    if python:
        random.seed(seed)
    if numpy:
        np.random.seed((seed >> 32) & _MASK32)


def _numpy_state() -> bytes:
    """The global ``RandomState``'s generator state, read in about 1 µs (``get_state()`` takes 50)."""
    bits = np.random.get_bit_generator()  # type: ignore[attr-defined]  # public since NumPy 1.25, not in its stubs
    return ctypes.string_at(bits.ctypes.state_address, _MT19937_BYTES)


class WatchedGlobals:
    """Which of Python's and NumPy's global generators the samples fetched in this process draw from."""

    def __init__(self) -> None:
        self._pid = -1
        self.python: bool | None = None  # seeded before every sample; None: not known yet
        self.numpy: bool | None = None

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker watches its own dataset
        return {"_pid": -1, "python": None, "numpy": None}

    def fetch(self, keys: Sequence[tuple[int, int]], fetch_one: FetchOne) -> list[Any]:
        """The samples at ``keys``, each fetched by ``fetch_one``."""
        if self._pid != os.getpid():  # a new process (a forked worker): watch its first batch
            self._pid, self.python, self.numpy = os.getpid(), None, None
        if self.python is None or self.numpy is None:
            return self._first_batch(keys, fetch_one)
        python = None if self.python else random.getstate()
        numpy = None
        if not self.numpy and keys:
            np.random.seed(keys[0][1] & _MASK32)  # no cached normal value: every draw moves the state
            numpy = _numpy_state()
        samples = [fetch_one(index, seed, self.python, self.numpy) for index, seed in keys]
        drew_python = python is not None and random.getstate() != python
        drew_numpy = numpy is not None and _numpy_state() != numpy
        if not (drew_python or drew_numpy):
            return samples
        self.python, self.numpy = self.python or drew_python, self.numpy or drew_numpy
        return [fetch_one(index, seed, True, True) for index, seed in keys]  # as if both were seeded

    def _first_batch(self, keys: Sequence[tuple[int, int]], fetch_one: FetchOne) -> list[Any]:
        drew_python = drew_numpy = False
        samples = []
        for index, seed in keys:
            seed_generators(seed)  # fetch_one seeds them again: the same state, now known
            python, numpy = random.getstate(), _numpy_state()
            samples.append(fetch_one(index, seed, True, True))
            drew_python = drew_python or random.getstate() != python
            drew_numpy = drew_numpy or _numpy_state() != numpy
        self.python, self.numpy = drew_python, drew_numpy
        return samples

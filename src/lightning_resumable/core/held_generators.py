"""Random generators a dataset holds itself: reseeded at each sample, keyed by where they sit.

Promise: every ``torch.Generator``, ``numpy.random.Generator``, ``numpy.random.RandomState`` and
``random.Random`` reachable from a dataset (its attributes, its transforms', their containers, the
cells of its functions) draws, for each sample, from a seed that is a pure function of the sample's
seed and the generator's *path* (``dataset.transform.transforms[2].py_random``). So an augmentation
library that keeps generators of its own, as albumentations' ``Compose`` does (seeded once from
``seed`` or from entropy, then advanced by every sample a worker transforms), draws after a resume
what it drew uninterrupted, on any number of workers.

Generators are found by walking the dataset once per process before its first sample and again
before its second (a generator made at the first sample is found then). The walk is bounded: it
does not enter tensors, arrays, strings, modules, classes, nor containers of more than
`MAX_CONTAINER` items (a dataset's list of file names). A generator it cannot reach is not
reseeded: the self-check, which compares the batches the workers produced, refuses such a resume.
The global generators are not among them: they are seeded per sample already.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from lightning_resumable.format._keys import MASK64, held_generator_seed

__all__ = ["MAX_CONTAINER", "HeldGenerators", "find_generators"]

MAX_CONTAINER = 256
"""Containers with more items than this are not walked (they hold data, not transforms)."""
_MAX_DEPTH = 12
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.Tensor, np.ndarray, np.generic)
_SKIPPED = (types.ModuleType, type, types.BuiltinFunctionType, types.CodeType, types.FrameType)


def _is_generator(value: object) -> bool:
    return isinstance(value, (torch.Generator, np.random.Generator, np.random.RandomState, random.Random))


def _globals() -> set[int]:
    """The global generators' identities: `lightning_resumable.core.randomness` seeds those per sample."""
    return {id(torch.default_generator), id(random._inst), id(np.random.mtrand._rand)}


def _children(value: object) -> Iterator[tuple[str, object]]:
    """``(path suffix, child)`` of ``value``, in an order that a copy of it (a forked worker's) repeats."""
    if isinstance(value, dict):
        if len(value) <= MAX_CONTAINER:
            for key, child in value.items():
                yield f"[{key!r}]", child
        return
    if isinstance(value, (list, tuple)):
        if len(value) <= MAX_CONTAINER:
            for index, child in enumerate(value):
                yield f"[{index}]", child
        return
    if isinstance(value, (set, frozenset)):
        return  # no order a copy repeats
    if isinstance(value, functools.partial):
        yield ".func", value.func
        yield ".args", value.args
        yield ".keywords", value.keywords
        return
    if isinstance(value, types.MethodType):
        yield ".__self__", value.__self__
        return
    if isinstance(value, types.FunctionType):
        for name, cell in zip(value.__code__.co_freevars, value.__closure__ or (), strict=True):
            try:
                yield f".<{name}>", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        return
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        yield from ((f".{name}", child) for name, child in attributes.items())
    for name in getattr(type(value), "__slots__", ()):
        if isinstance(name, str) and name != "__dict__" and hasattr(value, name):
            yield f".{name}", getattr(value, name)


def find_generators(root: object, name: str = "dataset") -> list[tuple[str, Any]]:
    """``(path, generator)`` for each generator reachable from ``root`` (each once, at its first path)."""
    found: list[tuple[str, Any]] = []
    seen = _globals()
    stack: list[tuple[str, object, int]] = [(name, root, 0)]
    while stack:
        path, value, depth = stack.pop()
        if isinstance(value, (*_LEAVES, *_SKIPPED)) or id(value) in seen:
            continue
        seen.add(id(value))
        if _is_generator(value):
            found.append((path, value))
            continue
        if depth >= _MAX_DEPTH:
            continue
        children = [(path + suffix, child, depth + 1) for suffix, child in _children(value)]
        stack.extend(reversed(children))  # depth first, in attribute order
    return found


def _path_key(path: str) -> int:
    return int.from_bytes(hashlib.blake2b(path.encode(), digest_size=8).digest(), "little")


def _reseed(generator: Any, seed: int) -> None:
    """Put ``generator`` in place at the start of the stream of ``seed`` (a 64-bit value)."""
    if isinstance(generator, torch.Generator):
        generator.manual_seed(seed)
    elif isinstance(generator, random.Random):
        generator.seed(seed)
    elif isinstance(generator, np.random.RandomState):
        generator.seed(seed & 0xFFFFFFFF)
    else:
        bits = generator.bit_generator
        if isinstance(bits, np.random.PCG64):  # albumentations' and default_rng's: set directly, 1 µs
            second = held_generator_seed(seed, 1)
            state = {"state": (seed << 64) | second, "inc": ((second << 64) | seed) | 1}
            bits.state = {"bit_generator": "PCG64", "state": state, "has_uint32": 0, "uinteger": 0}  # type: ignore[typeddict-item]
        else:
            bits.state = type(bits)(seed).state


class HeldGenerators:
    """The generators one dataset holds, found in this process, reseeded for each sample."""

    def __init__(self, name: str = "dataset") -> None:
        self.name = name
        self._found: list[tuple[int, Any]] = []
        self._pid = -1
        self._walks = 0

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker walks its own copy
        return {"name": self.name, "_found": [], "_pid": -1, "_walks": 0}

    def paths(self, root: object) -> list[str]:
        """Where ``root``'s generators sit (for the docs and errors)."""
        return [path for path, _ in find_generators(root, self.name)]

    def reseed(self, root: object, sample_seed: int) -> None:
        """Reseed every generator ``root`` holds for the sample of ``sample_seed``."""
        pid = os.getpid()
        if pid != self._pid:  # a new process (a forked worker): walk again, before its first two samples
            self._pid, self._walks = pid, 0
        if self._walks < 2:
            self._walks += 1
            self._found = [(_path_key(path), value) for path, value in find_generators(root, self.name)]
        for key, generator in self._found:
            _reseed(generator, held_generator_seed(sample_seed, key) & MASK64)

"""The generators a dataset holds: found by path, reseeded per sample, the same in a copy (a worker's)."""

from __future__ import annotations

import functools
import os
import pickle
import random
from typing import Any

import numpy as np
import torch

from lightning_resumable.core.held_generators import MAX_CONTAINER, HeldGenerators, find_generators


def draws(generator: Any) -> list[float]:
    if isinstance(generator, torch.Generator):
        return torch.rand(3, generator=generator).tolist()
    if isinstance(generator, random.Random):
        return [generator.random() for _ in range(3)]
    return list(generator.random(3))


class Transform:
    def __init__(self) -> None:
        self.rng = np.random.default_rng()  # from entropy, as an unseeded Compose's
        self.py_random = random.Random()


def make_holder() -> Any:
    holder = type("Holder", (), {})()
    holder.torch = torch.Generator().manual_seed(7)
    holder.transforms = [Transform(), Transform()]
    holder.by_name = {"philox": np.random.Generator(np.random.Philox(3)), "legacy": np.random.RandomState(4)}
    own = random.Random(5)
    holder.function = lambda: own.random()
    holder.partial = functools.partial(print, np.random.default_rng(6))
    holder.shared = holder.transforms[0].rng  # the same object again: found once, at its first path
    holder.globals = [torch.default_generator, random._inst, np.random.mtrand._rand]  # type: ignore[attr-defined]
    holder.data = [np.random.default_rng(8) for _ in range(MAX_CONTAINER + 1)]  # data, not transforms
    return holder


def test_every_generator_is_found_once_at_its_first_path_and_the_globals_are_not() -> None:
    paths = [path for path, _ in find_generators(make_holder())]
    assert paths == [
        "dataset.torch",
        "dataset.transforms[0].rng",
        "dataset.transforms[0].py_random",
        "dataset.transforms[1].rng",
        "dataset.transforms[1].py_random",
        "dataset.by_name['philox']",
        "dataset.by_name['legacy']",
        "dataset.function.<own>",
        "dataset.partial.args[0]",
    ]


def test_a_forked_worker_reseeded_for_a_sample_draws_what_the_main_process_draws() -> None:
    """Whatever the worker's copies drew before (other samples), a sample draws the same there."""
    holder = make_holder()
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: its copies have transformed other samples since the fork
        try:
            for _, generator in find_generators(holder):
                draws(generator)
            HeldGenerators().reseed(holder, 1234)
            os.write(writing, pickle.dumps([draws(generator) for _, generator in find_generators(holder)]))
        finally:
            os._exit(0)  # a forked test process: no pytest teardown in the child
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        theirs = pickle.loads(pipe.read())
    os.waitpid(pid, 0)
    HeldGenerators().reseed(holder, 1234)
    ours = [draws(generator) for _, generator in find_generators(holder)]
    assert ours == theirs
    assert len({tuple(each) for each in ours}) == len(ours), "each path draws a stream of its own"


def test_another_sample_draws_other_values_and_the_same_sample_the_same_again() -> None:
    holder, held = make_holder(), HeldGenerators()
    found = find_generators(holder)
    held.reseed(holder, 1)
    first = [draws(generator) for _, generator in found]
    held.reseed(holder, 2)
    second = [draws(generator) for _, generator in found]
    held.reseed(holder, 1)
    again = [draws(generator) for _, generator in found]
    assert first == again
    assert all(a != b for a, b in zip(first, second, strict=True))


def test_a_generator_made_at_the_first_sample_is_found_before_the_second() -> None:
    class Lazy:
        rng: np.random.Generator | None = None

        def sample(self) -> float:
            if self.rng is None:
                self.rng = np.random.default_rng()
            return float(self.rng.random())

    lazy, held = Lazy(), HeldGenerators()
    held.reseed(lazy, 1)
    lazy.sample()
    held.reseed(lazy, 2)
    value = lazy.sample()
    held.reseed(lazy, 2)
    assert lazy.sample() == value

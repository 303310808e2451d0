"""Chains over layouts (issue 55): a run interrupted one to three times, each resume on a layout drawn anew (world
size, batch size, workers, workers kept from pass to pass), for a stream whose order is one global sequence on every
layout (MosaicML Streaming's). Judged epoch by epoch against the uninterrupted run of the first layout: wherever both
have trained as many of the epoch's samples, the same ones, each with its augmentation (`matrix.regrouping_problems`).

A leg's stop is drawn where it can be: Lightning counts a resumed epoch's batches on from the checkpoint's, so the
places of a leg are computed from the samples consumed before it and its own global batch (`places`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

from .chains import Leg, run_chain
from .harness import Runner, Scenario
from .matrix import global_steps, regrouping_problems

MOSAIC_SAMPLES = 48
"""The samples of an epoch of the Mosaic shards the end-to-end runs read (`train.write_mosaic`)."""

MOSAIC_CHAIN_SEEDS = (6, 12)
"""The chains CI's extras step runs: 6 goes 2 x 8 -> 2 x 2 (1 worker) -> 1 x 2 -> 2 x 6 (2 workers), stopped in the
first epoch, then twice in the second (in a validation); 12 goes 2 x 4 with 2 workers kept -> 1 x 2 -> 1 x 2 -> 2 x 4,
stopped at the second epoch's end, then twice in the third."""


@dataclass(frozen=True)
class Layout:
    world_size: int
    batch_size: int
    num_workers: int
    persistent_workers: bool

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size

    def config(self) -> tuple[tuple[str, object], ...]:
        """What a leg's config sets for this layout (the Mosaic fixture takes ``given_batch_size`` as it is)."""
        return (("given_batch_size", self.batch_size), ("persistent_workers", self.persistent_workers))


def _draw_layout(draw: random.Random) -> Layout:
    workers = draw.choice((0, 1, 2))
    return Layout(draw.choice((1, 2)), draw.choice((2, 4, 6, 8)), workers, bool(workers) and draw.random() < 0.3)


def places(epoch: int, done: int, consumed: int, layout: Layout, epochs: int) -> list[tuple[int, int, bool]]:
    """Where a leg on ``layout`` that starts ``done`` batches (``consumed`` samples) into ``epoch`` may stop:
    (epoch, batch, the epoch's last), in Lightning's count (a resumed epoch counts its batches on from the
    checkpoint's, then the rest's in this layout's global batches)."""
    found = []
    for each in range(epoch, epochs):
        start, rest = (done, MOSAIC_SAMPLES - consumed) if each == epoch else (0, MOSAIC_SAMPLES)
        length = start + math.ceil(rest / layout.global_batch)
        found += [(each, batch, batch == length - 1) for batch in range(start, length)]
    return found


def draw_mosaic_chain(seed: int) -> tuple[Scenario, list[Leg], list[Layout]]:
    """A Mosaic chain: the first layout, one to three stops each resumed on a layout drawn anew, and the last leg."""
    draw = random.Random(seed * 6151 + 55)
    layouts = [_draw_layout(draw)]
    first = layouts[0]
    scenario = Scenario(
        world_size=first.world_size,
        batch_size=first.batch_size,
        num_workers=first.num_workers,
        persistent_workers=first.persistent_workers,
        loader=draw.choice(("StreamingDataLoader", "DataLoader")),
        data="mosaic",
        epochs=draw.choice((2, 3)),
    )
    legs: list[Leg] = []
    epoch, done, consumed = 0, 0, 0
    for _ in range(draw.randint(1, 3)):
        layout = layouts[-1]
        kind = draw.choice(("batch_end", "batch_end", "last_batch", "validation"))
        candidates = [
            (each, batch, last)
            for each, batch, last in places(epoch, done, consumed, layout, scenario.epochs)
            if (last and each < scenario.epochs - 1) == (kind == "last_batch")
            and (kind != "validation" or (batch + 1) % 2 == 0)
        ]
        if not candidates:
            continue
        stop_epoch, stop_batch, last = draw.choice(candidates[:8])
        legs.append(_leg(kind, stop_epoch, stop_batch, layout))
        if last:  # the next leg begins the next epoch
            epoch, done, consumed = stop_epoch + 1, 0, 0
        else:  # it goes on inside the stop's epoch, from the samples consumed in it
            before, start = (consumed, done) if stop_epoch == epoch else (0, 0)
            epoch, done, consumed = stop_epoch, stop_batch + 1, before + (stop_batch + 1 - start) * layout.global_batch
        layouts.append(_draw_layout(draw))
    legs.append(_leg("end", -1, -1, layouts[-1]))
    return scenario, legs, layouts


def _leg(kind: str, epoch: int, batch: int, layout: Layout) -> Leg:
    return Leg(kind, epoch, batch, num_workers=layout.num_workers, world_size=layout.world_size, config=layout.config())


def described(layouts: list[Layout]) -> str:
    return " -> ".join(
        f"{each.world_size}x{each.batch_size} w{each.num_workers}{'k' if each.persistent_workers else ''}"
        for each in layouts
    )


def mosaic_chain_problems(runner: Runner, scenario: Scenario, legs: list[Leg], run_dir: Path) -> list[str]:
    """Each epoch of the chain against the uninterrupted run of the first layout (`regrouping_problems`)."""
    steps, _ = run_chain(run_dir, scenario, legs)
    chain, full = global_steps(steps), global_steps(runner.full(replace(scenario, resume_world_size=None)))
    problems = []
    for epoch in range(scenario.epochs):
        want = [pairs for (each, _), pairs in sorted(full.items()) if each == epoch]
        trained = [pairs for (each, _), pairs in sorted(chain.items()) if each == epoch]
        problems += regrouping_problems(want, trained, f"epoch {epoch}")
    return problems

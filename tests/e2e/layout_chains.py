"""Chains over layouts (issue 55): a run interrupted one to three times, each resume on a layout drawn anew (world
size, batch size, workers, workers kept from pass to pass), for the data libraries' loaders that resume anywhere.

- MosaicML Streaming's order is one global sequence on every layout: each epoch is judged against the uninterrupted
  run of the first layout; wherever both have trained as many of the epoch's samples, the same ones, each with its
  augmentation (`matrix.regrouping_problems`).
- LitData's epoch goes on in the order of the layout that began it, wherever it resumes: each epoch is judged against
  a fresh run of that layout, in global order (a last uneven global batch padded with its own samples), each
  sample with its augmentation.

A leg's stop is drawn where it can be: Lightning counts a resumed epoch's batches on from the checkpoint's, so the
places of a leg are computed from the samples consumed before it and its own global batch (`places`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .chains import Leg, run_chain
from .harness import Records, Runner, Scenario, augmentation_by_id
from .matrix import epoch_sequence, global_steps, regrouping_problems

MOSAIC_SAMPLES = 48
"""The samples of an epoch of the Mosaic shards the end-to-end runs read (`train.write_mosaic`)."""

MOSAIC_CHAIN_SEEDS = (6, 12, 356720985)
"""The chains CI's extras step runs: 6 goes 2 x 8 -> 2 x 2 (1 worker) -> 1 x 2 -> 2 x 6 (2 workers), stopped in the
first epoch, then twice in the second (in a validation); 12 goes 2 x 4 with 2 workers kept -> 1 x 2 -> 1 x 2 -> 2 x 4,
stopped at the second epoch's end, then twice in the third; 356720985 (a soak's) 2 x 8 -> 1 x 6, stopped at the
first epoch's last batch (3 batches of 16, where the new layout's epoch has 8: the next epoch's start was taken for
the saved epoch's 4th batch and refused)."""


@dataclass(frozen=True)
class Layout:
    world_size: int
    batch_size: int
    num_workers: int
    persistent_workers: bool

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size

    @property
    def laid_out(self) -> tuple[int, int, int]:
        """What LitData's state is written for: a resume on another goes on elsewhere (kept workers do not count)."""
        return self.world_size, self.num_workers, self.batch_size

    def config(self) -> tuple[tuple[str, object], ...]:
        """What a leg's config sets for this layout (the Mosaic fixture takes ``given_batch_size`` as it is)."""
        return (("given_batch_size", self.batch_size), ("persistent_workers", self.persistent_workers))


def _draw_layout(draw: random.Random, most_workers: int = 2) -> Layout:
    workers = draw.choice(range(most_workers + 1))
    return Layout(draw.choice((1, 2)), draw.choice((2, 4, 6, 8)), workers, bool(workers) and draw.random() < 0.3)


def _first_run(draw: random.Random, first: Layout, data: str) -> Scenario:
    """The chain's run on its first layout: the library's loader or a torch one over its dataset (a WebDataset
    pipeline shuffled through a buffer: a torch loader or torchdata's), 2 or 3 epochs."""
    own = "StreamingDataLoader" if data == "litdata" else "StatefulDataLoader"
    return Scenario(
        world_size=first.world_size,
        batch_size=first.batch_size,
        num_workers=first.num_workers,
        persistent_workers=first.persistent_workers,
        loader=draw.choice((own, "DataLoader")),
        data=data,
        epochs=draw.choice((2, 3)),
        shuffle_buffer=STREAM_REFERENCES[data].shuffle_buffer if data in STREAM_REFERENCES else 0,
    )


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
    scenario = _first_run(draw, layouts[0], "mosaic")
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


# ------------------------------------------------------------------------------------------------------------ LitData
Plans = Callable[[Layout, int], list[list[list[int]]]]
"""Each rank's batches of sample ids in an epoch (the trainer's count) on a layout, as LitData's loader reads them."""

LITDATA_CHAIN_SEEDS = (2, 10)
"""The LitData chains CI's extras step runs: 2 goes 1 x 2 with 2 workers kept -> 1 x 4 with 1 (the first epoch goes
on in the first layout's order, the second is this layout's) -> 1 x 2 with 2 -> 2 x 8 with 1, stopped twice inside
the second epoch (once in a validation); 10 goes 1 x 6 -> 1 x 4 (2 workers), stopped at the end of the epoch it
continued, -> 2 x 6 with 2 workers kept."""


def litdata_plans(directory: Path) -> Plans:
    """`Plans` of the LitData chunks in ``directory`` (`lightning_resumable.internals._litdata_plan.planned_batches`,
    tested equal to LitData's own loader), without reading a sample."""
    from lightning_resumable.internals._litdata_plan import planned_batches

    from .train import litdata_stream

    dataset, found = litdata_stream(directory), {}

    def plans(layout: Layout, epoch: int) -> list[list[list[int]]]:
        key = (layout.world_size, layout.num_workers, layout.batch_size, epoch)
        if key not in found:
            found[key] = [
                [
                    [index for _, index in batch]
                    for batch in planned_batches(
                        dataset,
                        world_size=layout.world_size,
                        rank=rank,
                        num_workers=layout.num_workers,
                        batch_size=layout.batch_size,
                        epoch=epoch + 1,  # LitData counts from 1
                    )
                ]
                for rank in range(layout.world_size)
            ]
        return found[key]

    return plans


@dataclass(frozen=True)
class LitDataChain:
    scenario: Scenario
    legs: list[Leg]
    layouts: list[Layout]
    began: dict[int, Layout]
    """The layout that began each epoch, whose order it goes on in wherever it resumes."""
    ended: dict[int, Layout]
    """The layout that trained each epoch's last batch (its last global batch padded on it)."""


def _trained(plans: list[list[list[int]]], batches: int) -> int:
    return sum(len(batch) for plan in plans for batch in plan[:batches])


DECLARED_AFTER = frozenset({2, 10, 643001853})
"""The chains over layouts CI ran before a declared order was drawn (`LITDATA_CHAIN_SEEDS`, `WEB_LAYOUT_CHAIN_SEEDS`,
`HF_LAYOUT_CHAIN_SEEDS`): they keep theirs."""

WEB_LAYOUT_CHAIN_SEEDS = (2, 643001853, 182497043)
"""The WebDataset chains CI runs (drawn as LitData's: the same layouts and legs' kinds); 2 goes 1 x 2 with 2 workers
kept -> 1 x 4 with 1 -> 1 x 2 with 2 -> 2 x 8 with 1, stopped in the first epoch and twice in the second (once in a
validation); 643001853 (a soak's) goes
1 x 2 -> 2 x 6 with 1 worker, stopped in the epoch's last global batch, -> 2 x 6 again: the padding of that batch,
taken from the rest's first samples, differed on the second resume and its recorded next batch was refused;
182497043 (a soak's) goes 1 x 1 with batches of 4, saved at the first epoch's last batch, -> 2 x 2 with batches of 6,
workers kept, saved after the second epoch's first batch -> 1 x 1: the kept worker that had not yielded in that epoch
was saved with its last pass's place and count, and the resume was refused."""

HF_LAYOUT_CHAIN_SEEDS = (2, 5)
"""The Hugging Face chains CI runs (drawn as LitData's): 2 goes 1 x 2 with 2 workers kept -> 1 x 4 with 1 -> 1 x 2
with 2 -> 2 x 8 with 1, stopped in the first epoch and twice in the second; 5's stream declares its first layout's
order, and the epochs begun on the other layouts are read in it (it fails without the declared order)."""

STREAM_REFERENCES = {
    "wds": Scenario(world_size=1, data="wds", shuffle_buffer=5, epochs=3),
    "hf": Scenario(world_size=1, data="hf", shuffle_buffer=8, epochs=3),
}
"""The fresh runs a chain of a WebDataset pipeline or a Hugging Face stream is placed and judged by, on each layout:
its order depends neither on the loader class (both are read as torchdata's) nor on the epochs after."""


def stream_plans(runner: Runner, data: str) -> Plans:
    """`Plans` of the stream ``data`` the runs read (`STREAM_REFERENCES`): each layout's fresh run's batches (the
    chain's judge runs the same ones)."""

    def plans(layout: Layout, epoch: int) -> list[list[list[int]]]:
        records = _fresh(runner, STREAM_REFERENCES[data], layout)
        return [[record["ids"] for record in records[rank] if record["epoch"] == epoch] for rank in sorted(records)]

    return plans


def draw_litdata_chain(seed: int, plans: Plans, data: str = "litdata") -> LitDataChain:
    """A chain of a loader whose epoch goes on in the order that began it (LitData's, or a WebDataset pipeline's:
    ``data``): where a leg may stop follows from the layouts' plans (a fresh epoch's length is its longest rank's;
    an epoch going on elsewhere counts its batches on from the checkpoint's, then the rest's in this layout's
    global batches)."""
    draw = random.Random(seed * 6151 + 56)
    layouts = [_draw_layout(draw, most_workers=3)]
    first = layouts[0]
    scenario = _first_run(draw, first, data)
    # Issue 55: the dataset declares the first layout's order (every epoch read in it on any layout); salted, and not
    # for CI's seeds, which keep their chains.
    declared = random.Random(seed * 6151 + 57).random() < 0.5 and seed not in DECLARED_AFTER
    if declared:
        scenario = scenario.declaring_its_order()
    legs: list[Leg] = []
    began, ended = {0: first}, {}
    epoch, done, position, elsewhere, saver = 0, 0, 0, False, first
    for _ in range(draw.randint(1, 3)):
        layout = layouts[-1]
        if done and (elsewhere or layout.laid_out != saver.laid_out):  # the epoch goes on in its first layout's order
            elsewhere = True
        places = []  # (epoch, batch, the epoch's last, the samples of its global sequence trained after it)
        for each in range(epoch, scenario.epochs):
            in_order = declared and layout.laid_out != first.laid_out  # an epoch read in the declared order here
            if (each == epoch and elsewhere) or in_order:
                begun = done if each == epoch else 0
                at = position if each == epoch else 0
                total = sum(len(batch) for plan in plans(began.get(each, first), each) for batch in plan)
                length = begun + math.ceil((total - at) / layout.global_batch)
                after = [min(total, at + (batch + 1 - begun) * layout.global_batch) for batch in range(length)]
            else:
                own = plans(began[each] if each == epoch and done else layout, each)  # begun before, or here
                length = max(map(len, own))
                after = [_trained(own, batch + 1) for batch in range(length)]
            start = done if each == epoch else 0
            places += [(each, batch, batch == length - 1, after[batch]) for batch in range(start, length)]
        kind = draw.choice(("batch_end", "batch_end", "last_batch", "validation"))
        candidates = [
            place
            for place in places
            if (place[2] and place[0] < scenario.epochs - 1) == (kind == "last_batch")
            and (kind != "validation" or (place[1] + 1) % 2 == 0)
        ]
        if not candidates:
            continue
        stop_epoch, stop_batch, last, trained = draw.choice(candidates[:8])
        legs.append(_leg(kind, stop_epoch, stop_batch, layout))
        for each in range(epoch + (1 if done else 0), stop_epoch + 1):
            began.setdefault(each, first if declared else layout)
        for each in range(epoch, stop_epoch if not last else stop_epoch + 1):
            ended.setdefault(each, layout)
        if last:
            epoch, done, position, elsewhere = stop_epoch + 1, 0, 0, False
        else:
            elsewhere = elsewhere and stop_epoch == epoch
            epoch, done, position = stop_epoch, stop_batch + 1, trained
        saver = layout
        layouts.append(_draw_layout(draw, most_workers=3))
    legs.append(_leg("end", -1, -1, layouts[-1]))
    for each in range(scenario.epochs):
        began.setdefault(each, first if declared else layouts[-1])
        ended.setdefault(each, layouts[-1])
    return LitDataChain(scenario, legs, layouts, began, ended)


def litdata_chain_problems(runner: Runner, chain: LitDataChain, run_dir: Path) -> list[str]:
    """Each epoch of the chain against a fresh run of the layout that began it: its global order, then at most a
    global batch of the last layout's padding, from its own samples; each sample augmented as there."""
    steps, _ = run_chain(run_dir, chain.scenario, chain.legs)
    problems = []
    reference = STREAM_REFERENCES.get(chain.scenario.data, chain.scenario)
    for epoch in range(chain.scenario.epochs):
        origin = chain.began[epoch]
        fresh = _fresh(runner, reference, origin)
        expected, trained = epoch_sequence(fresh, epoch), epoch_sequence(steps, epoch)
        padding = trained[len(expected) :]
        if trained[: len(expected)] != expected or len(padding) >= chain.ended[epoch].global_batch:
            problems.append(f"epoch {epoch}: trained {trained}, not {expected} (+ padding)")
        elif set(padding) - set(expected):
            problems.append(f"epoch {epoch}: padding {padding} not of its own samples")
        problems += _augmentation_problems(fresh, steps, epoch)
    return problems


def _fresh(runner: Runner, scenario: Scenario, layout: Layout) -> Records:
    return runner.full(
        replace(
            scenario,
            world_size=layout.world_size,
            batch_size=layout.batch_size,
            num_workers=layout.num_workers,
            persistent_workers=layout.persistent_workers,
        )
    )


def _augmentation_problems(fresh: Records, steps: Records, epoch: int) -> list[str]:
    expected = augmentation_by_id(fresh, epoch=epoch)
    for sample, values in augmentation_by_id(steps, epoch=epoch).items():
        if sample in expected and any(value != expected[sample][0] for value in values):
            return [f"epoch {epoch}: sample {sample} augmented {values}, not {expected[sample][0]}"]
    return []

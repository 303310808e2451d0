"""The workflow matrix's cases (`draw_case`, `draw_chain`: a pure function of one integer seed) and how a
case is judged (`case_problems`, `chain_problems`): shared by `test_workflow_matrix.py` and `shrink.py`."""

from __future__ import annotations

import collections
import math
import os
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .chains import (
    CI_SEEDS,
    LIBRARY_PREEMPTION_SEEDS,
    LIBRARY_PREEMPTIONS_ON_ONE_ALLOCATION,
    LIBRARY_SEEDS,
    Leg,
    run_chain,
)
from .harness import (
    WITH_PARAMETERS,
    Outcome,
    Records,
    Runner,
    Scenario,
    augmentation_by_id,
    data_after_epoch,
    global_order,
    ids_in_epoch,
    locked,
    run_phase,
    stream_order,
)
from .preemption import PREEMPTION_WHENS, Preemption
from .train import WDS_FORMS, WDS_REFUSED

STREAMS = ("stream", "hf", "hf-interleaved", "wds")
"""The streams `draw_case` draws: a user's stateful stream, a Hugging Face stream and a WebDataset pipeline, both
shuffled through a buffer (a WebDataset case is skipped where webdataset is not installed: CI's extras step runs
`WEB_DATASET_SEEDS`)."""

_SAMPLERS = ("shuffle", "shuffle", "weighted", "replacement", "num_samples", "subset", "bucketing")


def draw_case(seed: int) -> tuple[Scenario, Scenario]:
    """The case of ``seed``: the scenario to stop and resume, and the one whose uninterrupted run it must
    equal (itself, or for a mixture whose weights change at the resume, the schedule changed there)."""
    draw = random.Random(seed)
    world_size = draw.choice((1, 2, 2))
    data = draw.choice(("map", "map", "map", "stream", "mixture", "combined", "dict"))
    workers = draw.choice((0, 0, 1, 2, 2, 3))
    fields: dict[str, object] = dict(world_size=world_size, num_workers=workers, data=data, epochs=2)
    stop_kinds = ["batch_end", "batch_end", "last_batch", "in_step", "validation"]
    if data == "map":
        sampler = draw.choice(_SAMPLERS)
        fields.update(
            sampler=sampler,
            loader=draw.choice(("DataLoader", "DataLoader", "StatefulDataLoader"))
            if sampler != "bucketing"
            else "DataLoader",
            shuffle=draw.random() < 0.8,
            drop_last=sampler == "shuffle" and draw.random() < 0.3,
        )
        if world_size == 2 and sampler == "shuffle" and draw.random() < 0.25:
            fields.update(strategy="model_parallel", loader="DataLoader")
        if draw.random() < 0.3:
            fields["estimated_stepping_batches"] = True
        if fields.get("strategy") is None and sampler == "shuffle" and draw.random() < 0.3:
            fields["accumulate"] = 2
    elif data == "stream":
        fields["loader"] = draw.choice(("DataLoader", "StatefulDataLoader"))
        stop_kinds.remove("in_step")  # a stream's batch re-run inside a step: covered in test_streams_and_loaders
    elif data == "combined":
        fields["mode"] = draw.choice(("max_size_cycle", "max_size", "min_size"))
    scenario = Scenario(**fields)  # type: ignore[arg-type]
    stop_kind = draw.choice(stop_kinds)
    if scenario.accumulate > 1:
        stop_kind = "batch_end"
    # Stopped in the first epoch, or in the second of three (an epoch's last batch: never the run's last).
    scenario = replace(
        scenario, stop_kind=stop_kind, stop_epoch=draw.choice((0, 1)), epochs=3 if draw.random() < 0.3 else 2
    )
    if scenario.stop_epoch == scenario.epochs - 1 and scenario.stop_batch >= scenario.batches_per_epoch - 1:
        scenario = replace(scenario, epochs=3)  # a stop at the run's very end would resume nothing
    if (scenario.stop_kind, scenario.stop_epoch, scenario.stop_batch) == ("in_step", 0, 0):
        scenario = replace(scenario, stop_epoch=1)  # a stop inside the first step trains nothing before it (soak)
    if scenario.accumulate > 1:  # a save at an accumulation boundary (batch index odd)
        scenario = replace(scenario, stop_batch_override=1 if scenario.batches_per_epoch > 2 else None)
    if data in ("map", "mixture", "combined", "dict") and draw.random() < 0.4:
        scenario = replace(scenario, resume_num_workers=draw.choice((0, 1, 2, 3)))
    if draw.random() < 0.3:
        scenario = replace(scenario, evaluate_before_resume=True)
    if draw.random() < 0.4:
        scenario = replace(scenario, extra_saves_every=draw.choice((1, 2, 3)))
    reference = scenario
    if data == "mixture" and draw.random() < 0.5:
        shifted = (("a", draw.randint(1, 4)), ("b", draw.randint(1, 4)), ("c", draw.randint(1, 4)))
        scenario = replace(scenario, resume_mixture_weights=((0, shifted),))
        stop_step = scenario.stop_epoch * scenario.batches_per_epoch + scenario.stop_batch
        if scenario.stop_kind != "in_step":
            stop_step += 1  # the batch the checkpoint was written after is trained
        reference = replace(
            scenario, resume_mixture_weights=None, mixture_weights=(*scenario.mixture_weights, (stop_step, shifted))
        )
    # Drawn last, so that the draws above stay each seed's (a fixed seed keeps its case).
    if data == "mixture" and draw.random() < 0.4:  # the same sources listed in another order: taken by name
        scenario = replace(scenario, resume_mixture_sources=tuple(reversed(scenario.mixture_sources)))
    if draw.random() < 0.15:  # the step's randomness not reseeded: saves must still change nothing before the stop
        options = (("seed_steps", False),)
        scenario = replace(scenario, callback_options=options, extra_saves_every=scenario.extra_saves_every or 1)
        reference = replace(reference, callback_options=options)
    # Added with the soak of issue 35 (after the draws above, which stay each seed's).
    both: dict[str, object] = {"val_loader": draw.choice(("plain", "plain", "shuffled", "batch_sampler"))}
    if scenario.accumulate == 1 and scenario.strategy == "ddp" and draw.random() < 0.2:
        both["manual_optimization"] = True
    if data in ("map", "mixture", "combined", "dict") and scenario.batches_per_epoch > 5 and draw.random() < 0.2:
        both["limit_train_batches"] = draw.choice((4, 5))  # a validation (every 2 batches) ends the 4-batch epoch
    scenario, reference = replace(scenario, **both), replace(reference, **both)  # type: ignore[arg-type]
    if scenario.stop_epoch == scenario.epochs - 1 and scenario.stop_batch >= scenario.batches_per_epoch - 1:
        scenario, reference = replace(scenario, epochs=3), replace(reference, epochs=3)
    elastic = data == "map" and scenario.sampler == "shuffle" and not scenario.drop_last
    elastic = elastic and scenario.strategy == "ddp" and scenario.accumulate == 1 and not scenario.callback_options
    if elastic and scenario.limit_train_batches is None and draw.random() < 0.6:
        scenario = replace(scenario, resume_world_size=3 - scenario.world_size)  # 2 -> 1 or 1 -> 2 (docs: elastic)
    # Issue 37: weights the training sets from its per-source losses (and in validations), drawn apart so every
    # other draw stays each seed's; the salt keeps the fixed mixture seeds (1, 3, 9, 116022219) as they were.
    # Without a change of the weights or the workers at the resume (a change's step is a function of the
    # read-ahead); a mixture is not drawn elastic here (the one-process resume: test_online_mixing.py).
    # Not with seed_steps=False (issue 45): the weights follow the losses, which a restart does not keep without
    # seeded steps (documented), so the ids after the resume are not the uninterrupted run's either.
    online = random.Random(seed * 104729 + 19)
    losses_kept = ("seed_steps", False) not in scenario.callback_options
    if data == "mixture" and online.random() < 0.5 and not scenario.manual_optimization and losses_kept:
        both = {"online_mixing": online.choice((2, 3)), "online_in_validation": online.random() < 0.5}
        scenario = replace(scenario, resume_mixture_weights=None, resume_num_workers=None, **both)  # type: ignore[arg-type]
        reference = replace(scenario, resume_mixture_sources=None)
    # Issue 46: a stream shuffled through a buffer (a Hugging Face stream's), drawn apart (salted) for the same reason.
    buffered = random.Random(seed * 7561 + 46)
    if data == "stream" and buffered.random() < 0.5:
        shuffled = {"data": "hf", "shuffle_buffer": buffered.choice((3, 5, 8, 16))}
        scenario, reference = replace(scenario, **shuffled), replace(reference, **shuffled)  # type: ignore[arg-type]
    if scenario.data == "stream" and random.Random(seed * 7561 + 47).random() < 0.4:
        shuffled = {"data": "wds", "shuffle_buffer": buffered.choice((1, 3, 5, 8, 16))}
        scenario, reference = replace(scenario, **shuffled), replace(reference, **shuffled)  # type: ignore[arg-type]
    # Issue 53: a WebDataset pipeline in each form the docs list as exact (batched by the loader, or in the
    # pipeline after or before its shuffle, in a WebLoader), or with a stage they list as refused (a case only:
    # `_as_one_run` takes it out of chains and preemptions). Salted: the draws above stay each seed's.
    staged = random.Random(seed * 7561 + 6206)  # (salt: the WebDataset chain seeds keep their form)
    if scenario.data == "wds":
        pipeline = {"wds_form": staged.choice(WDS_FORMS)}
        refusable = [name for name in WDS_REFUSED if name != "no_node_splitter" or scenario.world_size > 1]
        if staged.random() < 0.25:
            pipeline = {"wds_refused": staged.choice(refusable)}
        scenario, reference = replace(scenario, **pipeline), replace(reference, **pipeline)  # type: ignore[arg-type]
    # Issue 55: workers kept from pass to pass (Lightning's advice), for a map-style loader and every stream kind;
    # salted, and not for the CI seeds chosen before it (`PERSISTENT_AFTER`), which keep their cases.
    kept = random.Random(seed * 7561 + 55).random() < 0.3 and seed not in PERSISTENT_AFTER
    if kept and scenario.data in ("map", "hf", "wds", "stream") and scenario.num_workers and not scenario.wds_form:
        scenario, reference = replace(scenario, persistent_workers=True), replace(reference, persistent_workers=True)
    # ... and for a mixture and several loaders (salted apart, so the kinds above keep their draws; not for the seeds
    # CI ran before).
    kept = random.Random(seed * 7561 + 5555).random() < 0.3 and seed not in MIXTURE_KEPT_AFTER
    if kept and scenario.data in ("mixture", "combined", "dict") and scenario.num_workers:
        scenario, reference = replace(scenario, persistent_workers=True), replace(reference, persistent_workers=True)
    # Issue 55: another batch size at the resume (a ramp, or a batch that fits another GPU) for a map-style loader (on
    # the same or another world size) and a mixture whose schedule stays; salted, and not for the seeds CI ran
    # before it (`RESIZED_AFTER`), which keep their cases.
    resized = random.Random(seed * 7561 + 5502)
    mixture = scenario.data == "mixture" and not (scenario.resume_mixture_weights or scenario.online_mixing)
    mixture = mixture and scenario.resume_world_size is None
    eligible = (mixture or elastic) and not scenario.limit_train_batches  # a limited epoch ends at another position
    if resized.random() < 0.3 and seed not in RESIZED_AFTER and eligible:
        new_size = resized.choice(tuple(size for size in (2, 3, 6, 8) if size != scenario.batch_size))
        scenario = replace(scenario, resume_batch_size=new_size)
        reference = replace(reference, resume_batch_size=new_size)
    # Issue 55: a WebDataset pipeline or a Hugging Face stream requeued on another allocation: world size, workers,
    # batch size (a pipeline batched in itself keeps its batches), each or together; salted, and not for the seeds CI
    # ran before.
    moved = random.Random(seed * 7561 + 5508)
    anywhere = scenario.data in ("wds", "hf") and not scenario.wds_refused and seed not in MIXTURE_KEPT_AFTER
    if anywhere and moved.random() < 0.5:
        if moved.random() < 0.5:
            scenario = replace(scenario, resume_world_size=3 - scenario.world_size)
        if moved.random() < 0.5:
            scenario = replace(scenario, resume_num_workers=moved.choice((0, 1, 2, 3)))
        if scenario.wds_form:
            scenario = replace(scenario, resume_batch_size=scenario.batch_size)
        elif moved.random() < 0.4 or (scenario.resume_world_size, scenario.resume_num_workers) == (None, None):
            scenario = replace(scenario, resume_batch_size=moved.choice((2, 6, 8)))
        # ... whose stream declares the first launch's layout as its order: every epoch read in it (salted; not for
        # the moved seeds CI ran before, `ORDER_AFTER`).
        if random.Random(seed * 7561 + 5510).random() < 0.5 and seed not in ORDER_AFTER:
            scenario = scenario.declaring_its_order()
            reference = replace(reference, stream_order=scenario.stream_order)
    # A Hugging Face stream of two interleaved (`interleave_datasets`), every other draw the same; salted, and not for
    # the seeds CI ran before (`INTERLEAVED_AFTER`).
    if scenario.data == "hf" and random.Random(seed * 7561 + 5512).random() < 0.3 and seed not in INTERLEAVED_AFTER:
        scenario, reference = replace(scenario, data="hf-interleaved"), replace(reference, data="hf-interleaved")
    method = _start_method(seed, scenario)
    return replace(scenario, start_method=method), replace(reference, start_method=method)


INTERLEAVED_AFTER = frozenset({27, 46, 150, 321, 750, 2154, 5883, 2000098, 2000227, 44860491})
"""The CI seeds (every matrix's) that draw a Hugging Face stream: they keep theirs, not interleaved."""

ORDER_AFTER = frozenset({878811239, 2000227, 226075957, 2000098})
"""The moved WebDataset and Hugging Face cases and preemptions CI ran before a stream's declared order was drawn: they
keep theirs."""

RESIZED_AFTER = frozenset({*CI_SEEDS, 19, 22, 917980412, 73})
"""The workflow cases CI ran before batch sizes were drawn (`CI_SEEDS`, `chains.CASE_SEEDS`): they keep their cases."""

PERSISTENT_AFTER = frozenset({
    0, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 14, 16, 18, 19, 20, 21, 22, 25, 27, 33, 40, 46, 47, 49, 54, 61, 66, 73, 76,
    80, 88, 91, 97, 102, 148, 174, 177, 200, 223, 257, 265, 321, 326, 368, 477, 518, 585, 750, 753, 964, 1313,
    1390, 1688, 2154, 3123, 44860491, 66741773, 100132691, 182055219, 257594569, 496079945, 558353263, 609549163,
    685662175, 757704568, 854942050, 917980412,
})  # fmt: skip
"""Every CI seed of the matrices (workflow, preemption, data libraries, WebDataset), drawn before workers kept from
pass to pass were (`draw_case`): their cases stay as they were run."""

MIXTURE_KEPT_AFTER = PERSISTENT_AFTER | {1574, 1117}
"""The CI seeds drawn before a mixture's or a data library's workers were kept from pass to pass: they keep their
cases."""


START_METHODS = ("fork", "fork", "fork", "forkserver", "default:forkserver", "default:forkserver")
"""How the loader workers of a drawn run start (issue 54; `train.use_start_method`): fork, Python 3.11-3.13's
default; forkserver given to each loader, or as the process default, Python 3.14's (twice as often: every 3.14
user's); one draw in ten spawn (`SPAWNED`), whose every worker imports torch and Lightning anew (seconds each)."""
SPAWNED = ("spawn", "default:spawn")


FORK_IN_CI = frozenset({
    5, 20, 18, 47, 223, 518, 2154, 44860491, 182055219, 685662175, 100132691, 757704568,  # workflow cases and chains
    22, 27, 49, 66, 88, 97, 102, 148, 4, 40,  # preemptions, LitData's and Mosaic's among them
    964, 3123,  # WebDataset chains
})  # fmt: skip
"""CI seeds chosen for another axis before the start method was drawn, kept on fork: a run whose workers are not
forked costs 3 to 10 times a forked one (spawn: every worker imports torch and Lightning; forkserver: each rank's
server does), and CI's time is bounded. Each start method has CI seeds of its own, that draw it: workflow cases 8
and 73, chains 8 and 1390, preemptions 7, 321 and 753, the data libraries' 2, 7 and 200, WebDataset chains 54 and 265,
its preemption 257 (and `tests/e2e/test_start_methods.py` in the newest-Python step). (Those in this set were run
with their drawn method in issue 54's sessions and passed; a soak draws fresh seeds, which this set does not touch.)"""


def _start_method(seed: int, scenario: Scenario) -> str:
    """The start method ``seed`` draws for ``scenario``, salted: every other draw stays each seed's."""
    if seed in FORK_IN_CI:
        return "fork"
    draw = random.Random(seed * 7561 + 54)
    method = draw.choice(START_METHODS)
    if draw.random() < 0.1:
        method = draw.choice(SPAWNED)
    return method if scenario.num_workers or scenario.val_workers or scenario.resume_num_workers else "fork"


def draw_chain(seed: int) -> tuple[Scenario, list[Leg]]:
    """A run interrupted one to four times (`chains.Leg`), the case's setup drawn as `draw_case` draws it.

    Each leg ends at a point after the one before; ``early`` (a checkpoint of ``validate()``) only comes
    first; a stream keeps its ``num_workers`` (another is refused, as documented) and is not interrupted
    by ``KeyboardInterrupt`` on two processes (its checkpoint from an exception path is refused there);
    with gradient accumulation every save is at an accumulation boundary.
    """
    base, _ = draw_case(seed)
    draw = random.Random(seed * 7919 + 1)
    scenario = _as_one_run(base, epochs=draw.choice((2, 3)), extra_saves_every=draw.choice((0, 2, 3)))
    per_epoch = scenario.batches_per_epoch if scenario.sampler != "bucketing" else 4  # its shortest epoch has more
    kinds = ["batch_end", "last_batch", "in_step", "validation", "sigterm", "interrupt", "extend"]
    if scenario.data in STREAMS:
        kinds.remove("in_step")
        kinds.remove("extend")  # OPEN (soak of issue 35): a stream's finished fit extended after a resume
        if scenario.world_size > 1:
            kinds.remove("interrupt")
    if scenario.extra_saves_every and (scenario.accumulate == 1 or scenario.online_mixing):
        kinds.append("kill")  # (with accumulation the online runs save once per optimizer step, at its end)
    if scenario.sampler == "bucketing":  # epochs of different lengths: no leg at an epoch's end
        kinds = [kind for kind in kinds if kind not in ("last_batch", "extend")]
    steps = [(epoch, batch) for epoch in range(scenario.epochs) for batch in range(per_epoch)]
    legs: list[Leg] = []
    # Not under FSDP2: Lightning 2.6's ModelParallelStrategy cannot load a full checkpoint of an optimizer that has
    # not stepped (IndexError in _rekey_optimizer_state_if_needed; found by the second soak, seed 318055189).
    if draw.random() < 0.15 and scenario.strategy == "ddp":
        legs.append(Leg("early"))
    cursor = 0  # the index in ``steps`` from which the next leg may end
    for _ in range(draw.randint(1, 4)):
        kind = draw.choice(kinds)
        places = [index for index in range(cursor, len(steps) - 1) if _fits(kind, *steps[index], scenario)]
        if kind == "kill":  # a periodic save must come first in the same leg
            places = [
                index for index in places if index - cursor + 1 >= scenario.extra_saves_every * scenario.accumulate
            ]
        if not places:
            continue
        index = draw.choice(places[:8])
        epoch, batch = steps[index]
        keep_workers = scenario.data in STREAMS or scenario.online_mixing  # the read-ahead sets a change's step
        workers = scenario.num_workers if keep_workers else draw.choice((0, 1, 2, 3))
        legs.append(Leg(kind, epoch, batch if kind != "extend" else -1, workers))
        cursor = (epoch + 1) * per_epoch if kind in ("extend", "last_batch") else index + 1
    keep_workers = scenario.data in STREAMS or scenario.online_mixing
    legs.append(Leg("end", num_workers=scenario.num_workers if keep_workers else draw.choice((0, 1, 2))))
    resized = random.Random(seed * 7561 + 5314).random() < 0.6 and _resizable(scenario, legs)
    scenario, legs = _with_skip(seed, scenario, legs, per_epoch, resized)
    any_workers = scenario.num_workers or scenario.val_workers or any(leg.num_workers for leg in legs)
    return replace(
        scenario, start_method=_start_method(seed, replace(scenario, num_workers=int(bool(any_workers))))
    ), legs


SKIPPABLE = ("map", "mixture", "stream", "hf", "hf-interleaved", "wds")
"""The train inputs whose data a chain's skipped steps pass over (issue 47): not several loaders (refused)."""


def _resizable(scenario: Scenario, legs: list[Leg]) -> bool:
    """Whether the chain's last leg may resume on another world size with a skip given there (issue 53): a map-style
    loader that resumes on any world size (the shuffle sampler, a batch sampler) or a mixture, after a stop."""
    sampler = scenario.data == "map" and scenario.sampler in ("shuffle", "bucketing") and not scenario.drop_last
    plain = scenario.strategy == "ddp" and scenario.accumulate == 1 and scenario.limit_train_batches is None
    data = sampler or (scenario.data == "mixture" and not scenario.online_mixing)
    stops = [leg for leg in legs if leg.kind not in ("early", "end")]
    # A batch sampler's epochs differ in length, which the skip's draw (`_with_skip`) does not know: its steps are
    # counted from the start of the first epoch, so its stops stay there (seed 986256000, 2 -> 1, stopped in epoch 1).
    counted = scenario.sampler != "bucketing" or all(leg.epoch == 0 for leg in stops)
    return data and plain and counted and bool(stops)


def _with_skip(
    seed: int, scenario: Scenario, legs: list[Leg], per_epoch: int, resized: bool = False
) -> tuple[Scenario, list[Leg]]:
    """A third of the chains skip a range of steps after the last leg's save (so every leg ends where it was drawn,
    in an epoch the skip has not shortened yet), given from a leg drawn among them (its first: from the start;
    a later one: at a resume) and kept by the legs after it; the uninterrupted run is given it from the start.
    A salted draw: a seed's legs and setup are what they were before skips were drawn.

    ``resized`` (issue 53): the last leg resumes on the other world size (2 -> 1, 1 -> 2) and is given the skip,
    always drawn, named in the steps of the world size that saved (`chain_problems` compares the chain with the
    same one given the skip from its first leg); a batch sampler's epochs differ in length: its ranges are short."""
    draw = random.Random(seed * 7561 + 4701)
    skips = draw.random() < 1 / 3 or resized
    if not skips or scenario.data not in SKIPPABLE or (scenario.sampler == "bucketing" and not resized):
        return scenario, legs
    if scenario.online_mixing:  # a change asked before a resume that skips where it takes effect: docs/long-runs.md
        return scenario, legs
    per_step = scenario.accumulate
    steps_per_epoch = -(-per_epoch // per_step)
    stops = [leg for leg in legs if leg.kind not in ("early", "end")]
    last = max(
        (leg.epoch * steps_per_epoch + (leg.batch + 1 if leg.batch >= 0 else per_epoch) // per_step for leg in stops),
        default=0,
    )
    total = scenario.epochs * steps_per_epoch
    first = last + 1 + draw.randint(0, 3)
    length = draw.randint(1, 4 if scenario.sampler != "bucketing" else 2)
    if first + length >= total:
        return scenario, legs
    if scenario.data != "mixture":  # an epoch the skip shortens keeps val_check_interval's 2 batches (Lightning's)
        # A step is ``per_step`` batches, an epoch's last one what is left (soak seed 221947257: 5 batches in steps
        # of 2 and a skip of two steps kept 1 batch, which the count of steps took for 2).
        kept = [
            sum(
                min(per_step, per_epoch - (step - epoch * steps_per_epoch) * per_step)
                for step in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
                if not first <= step < first + length
            )
            for epoch in range(scenario.epochs)
        ]
        if min(kept) < 2:
            return scenario, legs
    skip = ("skip_steps", f"{first}-{first + length - 1}")
    given = draw.randrange(len(legs))  # the leg from which it is given: the first, or one that resumes
    if resized:
        given = len(legs) - 1
        legs[-1] = replace(legs[-1], world_size=3 - scenario.world_size)
    options = [skip]
    legs = [
        replace(leg, config=(("callback_options", options if index >= given else []),))
        for index, leg in enumerate(legs)
    ]
    return replace(scenario, callback_options=(skip,)), legs


def _as_one_run(scenario: Scenario, **changed: object) -> Scenario:
    """``scenario`` without where it stops or what changes at its resume: a run whose interruptions are drawn
    apart (a chain's legs, a preemption) and that resumes on the same setup; and ``changed``."""
    return replace(
        scenario,
        stop_kind="batch_end",
        stop_epoch=1,
        stop_batch_override=None,
        resume_num_workers=None,
        resume_mixture_weights=None,
        resume_mixture_sources=None,
        resume_world_size=None,
        callback_options=(),
        wds_refused="",  # a refused stage ends every run before its first step: a case's (`refused_problems`)
        stream_order=None,  # drawn with a resume on another layout, a case's (`ordered_mismatches`)
        **changed,  # type: ignore[arg-type]
    )


def _fits(kind: str, epoch: int, batch: int, scenario: Scenario) -> bool:
    """Whether a leg of ``kind`` can end at ``batch`` of ``epoch`` (its save at an accumulation boundary)."""
    last = batch == scenario.batches_per_epoch - 1
    if kind in ("last_batch", "extend"):
        return last and epoch < scenario.epochs - 1
    if last:
        return False  # the epoch's end has kinds of its own
    window = scenario.accumulate
    if kind == "validation":
        return (batch + 1) % 2 == 0  # val_check_interval=2
    if kind in ("in_step", "interrupt"):  # saved inside the step: the batches before it are done
        return batch > 0 and batch % window == 0
    return (batch + 1) % window == 0


def elastic_mismatches(runner: Runner, outcome: Outcome) -> list[str]:
    """What docs/guarantees.md promises of a resume on another world size ("Elastic resume"): the interrupted
    epoch trains each remaining sample once (plus DistributedSampler's padding on the new size), each with its
    uninterrupted augmentation; the later epochs read what a fresh run on the new size reads. Before the stop,
    the run is the uninterrupted one."""
    scenario, stopped, resumed = outcome.scenario, outcome.stopped, outcome.resumed
    new_size, epoch = scenario.resume_world_size, scenario.stop_epoch
    assert new_size is not None
    problems = stopped_mismatches(outcome.full, stopped)
    before, after = ids_in_epoch(stopped, epoch), ids_in_epoch(resumed, epoch)
    remaining = scenario.dataset_size - len(before)
    padding = math.ceil(remaining / new_size) * new_size - remaining
    if set(before + after) != set(range(scenario.dataset_size)) or len(after) != remaining + padding:
        problems.append(f"epoch {epoch}: trained {sorted(before + after)}, not each sample once (+{padding} padding)")
    return problems + augmented_and_later_problems(runner, outcome, new_size, scenario.batch_size)


def epoch_sequence(records: Records, epoch: int) -> list[int]:
    """The epoch's samples in global order: step after step, rank after rank in a step."""
    steps: dict[int, list[tuple[int, list[int]]]] = {}
    for rank, rank_records in records.items():
        for record in rank_records:
            if record["epoch"] == epoch:
                steps.setdefault(record["batch"], []).append((rank, record["ids"]))
    return [sample for batch in sorted(steps) for _, ids in sorted(steps[batch]) for sample in ids]


def elsewhere_mismatches(runner: Runner, outcome: Outcome) -> list[str]:
    """What docs/litdata.md promises of LitData's loader resumed on another layout (world size, workers, batch size):
    the interrupted epoch goes on in the global order the first layout would have trained it (a last uneven global
    batch padded with its own samples), each sample with its augmentation; the next epochs are a fresh run's of the
    new layout (or, for a stream that declares its order, `ordered_mismatches`)."""
    if outcome.scenario.stream_order is not None:
        return ordered_mismatches(outcome)
    scenario, full, stopped, resumed = outcome.scenario, outcome.full, outcome.stopped, outcome.resumed
    epoch, world_size = scenario.stop_epoch, scenario.resume_world_size or scenario.world_size
    batch_size = scenario.resume_batch_size or scenario.batch_size * scenario.world_size // world_size
    workers = scenario.num_workers if scenario.resume_num_workers is None else scenario.resume_num_workers
    layout = {"world_size": world_size, "batch_size": batch_size, "num_workers": workers}
    fresh = runner.full(
        replace(scenario, **layout, resume_world_size=None, resume_num_workers=None, resume_batch_size=None)  # type: ignore[arg-type]
    )
    # An epoch of which nothing was trained before the checkpoint (a save in the fit's setup) is the new layout's own.
    began_here = not epoch_sequence(stopped, epoch)
    expected = epoch_sequence(fresh if began_here else full, epoch)
    trained = epoch_sequence(stopped, epoch) + epoch_sequence(resumed, epoch)
    problems = []
    padding = trained[len(expected) :]
    if trained[: len(expected)] != expected or len(padding) >= world_size * batch_size or set(padding) - set(expected):
        problems.append(f"epoch {epoch}: trained {trained}, not {expected} (+ padding)")
    problems += _augmentation_mismatch(fresh if began_here else full, stopped, resumed, epoch)

    def later(records: Records) -> dict[int, list[tuple[Any, ...]]]:
        kept = ("epoch", "batch", "ids", "aug")
        return {rank: [tuple(r[k] for k in kept) for r in rs if r["epoch"] > epoch] for rank, rs in records.items()}

    if later(resumed) != later(fresh) or (scenario.epochs > epoch + 1 and not any(later(resumed).values())):
        problems.append(f"the epochs after {epoch} are not a fresh run's on {layout}")
    return problems


def ordered_mismatches(outcome: Outcome) -> list[str]:
    """What docs/streams-and-loaders.md promises of a stream that declares the first launch's layout as its order
    (``resumable_stream_order``), resumed on another layout: the interrupted epoch and every later one is the
    uninterrupted run's global sequence of that epoch (each epoch's last uneven global batch padded with its own
    samples), each sample with its augmentation."""
    scenario, full, stopped, resumed = outcome.scenario, outcome.full, outcome.stopped, outcome.resumed
    world_size = scenario.resume_world_size or scenario.world_size
    batch_size = scenario.resume_batch_size or scenario.batch_size * scenario.world_size // world_size
    # The sequence's items: samples, or a pipeline's batches (a step's record each, whatever its size).
    global_batch = world_size if scenario.wds_form else world_size * batch_size
    problems = []
    for epoch in range(scenario.stop_epoch, scenario.epochs):
        expected, before = _epoch_items(full, epoch, scenario), _epoch_items(stopped, epoch, scenario)
        trained = before + _epoch_items(resumed, epoch, scenario)
        rest = expected[len(before) :]  # dealt in the resumed layout's global batches from the checkpoint on
        own = len(rest) % global_batch or global_batch
        padding = (rest[len(rest) - own :] * global_batch)[: -len(rest) % global_batch]
        if not expected or trained != expected + padding:
            problems.append(f"epoch {epoch}: trained {trained}, not {expected} + padding {padding}")
        problems += _augmentation_mismatch(full, stopped, resumed, epoch)
    return problems


def _augmentation_mismatch(reference: Records, stopped: Records, resumed: Records, epoch: int) -> list[str]:
    """The first sample of ``epoch`` the stopped or resumed run augmented otherwise than ``reference`` did, if any."""
    augmented = augmentation_by_id(reference, epoch=epoch)
    for sample, values in augmentation_by_id(stopped, resumed, epoch=epoch).items():
        if any(value != augmented[sample][0] for value in values):
            return [f"epoch {epoch}: sample {sample} augmented {values}, not {augmented[sample][0]}"]
    return []


def _epoch_items(records: Records, epoch: int, scenario: Scenario) -> list[Any]:
    """The epoch's items in global order: its samples, or (a pipeline batched in itself) its batches' ids."""
    if not scenario.wds_form:
        return epoch_sequence(records, epoch)
    steps = [(r["batch"], rank, tuple(r["ids"])) for rank, rs in records.items() for r in rs if r["epoch"] == epoch]
    return [ids for _, _, ids in sorted(steps)]


def global_batch_mismatches(outcome: Outcome) -> list[str]:
    """What docs/mosaic.md promises of a resume on another world size at the same global batch: every step trains the
    samples (with their augmentations) that all ranks of the uninterrupted run trained together at that step, and
    the run has its steps (losses differ: each rank averages other samples)."""
    full, trained = global_steps(outcome.full), global_steps(outcome.stopped, outcome.resumed)
    problems = [
        f"step {step}: trained {trained.get(step)}, not {want}"
        for step, want in full.items()
        if trained.get(step) != want
    ]
    extra = sorted(set(trained) - set(full))
    return problems[:3] + ([f"steps {extra[:5]} the uninterrupted run has not"] if extra else [])


def regrouped_mismatches(runner: Runner, outcome: Outcome) -> list[str]:
    """What docs/mosaic.md promises of a resume on another global batch (another batch size, on the same or another
    world size): the interrupted epoch goes on through the uninterrupted run's global sequence from the checkpoint's
    count, regrouped in the new global batches: wherever both runs have trained the same number of its samples since
    the stop, they have trained the same samples, each with its augmentation; the epoch holds them all; the next epochs
    are a fresh run's of the new layout."""
    scenario, epoch = outcome.scenario, outcome.scenario.stop_epoch
    world_size = scenario.resume_world_size or scenario.world_size
    batch_size = scenario.resume_batch_size or scenario.batch_size * scenario.world_size // world_size
    resumed = {batch: pairs for (e, batch), pairs in global_steps(outcome.resumed).items() if e == epoch}
    if not resumed:  # stopped at the epoch's last batch: the stopped run trained it whole
        whole = {step: pairs for step, pairs in global_steps(outcome.full).items() if step[0] == epoch}
        stopped = {step: pairs for step, pairs in global_steps(outcome.stopped).items() if step[0] == epoch}
        ended = [] if stopped == whole else [f"epoch {epoch}: the resumed run trained none of it, the stopped not all"]
        return ended + augmented_and_later_problems(runner, outcome, world_size, batch_size)
    first = min(resumed)
    full = [pairs for (e, batch), pairs in sorted(global_steps(outcome.full).items()) if e == epoch and batch >= first]
    problems = regrouping_problems(full, [pairs for _, pairs in sorted(resumed.items())], f"epoch {epoch}", first)
    return problems + augmented_and_later_problems(runner, outcome, world_size, batch_size)


def regrouping_problems(full: list[list[Any]], regrouped: list[list[Any]], where: str, first: int = 0) -> list[str]:
    """Whether ``regrouped`` (global steps of another size, each a list of what all ranks trained) goes through the
    same sequence as ``full``: wherever both have trained as many samples, the same ones; and as many in all."""
    problems: list[str] = []
    before: collections.Counter[str] = collections.Counter()
    after: collections.Counter[str] = collections.Counter()
    steps, common = iter(full), 0
    for step, pairs in enumerate(regrouped):
        after.update(repr(pair) for pair in pairs)  # (id, augmentation) pairs
        while before.total() < after.total():
            taken = next(steps, None)
            if taken is None:
                break
            before.update(repr(pair) for pair in taken)
        if before.total() == after.total():
            common += 1
            if before != after:
                problems.append(f"{where}: after step {first + step} of the resumed run, its samples differ")
                break
    if sum(map(len, full)) != sum(map(len, regrouped)) or not common:
        problems.append(f"{where}: {sum(map(len, regrouped))} samples trained, not {sum(map(len, full))}")
    return problems


def global_steps(*runs: Records) -> dict[tuple[int, int], list[tuple[int, Any]]]:
    """Per (epoch, batch), what all ranks of ``runs`` trained together: (id, augmentation) pairs, sorted."""
    steps: dict[tuple[int, int], list[tuple[int, Any]]] = {}
    for records in runs:
        for rank_records in records.values():
            for record in rank_records:
                pairs = zip(record["ids"], record["aug"], strict=True)
                steps.setdefault((record["epoch"], record["batch"]), []).extend(pairs)
    return {step: sorted(pairs) for step, pairs in steps.items()}


def augmented_and_later_problems(runner: Runner, outcome: Outcome, world_size: int, batch_size: int) -> list[str]:
    """After a resume on another layout (``world_size`` processes, batches of ``batch_size``): where a sample of the
    interrupted epoch was augmented otherwise than in the uninterrupted run, and whether the later epochs read what a
    fresh run of that layout reads."""
    scenario, stopped, resumed, epoch = outcome.scenario, outcome.stopped, outcome.resumed, outcome.scenario.stop_epoch
    problems = []
    expected = augmentation_by_id(outcome.full, epoch=epoch)
    for sample, values in augmentation_by_id(stopped, resumed, epoch=epoch).items():
        if any(value != expected[sample][0] for value in values):
            problems.append(f"epoch {epoch}: sample {sample} augmented {values}, not {expected[sample][0]}")
            break
    layout = {"world_size": world_size, "batch_size": batch_size}
    fresh = runner.full(
        replace(scenario, **layout, resume_world_size=None, resume_num_workers=None, resume_batch_size=None)  # type: ignore[arg-type]
    )
    if data_after_epoch(resumed, epoch) != data_after_epoch(fresh, epoch):
        problems.append(f"the epochs after {epoch} do not read what a fresh run of {layout} reads")
    return problems


def resized_mismatches(runner: Runner, outcome: Outcome) -> list[str]:
    """What docs/guarantees.md promises of a resume with another batch size (and maybe world size) for a map-style
    loader: the interrupted epoch goes on from the checkpoint's global position in the uninterrupted run's global
    order (padded as ``DistributedSampler`` pads on the new world size), each sample with its uninterrupted
    augmentation; the later epochs read what a fresh run of the new layout reads. Before the stop, the run is the
    uninterrupted one."""
    scenario, stopped, resumed = outcome.scenario, outcome.stopped, outcome.resumed
    assert scenario.resume_batch_size is not None
    new_size, epoch, size = (
        scenario.resume_world_size or scenario.world_size,
        scenario.stop_epoch,
        scenario.dataset_size,
    )
    problems = stopped_mismatches(outcome.full, stopped)
    before, full = global_order(stopped, epoch), global_order(outcome.full, epoch)
    interrupted = before + global_order(resumed, epoch)
    padding = math.ceil((size - len(before)) / new_size) * new_size - (size - len(before))
    if interrupted[:size] != full[:size] or len(interrupted) != size + padding:
        problems.append(f"epoch {epoch}: trained {interrupted} in global order, not {full[:size]} (+{padding} padding)")
    return problems + augmented_and_later_problems(runner, outcome, new_size, scenario.resume_batch_size)


def stopped_mismatches(full: Records, stopped: Records) -> list[str]:
    """Per rank, where the stopped run's steps differ from the uninterrupted run's first steps, in every field."""
    problems = []
    for rank, steps in stopped.items():
        for index, (want, got) in enumerate(zip(full[rank], steps, strict=False)):
            differing = [name for name in WITH_PARAMETERS if want.get(name) != got.get(name)]
            if differing:
                problems.append(f"rank {rank} step {index} before the stop differs in {differing}: {want} != {got}")
                break
    return problems


def seeds(found: tuple[int, ...] = (), fixed: tuple[int, ...] = CI_SEEDS) -> list[int]:
    """The seeds to run: ``E2E_MATRIX_SEEDS``, or ``E2E_MATRIX_SOAK`` fresh ones, or CI's (``fixed`` and ``found``)."""
    if os.environ.get("E2E_MATRIX_SEEDS"):
        return list(dict.fromkeys(int(each) for each in os.environ["E2E_MATRIX_SEEDS"].split(",")))
    soak = int(os.environ.get("E2E_MATRIX_SOAK", "0"))
    if soak:
        fresh = random.SystemRandom()
        return [fresh.randrange(10**6, 10**9) for _ in range(soak)]
    return list(dict.fromkeys((*fixed, *found)))  # once each: a seed's runs share a directory


LIBRARY_DATA = ("litdata", "litdata", "litdata-combined", "mosaic", "mosaic")
"""The data libraries' streams a library case reads (`draw_library_case`), where the library is installed."""
SHARDED = ("sharded-mixture", "litdata-weighted")
"""The mixtures of their chunked datasets (LitData chunks, token blocks, Mosaic shards; a weighted
``CombinedStreamingDataset``), drawn for 30% of the seeds, decided apart from the rest of the draw so that
the seeds drawn before they were added still draw what they drew."""


def draw_library_case(seed: int) -> Scenario:
    """A case over a data library's stream (LitData, a ``CombinedStreamingDataset``, MosaicML Streaming), drawn
    within what docs/litdata.md and docs/mosaic.md promise exact: the world size and, for Mosaic, ``num_workers``
    kept at the resume; a ``CombinedStreamingDataset`` without workers; no stop inside a step (a stream's batch
    is not fetched again). A mixture of chunked datasets (`SHARDED`) is a map-style mixture: any stop."""
    draw = random.Random(seed * 104729 + 7)
    data = draw.choice(LIBRARY_DATA)
    sharded = random.Random(f"sharded0:{seed}")
    if sharded.random() < 0.3:
        data = sharded.choice(SHARDED)
    workers = 0 if data == "litdata-combined" else draw.choice((0, 1, 2))
    loaders = {"litdata-combined": ("StreamingDataLoader",), "sharded-mixture": ("DataLoader",)}.get(
        data, ("StreamingDataLoader", "StreamingDataLoader", "DataLoader")
    )
    stops = ("batch_end", "batch_end", "last_batch", "validation") + (("in_step",) if data in SHARDED else ())
    scenario = Scenario(
        world_size=draw.choice((1, 2, 2)),
        num_workers=workers,
        loader=draw.choice(loaders),
        data=data,
        stop_kind=draw.choice(stops),
        stop_epoch=draw.choice((0, 1)),
        epochs=draw.choice((2, 3)),
        extra_saves_every=draw.choice((0, 0, 1, 2)),
        evaluate_before_resume=draw.random() < 0.3,
        val_loader=draw.choice(("plain", "plain", "shuffled", "batch_sampler")),
        manual_optimization=draw.random() < 0.2,
    )
    if scenario.stop_epoch == scenario.epochs - 1 and scenario.stop_kind == "last_batch":
        scenario = replace(scenario, epochs=3)  # a stop at the run's very end would resume nothing
    if data == "litdata-weighted":  # the LitData sources, at weights drawn
        weights = (("a", draw.choice((1, 3, 7))), ("b", draw.choice((1, 3))))
        scenario = replace(scenario, mixture_sources=(("a", 19), ("b", 11)), mixture_weights=((0, weights),))
    if data in SHARDED and sharded.random() < 0.3:  # other weights at the resume
        later = tuple((name, sharded.choice((1, 2, 6))) for name, _ in scenario.mixture_weights[0][1])
        scenario = replace(scenario, resume_mixture_weights=((0, later),))
    if data in SHARDED and sharded.random() < 0.3:  # on another world size
        scenario = replace(scenario, resume_world_size=3 - scenario.world_size)
    if data == "mosaic" and workers and draw.random() < 0.3:
        scenario = replace(scenario, resume_num_workers=0)  # Mosaic's order does not depend on the workers
    # Issue 55: workers kept from pass to pass, and Mosaic on another world size (its elastic resume at the same global
    # batch, verified by the global batch); salted, and not for the seeds CI ran before.
    later = random.Random(seed * 104729 + 55)
    if workers and later.random() < 0.3 and seed not in MIXTURE_KEPT_AFTER:
        scenario = replace(scenario, persistent_workers=True)
    if data == "mosaic" and later.random() < 0.3 and seed not in MIXTURE_KEPT_AFTER:
        scenario = replace(scenario, resume_world_size=3 - scenario.world_size)
    # LitData's loader on another layout: world size, workers, batch size, each or together (salted apart).
    moved = random.Random(seed * 104729 + 5505)
    if data == "litdata" and seed not in MIXTURE_KEPT_AFTER and moved.random() < 0.5:
        if moved.random() < 0.5:
            scenario = replace(scenario, resume_world_size=3 - scenario.world_size)
        if moved.random() < 0.5:
            scenario = replace(scenario, resume_num_workers=moved.choice((0, 1, 2, 3)))
        if moved.random() < 0.4 or (scenario.resume_world_size, scenario.resume_num_workers) == (None, None):
            scenario = replace(scenario, resume_batch_size=moved.choice((2, 6, 8)))
        # ... its dataset declaring the first launch's layout as its order (salted; CI's seeds keep theirs).
        if random.Random(seed * 104729 + 5513).random() < 0.5 and seed not in LIBRARY_SEEDS:
            scenario = scenario.declaring_its_order()
    # Mosaic's loader with another batch size, on the same or another world size (salted apart; CI's seeds keep theirs).
    regrouped = random.Random(seed * 104729 + 5506)
    if data == "mosaic" and seed not in (*MIXTURE_KEPT_AFTER, *LIBRARY_SEEDS) and regrouped.random() < 0.4:
        scenario = replace(scenario, resume_batch_size=regrouped.choice((2, 6, 8)))
    return scenario


def library_data_written(runner: Runner, data: str) -> None:
    """The chunks (LitData) or shards (Mosaic) ``data`` reads, written once into ``runner``'s root, by one process at a
    time: pytest-xdist's workers share the root, and one that found no index yet wrote into the folder another was
    writing (``litdata.optimize wrote []``)."""
    with locked(runner.root / "library-data.lock"):
        _library_data_written(runner.root, data)


def _library_data_written(root: Path, data: str) -> None:
    from . import train

    if data in SHARDED:
        train.clean_mosaic_memory()  # left by runs that ended without Mosaic's cleanup
        train.write_sharded_sources(root)
    elif data.startswith("litdata"):
        for directory, size, first in ((train.LITDATA_DIR, 48, 0), (train.LITDATA_SECOND_DIR, 24, 1000)):
            if not (root / directory / "index.json").exists():
                train.write_litdata(root / directory, size, first=first)
    else:
        train.clean_mosaic_memory()  # left by runs that ended without Mosaic's cleanup
        if not (root / train.MOSAIC_DIR / "index.json").exists():
            train.write_mosaic(root / train.MOSAIC_DIR, 48)


def steps_at_stop(scenario: Scenario) -> int:
    """Training steps before the stopped run's checkpoint: a stop inside a step saves before that step."""
    trained = scenario.stop_epoch * scenario.batches_per_epoch + scenario.stop_batch
    return trained if scenario.stop_kind == "in_step" else trained + 1


def library_reference(scenario: Scenario) -> Scenario:
    """The uninterrupted run a library case equals: itself, or with weights changed at the resume, a ``Mixture``
    of the same sources whose schedule changes there (docs/mixtures.md; a weighted ``CombinedStreamingDataset``
    is read as that mixture: its sources' sizes added up an epoch, ordered by the run's seed)."""
    if scenario.resume_mixture_weights is None:
        return scenario
    reference = replace(scenario, resume_mixture_weights=None)
    if scenario.data == "litdata-weighted":
        epoch = sum(size for _, size in scenario.mixture_sources)
        reference = replace(reference, data="sharded-mixture", loader="DataLoader", dataset_size=epoch)
    changes = ((0, scenario.mixture_weights[0][1]), (steps_at_stop(scenario), scenario.resume_mixture_weights[0][1]))
    return replace(reference, mixture_weights=changes)


def mixture_elastic_mismatches(runner: Runner, outcome: Outcome, reference: Scenario) -> list[str]:
    """A mixture resumed on another world size reads its stream on in order (docs/mixtures.md): before the
    stop the uninterrupted run; then every sample, in stream order, the reference's at the same position,
    over the positions both trained (the per-rank batch is kept, so the global batch and the epochs' ends
    change with the world size), the resumed run training at least one epoch's worth."""
    problems = stopped_mismatches(outcome.full, outcome.stopped)
    stopped, resumed = stream_order(outcome.stopped), stream_order(outcome.resumed)
    expected = stream_order(runner.full(replace(reference, resume_world_size=None)))
    interrupted = stopped + resumed
    scenario, least = outcome.scenario, outcome.scenario.batches_per_epoch * outcome.scenario.batch_size
    if scenario.resume_batch_size:  # an epoch of the samples in it, or the run's rest, less the new size's rounding
        new_global = scenario.resume_batch_size * (scenario.resume_world_size or scenario.world_size)
        least = min(scenario.dataset_size, len(expected) - len(stopped)) - new_global
    if len(resumed) < least:
        problems.append(f"the resumed run trained {len(resumed)} samples, less than {least}")
    for position, (got, want) in enumerate(zip(interrupted, expected, strict=False)):
        if got != want:
            problems.append(f"stream position {position}: {got}, not {want}")
            break
    return problems


def case_problems(runner: Runner, scenario: Scenario, reference: Scenario) -> list[str]:
    """Where the stopped and resumed ``scenario`` differs from the uninterrupted ``reference`` (empty: exact).

    Raises:
        AssertionError: a run failed or refused.
    """
    if scenario.wds_refused:
        return refused_problems(runner, scenario)
    outcome = Outcome(scenario, runner.full(reference), runner.stopped(scenario), runner.resumed(scenario))
    resized = (scenario.resume_world_size, scenario.resume_num_workers, scenario.resume_batch_size)
    if scenario.data in ("litdata", "wds", "hf", "hf-interleaved") and resized != (None, None, None):
        return elsewhere_mismatches(runner, outcome)
    if scenario.resume_batch_size is not None and scenario.data == "mixture":
        return mixture_elastic_mismatches(runner, outcome, replace(reference, resume_batch_size=None))
    if scenario.resume_batch_size is not None and scenario.data == "mosaic":
        return regrouped_mismatches(runner, outcome)
    if scenario.resume_batch_size is not None:
        return resized_mismatches(runner, outcome)
    if scenario.resume_world_size is not None and scenario.data in ("mixture", *SHARDED):
        return mixture_elastic_mismatches(runner, outcome, reference)
    if scenario.resume_world_size is not None and scenario.data == "mosaic":
        return global_batch_mismatches(outcome)
    if scenario.resume_world_size is not None:
        return elastic_mismatches(runner, outcome)
    if ("seed_steps", False) in scenario.callback_options:
        # A resume cannot restore the global generators (documented): exact ids throughout, and before the
        # stop, with saves every few steps, everything: a save must not move them.
        return outcome.stream_mismatches(("epoch", "batch", "ids")) + stopped_mismatches(outcome.full, outcome.stopped)
    problems = outcome.stream_mismatches(WITH_PARAMETERS)
    if scenario.resume_mixture_weights is None and not scenario.callback_options:
        problems += outcome.validation_mismatches(runner)
    return problems


def refused_problems(runner: Runner, scenario: Scenario) -> list[str]:
    """A WebDataset pipeline with a stage the docs list as refused: its run must end before any step, on every rank,
    with an ``UnsupportedLoaderError`` that names the stage (docs/streams-and-loaders.md)."""
    run_dir = runner.root / ("refused-" + scenario.label())
    records = run_phase(scenario, "full", run_dir, run_dir / "unused.ckpt", expect_failure=True)
    log = (run_dir / "full.log").read_text()
    problems = [f"rank {rank} trained {len(steps)} steps" for rank, steps in records.items() if steps]
    if "UnsupportedLoaderError" not in log or WDS_REFUSED[scenario.wds_refused] not in log:
        problems.append(f"no UnsupportedLoaderError naming {WDS_REFUSED[scenario.wds_refused]!r}: {log[-1500:]}")
    return problems


def chain_problems(runner: Runner, scenario: Scenario, legs: Sequence[Leg], run_dir: Path) -> list[str]:
    """Where the chain of ``legs`` differs from the uninterrupted ``scenario`` (empty: exact); for a chain whose last
    leg resumes on another world size with a skip given there, from the same chain given the skip from its first.

    Raises:
        AssertionError: a leg failed or refused.
    """
    if legs and legs[-1].world_size is not None:
        given = legs[-1].config
        reference = run_chain(run_dir / "reference", scenario, [replace(leg, config=given) for leg in legs])
        steps, validations = run_chain(run_dir, scenario, legs)
        problems = []
        for name, got, want in (("steps", steps, reference[0]), ("validations", validations, reference[1])):
            for rank in want:
                mine, theirs = got.get(rank, []), want[rank]
                if mine != theirs:
                    at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
                    where = f"first at {at}: {mine[at]} != {theirs[at]}" if at is not None else f"{len(mine)} != "
                    problems.append(
                        f"rank {rank}: {name} differ from the chain given the skip first, {where}"
                        + ("" if at is not None else f"{len(theirs)}")
                    )
        return problems
    full, full_validations = runner.full(scenario), runner.full_validations(scenario)
    steps, validations = run_chain(run_dir, scenario, legs)
    outcome = Outcome(scenario, full, {rank: [] for rank in steps}, steps)
    # Not Lightning's batch_idx: after a chain of resumes through an epoch's end Lightning 2.6 may number an
    # epoch's batches from where the one before ended (the callback warns, and counts them from the data).
    fields = [name for name in WITH_PARAMETERS if name != "batch"]
    problems = [problem for problem in outcome.stream_mismatches(fields) if "did not stop and resume" not in problem]
    for rank, expected in full_validations.items():
        if validations[rank] != expected:
            problems.append(f"rank {rank}: validations {validations[rank][:4]}..., expected {expected[:4]}...")
    return problems


def described(legs: Sequence[Leg]) -> str:
    return " -> ".join(f"{leg.kind}@{leg.epoch}.{leg.batch}/w{leg.num_workers}" for leg in legs)


# ------------------------------------------------------------------------------- the preemption matrix
PREEMPTION_TARGETS = ("every rank", "rank 0", "rank 1", "group", "group", "launcher")
"""Where a SIGTERM goes (`train.Preempt`): the whole process group (SLURM, ``kill -- -PGID``) twice as often."""


def _preempted(seed: int, scenario: Scenario) -> tuple[Scenario, Preemption]:
    """The preemption of ``scenario`` that ``seed`` draws (`tests.e2e.preemption.Preemption`), within what
    docs/guarantees.md promises: the signal lands before the fit's last batch, so it ends through
    ``SIGTERMException``; a sanity check only in a fresh fit (a resumed one runs none); the next epoch's workers
    start only in a later epoch; a save only where the run saves periodically."""
    draw = random.Random(seed * 15485863 + 44)
    if scenario.world_size == 1 and draw.random() < 0.7 and scenario.strategy == "ddp":
        scenario = replace(scenario, world_size=2)  # preemption is the job of many processes: mostly two
    when = draw.choice(PREEMPTION_WHENS)
    if when == "workers_start" and scenario.persistent_workers:  # they start once, before the first epoch's start
        when = "train_start"  # (Lightning makes the first epoch's iterator in its data setup)
    requeue = draw.random() < 0.25
    if when == "save" and not scenario.extra_saves_every:
        scenario = replace(scenario, extra_saves_every=draw.choice((1, 2)))
    targets = ("every rank", "rank 0", "rank 1", "group", "group") if requeue else PREEMPTION_TARGETS
    if scenario.world_size == 1:
        targets = tuple(target for target in targets if target != "rank 1")
    target = draw.choice(targets)
    per_epoch, epochs = scenario.batches_per_epoch, scenario.epochs
    if when == "workers_start" and epochs < 2:
        scenario = replace(scenario, epochs=2)
        epochs = 2
    # The batches the signal may take to land and be acted on, which must come before the run's last: the next
    # validation (every second batch), the next periodic save, the accumulation window's end, and for the requeue
    # signal the requeue's own SIGTERM, acted on a batch later.
    window = scenario.accumulate
    margin = 1 + window + (2 if requeue else 0) + (2 if when == "validation" else 0)
    margin += (scenario.extra_saves_every or 2) * window if when == "save" else 0
    total = epochs * per_epoch
    places = [(index // per_epoch, index % per_epoch) for index in range(total - margin)] or [(0, 0)]
    if when == "workers_start":
        places = [(epoch, 0) for epoch in range(1, epochs) if epoch * per_epoch < total - margin] or [(1, 0)]
    at = draw.choice(places)
    resumed_first = None
    first_places = [place for place in places if place < at and place[1] < per_epoch - 1]
    first_places = [place for place in first_places if (place[1] + 1) % window == 0]  # (saved where a window ends)
    if when not in ("setup", "sanity", "train_start"):
        first_places = [place for place in first_places if place[0] == at[0]]  # the epoch the resume starts in
    if when != "sanity" and first_places and draw.random() < 0.4:
        resumed_first = draw.choice(first_places)
    if when in ("setup", "sanity", "train_start"):
        at = (0, 0)
    val_workers = draw.choice((0, 2))
    scenario = replace(scenario, num_workers=draw.choice((0, 2, 2)), val_workers=val_workers)
    again = None  # a second signal while the fit ends (SIGTERM again, or SLURM's SIGKILL after its KillWait)
    if not requeue and draw.random() < 0.3:
        again = draw.choice(("at_once", "while_ending", "kill_while_saving"))
        if again == "kill_while_saving" and not scenario.extra_saves_every:
            scenario = replace(scenario, extra_saves_every=1)  # the checkpoint that resumes
    launcher = "torchrun" if target == "launcher" else "fork"
    if launcher == "fork" and not requeue and draw.random() < 0.25:  # (a SLURM step is the fork server's)
        launcher = "lightning"  # ``python train.py``: whole processes, ended by Python's own exit
    preemption = Preemption(
        signal="USR1" if requeue else "TERM",
        target=target,
        when=when,
        at=at,
        resumed_first=resumed_first,
        launcher=launcher,
        sanity_steps=2 if when == "sanity" else 0,
        again=again,
    )
    return replace(scenario, start_method=_start_method(seed, scenario)), preemption


def draw_preemption(seed: int) -> tuple[Scenario, Preemption]:
    """A preempted run, its setup drawn as `draw_case` draws it (a map-style loader, a stream, a mixture,
    several loaders), on the same world size and workers at the resume, with 0 or 2 workers."""
    base, _ = draw_case(seed)
    scenario, preemption = _preempted(seed, _as_one_run(base, evaluate_before_resume=False))
    # Issue 55: a WebDataset pipeline or a Hugging Face stream requeued on another allocation (a pipeline batched in
    # itself keeps its batches); salted, not for the seeds CI ran before.
    moved = random.Random(seed * 104729 + 5509)
    anywhere = scenario.data in ("wds", "hf", "hf-interleaved") and preemption.again != "kill_while_saving"
    anywhere = anywhere and seed not in MIXTURE_KEPT_AFTER
    if anywhere and moved.random() < 0.4:
        batch_size = scenario.batch_size if scenario.wds_form else moved.choice((2, 4, 6, 8))
        layout = (moved.choice((1, 2)), moved.choice((0, 1, 2)), batch_size)
        if layout != (scenario.world_size, scenario.num_workers, scenario.batch_size):
            preemption = replace(preemption, resumed_on=layout)
            # ... its stream declaring the first launch's layout as its order (salted; not for CI's seeds before).
            if random.Random(seed * 104729 + 5511).random() < 0.5 and seed not in ORDER_AFTER:
                scenario = scenario.declaring_its_order()
    return scenario, preemption


def draw_library_preemption(seed: int) -> tuple[Scenario, Preemption]:
    """A preempted run over a data library's loader (LitData's, Mosaic's, a mixture of their chunked datasets),
    drawn as `draw_library_case` draws it; LitData's and Mosaic's loaders requeued on another allocation (issue 55:
    another world size, number of workers or batch size; salted, not for CI's seeds), the others on the same."""
    scenario, preemption = _preempted(seed, _as_one_run(draw_library_case(seed), evaluate_before_resume=False))
    if scenario.data == "litdata-combined":  # a CombinedStreamingDataset resumes exactly without workers only
        scenario = replace(scenario, num_workers=0)
    moved = random.Random(seed * 104729 + 5507)
    anywhere = scenario.data in ("litdata", "mosaic") and preemption.again != "kill_while_saving"
    if anywhere and seed not in LIBRARY_PREEMPTIONS_ON_ONE_ALLOCATION and moved.random() < 0.4:
        layout = (moved.choice((1, 2)), moved.choice((0, 1, 2)), moved.choice((2, 4, 6, 8)))
        if layout != (scenario.world_size, scenario.num_workers, scenario.batch_size):
            preemption = replace(preemption, resumed_on=layout)
            declares = random.Random(seed * 104729 + 5514).random() < 0.5 and scenario.data == "litdata"
            if declares and seed not in LIBRARY_PREEMPTION_SEEDS:  # LitData's dataset declaring its first order
                scenario = scenario.declaring_its_order()
    return scenario, preemption


def resumed_elsewhere_problems(runner: Runner, outcome: Outcome) -> list[str]:
    """The judge of a loader resumed on another layout: LitData's, a WebDataset pipeline's and a Hugging Face stream's
    epoch goes on in the order that began it (`elsewhere_mismatches`), Mosaic's global sequence in global batches of
    the new size (`regrouped_mismatches`)."""
    if outcome.scenario.data in ("litdata", "wds", "hf", "hf-interleaved"):
        return elsewhere_mismatches(runner, outcome)
    return regrouped_mismatches(runner, outcome)

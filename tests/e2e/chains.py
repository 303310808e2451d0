"""A run interrupted several times: legs of `train.py`, each resuming from the checkpoint the one before
wrote, whose steps and validations, put end to end, must be the uninterrupted run's.

A leg ends by one of `LEG_KINDS`: a stop of `train.StopAt` (a save, then the process ends at once, as
a kill after the save would: ``batch_end``, ``last_batch``, ``in_step``, ``validation``), a preemption
``kill`` (the process ends after a step without a save of its own, as a SIGKILL: the leg's last
periodic save, ``Scenario.extra_saves_every``, resumes, and the steps after it are trained again), a preemption
(``sigterm``: SIGTERM on every rank in a step, ``OnExceptionCheckpoint`` saves at its end, the process
exits), ``interrupt`` (``KeyboardInterrupt`` in a step: Lightning's graceful shutdown, with
``OnExceptionCheckpoint``), ``extend`` (the fit runs to an earlier ``max_epochs`` and ends normally; a
save once ``fit()`` returned: the next leg extends a finished fit), ``early`` (``validate()`` and a save
before any train step). The last leg (``end``) runs to the end.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .harness import FORK, RUN_TIMEOUT_S, TRAIN_SCRIPT, Records, Scenario, _config, fork_server, read_records
from .processes import run_tree

CI_SEEDS = (1, 2, 3, 5, 8, 9, 13, 16, 20, 26, 116022219, 496079945, 558353263, 685662175)
"""Fixed seeds CI runs (a few seconds a case, about 15 s a chain, on 2 cores; uninterrupted runs shared):
every kind of train input and of leg among them. 5 and 8 failed when first drawn (a finished fit
extended with 2 workers read the saved epoch's empty rest as the next epoch; with ``estimated_stepping_batches``
the loader is built before Lightning restores its loops, so the epoch is known only at the train start).
496079945, 558353263, 685662175: found by the first soak of 300 (FSDP2 after validate() on the same model; a
validation run twice after a resume that had run one; a subset sampler's epoch length). 116022219: found by a
soak, a mixture whose weights change at a resume from an epoch's last batch trained nothing after it
(the fix of an epoch cut by ``limit_train_batches`` read Lightning's batch count, which a resume after an
epoch's end carries over from the epoch before; it now reads the data's restored count)."""
CHAINS_OF_CI_SEEDS = (3, 5, 8, 16, 20, 496079945, 558353263, 685662175)
"""The `CI_SEEDS` whose chains CI runs (every seed's case runs): each caught a mutation as a chain
(`mutations.py`: a skipped validation, 3, 5, 16, 20 and 558353263) or failed when first drawn; the other
chains add little and CI's time is bounded (25-30 minutes on 2 cores)."""
CASE_SEEDS = (19, 22, 917980412, 73, 1574, 1117)
"""Cases CI runs besides `CI_SEEDS`: 19 resumes on another world size; 22 limits an epoch's batches
(``limit_train_batches``); 1574 (a map-style loader, 4 -> 2 on 2 processes) and 1117 (a mixture, 4 -> 3) resume
with another batch size from an epoch's last batch, and found the next epoch ended early (issue 55);
73 starts the workers by spawn as the process default (issue 54; of the `CI_SEEDS`
cases, 8 draws forkserver as the default, the others fork: `matrix.FORK_IN_CI`; chain 1390 gives forkserver to the
loaders).
(CI seed 2, drawn anew with a shuffled validation loader on one process, found that a
resume seeded the generators of the validation it runs first otherwise than the step before had left them: they
are now seeded at each step's end, and a resume seeds them as the step it follows ended.) 917980412: found by the
third soak, shrunk (`shrink.py`) to a resume on 1 process from a checkpoint at the last batch of an epoch on 2:
Lightning went on in the next epoch from the old epoch's batch count (its restart compares that count with the
new loader's length) and ended it 5 batches early. Such a checkpoint now resumes at the next epoch's start."""
CHAIN_SEEDS = (
    100132691, 257594569, 66741773, 757704568, 854942050, 750, 2154, 44860491, 47, 18, 182055219,
    223, 585, 518, 91, 1688, 1390,
)  # fmt: skip
"""Chains CI runs besides `CI_SEEDS`, found by a soak: 100132691, a save from ``OnExceptionCheckpoint`` (SIGTERM on
one process, 3 workers) fingerprinted a batch read after the callback had ended the workers (torch skips the
batches they owed): the state is now taken before; 257594569, a resume from inside a step left Lightning's batch
totals a batch ahead, so the next resume, from an epoch's last batch, resumed the ended epoch (the totals are now
written as what was trained). Four more chains the same soak found failing had the second cause. The second
soak (300 chains on the code with those fixes: 3 failed): 66741773, a save after the first batch of an epoch that
a restart from the epoch's last batch before it began (Lightning counts that batch completed only after the save,
so the epoch was not written as started and Lightning numbered its batches from 0 again: a third resume was
refused); 757704568, a fit resumed from an epoch's last batch, run to its end and extended (Lightning never marked
that epoch started, not even once it ended: the extended fit trained one batch of the next epoch). Both are now
written as started. The third, 318055189, was Lightning's (FSDP2 cannot load a checkpoint of an optimizer that has
not stepped): the generator no longer draws it. 854942050 (the last soak): a fit of epochs cut by
``limit_train_batches``, saved once it returned and extended, was refused (the limit, not the sampler, had ended
the saved epoch); it now starts the next epoch. Issue 46's shuffled Hugging Face streams
(a buffer taken over by windows): 750, 0 workers, an epoch's last batch, then a save, SIGTERM and a kill in the last
epoch; 2154, 2 workers, SIGTERM, the epoch's last batch, a kill, the next epoch's last batch; 44860491 (its soak),
2 workers, a kill then a save in a validation: a worker that had not read since the first restore reported its
state before the restore. Issue 47's skipped steps (a third of the chains draw them): 47, skips given at a resume of
a fit whose loader ``estimated_stepping_batches`` built before the restore were planned from step 0 (Lightning had not
restored its loops when the loader was built again: the checkpoint's step is now read from it); 18 (map-style,
from the start, through ``validate()`` first) and `CHAINS_OF_CI_SEEDS`' 16 (a stream) keep skips in CI's chains.
182055219 (its review's soak, older than it): a fit resumed from an epoch's last batch saved at the next epoch's
last batch (in ``on_train_batch_end``) wrote that epoch as not begun, and the next resume trained it again from the
data's next epoch (20 steps of 15): an epoch that the restart did not mark started is written started up to and
including its last batch. Issue 53's skips given at a resume on another world size (the chain's last leg, compared
with the same chain given the skip from its first): 223 and 585, map-style 2 -> 1 and 1 -> 2; 518 and 91, a mixture
2 -> 1 and 1 -> 2; 1688 and 1390, a batch sampler 2 -> 1 and 1 -> 2 (each failed before the fix: the steps were placed
on the new world size)."""
LIBRARY_PREEMPTIONS_ON_ONE_ALLOCATION = (0, 2, 4, 7, 9, 11, 13, 14, 25, 33, 40, 47, 200, 838557569, 851231692)
"""CI's library preemptions drawn before a requeue on another allocation was: they keep their cases."""
LIBRARY_PREEMPTION_SEEDS = (*LIBRARY_PREEMPTIONS_ON_ONE_ALLOCATION, 1000013, 1000037)
"""LitData's and Mosaic's loaders, in CI's extras step: a cover of what `draw_library_preemption` draws, with the
group signal to a chunked mixture (LitData's and Mosaic's datasets in a ``Mixture``, 2 workers) in the first epoch
after a resume (25), to LitData's loader in the epoch a resume started (200) and to Mosaic's loader (4). (7, a
chunked mixture whose workers the forkserver starts, found a LitData source read in the rank unpicklable for the
next epoch's workers: `tests/test_litdata_internals.py` reproduces it.) Workers kept from pass to pass (issue 55):
838557569, a chunked mixture's spawned workers, SLURM's requeue signal to rank 1 at a step; 851231692, Mosaic's
loader's 2 workers by forkserver as the default, SIGTERM to rank 0 in the sanity check. Requeued on another
allocation (issue 55): 1000013, LitData's loader on 2 processes with 2 kept workers started by forkserver, SLURM's
requeue signal to rank 0 in the fit's setup (its save before any pass began resumed on 1 process of 8 was refused by
its first batch: LitData's state of a loader not yet iterated named another epoch), resumed on 1 process of 8 with a
worker; 1000037, Mosaic's loader resumed on 2 processes of 4 with 2 workers."""

LIBRARY_SEEDS = (2, 6, 609549163, 345719897, 84187010)
"""Data-library cases CI's extras step runs (`matrix.draw_library_case`): Mosaic on 2 processes with 2 workers
resumed on none, read by a torch ``DataLoader``; LitData at an epoch's last batch with 2 workers; 609549163, found
by a soak of 40 library cases (3 failed, one cause): a ``CombinedStreamingDataset`` saved at its last batch resumed
the ended epoch while Lightning, which knows the epoch's length, began the next (a stream read to its length now
starts the next). (3 and 8, a combined dataset with a shuffled validation loader and Mosaic saved at a validation,
pass and run in soaks: CI's time is bounded.) Issue 55's draws: 345719897, Mosaic's loader with a worker kept from
pass to pass, 1 -> 2 processes at the same global batch (verified by the global batch); 84187010, a weighted
``CombinedStreamingDataset`` with a worker kept, 2 -> 1. (LitData's loader on another layout: seed 422241577 found
its resumed epoch counted in the new layout's units, where it held no batch after the checkpoint's, so it started
afresh; `tests/e2e/test_litdata.py` runs that case.)"""
LEG_KINDS = (
    "batch_end",
    "last_batch",
    "in_step",
    "validation",
    "kill",
    "sigterm",
    "interrupt",
    "extend",
    "early",
    "end",
)


@dataclass(frozen=True)
class Leg:
    """How one leg ends: ``kind`` at batch ``batch`` of epoch ``epoch`` (``extend``: after epoch ``epoch``);
    ``num_workers``: this leg's loader workers, where it differs from the scenario's; ``world_size``: its
    processes, where they differ (a resume on another world size; the records of ranks it lacks end before it)."""

    kind: str
    epoch: int = -1
    batch: int = -1
    num_workers: int | None = None
    world_size: int | None = None
    config: tuple[tuple[str, object], ...] = ()
    """What this leg's config sets otherwise than the scenario's (``callback_options``, ``audit_dir``)."""

    def __post_init__(self) -> None:
        assert self.kind in LEG_KINDS, self.kind


def run_chain(
    run_dir: Path, scenario: Scenario, legs: Sequence[Leg], resume_from: Path | None = None
) -> tuple[Records, Records]:
    """Run ``legs`` in turn in ``run_dir`` (the first resuming from ``resume_from``, if given); per rank, the steps
    and the validations of every leg, in order.

    Raises:
        AssertionError: a leg hung, ended otherwise than its kind does, or wrote no checkpoint.
    """
    most = max([scenario.world_size, *(leg.world_size or 0 for leg in legs)])
    steps: Records = {rank: [] for rank in range(most)}
    validations: Records = {rank: [] for rank in range(most)}
    previous: Path | None = resume_from
    run_dir.mkdir(parents=True, exist_ok=True)
    for index, leg in enumerate(legs):
        world_size = leg.world_size or scenario.world_size
        phase, checkpoint = f"leg{index}", run_dir / f"leg{index}.ckpt"
        for stale in (run_dir / "extra.ckpt", *run_dir.glob("extra.rank*.json"), run_dir / "on_exception.ckpt"):
            stale.unlink(missing_ok=True)  # a leg resumes from what it wrote itself
        config = _config(scenario, phase, run_dir, checkpoint, world_size)
        config.update(
            stop={"kind": leg.kind, "epoch": leg.epoch, "batch": leg.batch, "val_batch": 1},
            leg={"kind": leg.kind},
            resume_from=None if previous is None else str(previous),
        )
        if leg.num_workers is not None:
            config["num_workers"] = leg.num_workers
        config.update(dict(leg.config))
        if leg.kind in ("sigterm", "interrupt"):
            config.update(leg_signal_at=[leg.epoch, leg.batch], on_exception_checkpoint=True)
        if leg.kind == "extend":
            config["epochs"] = leg.epoch + 1
        config_path = run_dir / f"{phase}.json"
        config_path.write_text(json.dumps(config))
        log_path, what = run_dir / f"{phase}.log", f"{scenario.label()} {phase} ({leg.kind})"
        if FORK:
            returncode = fork_server().run(config_path, world_size, log_path, run_dir, RUN_TIMEOUT_S, what)
        else:
            command = [sys.executable, str(TRAIN_SCRIPT), str(config_path)]
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            returncode = run_tree(command, log_path, run_dir, RUN_TIMEOUT_S, what, env)
        kept = read_records(run_dir, phase, world_size), read_records(run_dir, phase + ".val", world_size)
        if leg.kind == "kill":  # the last periodic save resumes: what each rank recorded after it is trained again
            (run_dir / "extra.ckpt").rename(checkpoint)
            counts = {rank: json.loads((run_dir / f"extra.rank{rank}.json").read_text()) for rank in range(world_size)}
            kept = tuple(
                {rank: records[rank][: counts[rank][name]] for rank in records}
                for records, name in zip(kept, ("steps", "validations"), strict=True)
            )  # type: ignore[assignment]
        written = run_dir / "on_exception.ckpt"
        if leg.kind in ("sigterm", "interrupt") and written.exists():  # the exception ends it, its exit code its own
            written.rename(checkpoint)
        elif leg.kind not in ("sigterm", "interrupt") and returncode != 0:
            raise AssertionError(f"{what} exited {returncode}:\n{log_path.read_text()[-4000:]}")
        if leg.kind != "end" and not checkpoint.exists():
            raise AssertionError(f"{what} wrote no checkpoint:\n{log_path.read_text()[-4000:]}")
        for rank in range(world_size):
            steps[rank] += kept[0][rank]
            validations[rank] += kept[1][rank]
        previous = checkpoint
    ran = [rank for rank in steps if rank < scenario.world_size or steps[rank]]  # a later leg's ranks: if they ran
    return {rank: steps[rank] for rank in ran}, {rank: validations[rank] for rank in ran}

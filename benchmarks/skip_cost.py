"""What a skip of 10^5 steps costs at a resume (issue 47): the time to the first batch, and the bytes it adds.

``python benchmarks/skip_cost.py [--quick]``: a dataset of 10^9 samples (a mixture of 8 sources of 10^9 samples
together), 8 ranks of batch 128 (a global batch of 1,024), a checkpoint at step 10^5; on rank 0, in this
process, best of 5:

- plain restore: the sampler restored at the checkpoint, then its first batch of indices;
- restore + skip: the same with ``skip_steps`` of the 10^5 steps from the checkpoint's on (the plan, the holes,
  the first batch after them);
- drain: what Megatron's ``--skip-train-iteration-range`` does, reading every skipped batch's indices and
  discarding them (no sample is read here, so this is its lower bound), timed over 1,000 steps and scaled;
  torchdata's ``StatefulDistributedSampler`` and torch's ``DistributedSampler`` cannot take part at 10^9: they
  hold the epoch's permutation (8 GB as int64) before their first index.

And the bytes the skip adds to the checkpoint's data state (its JSON form). ``--quick``: 10^7 samples, 10^3 steps.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from lightning_resumable import Mixture
from lightning_resumable.core.mixture_sampler import MixtureSampler
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.skips import plan
from lightning_resumable.core.step_layout import sampler_layout
from lightning_resumable.format.envelope import Envelope, LoaderState
from lightning_resumable.format.skips import StepRange

QUICK = "--quick" in sys.argv
SIZE = 10**7 if QUICK else 10**9
SKIPPED = 10**3 if QUICK else 10**5
RANKS, BATCH = 8, 128
STEP = SKIPPED  # the checkpoint's step


class Sized:
    """A dataset of ``n`` samples that is never read: the order needs its length only."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def best(run: Callable[[], Any], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def make(kind: str) -> ResumableSampler:
    if kind == "mixture":
        sources = {f"s{k}": Sized(SIZE // 8) for k in range(8)}
        weights = {f"s{k}": 0.05 + 0.025 * k for k in range(8)}
        return MixtureSampler(Mixture(sources, weights), RANKS, 0, 7, BATCH)
    return ResumableSampler(Sized(SIZE), RANKS, 0, True, 7, False, BATCH)


def first_batch(kind: str, skip: bool) -> Callable[[], Any]:
    saved = make(kind).state_dict(STEP)  # the checkpoint, written once

    def run() -> Any:
        sampler = make(kind)
        sampler.load_state_dict(saved)
        if skip:
            layout = sampler_layout(sampler, STEP, 1, None)
            skips = plan([StepRange(STEP, STEP + SKIPPED - 1)], layout)
            sampler.holes = skips[0].holes
        return next(iter(sampler))

    return run


def drained(kind: str) -> float:
    """Seconds to read and discard the indices of 1,000 steps, scaled to the skipped steps."""
    sampler = make(kind)
    sampler.load_state_dict(make(kind).state_dict(STEP))
    steps = min(1000, SKIPPED)
    iterator = iter(sampler)
    start = time.perf_counter()
    for _ in range(steps * BATCH):
        next(iterator)
    return (time.perf_counter() - start) * SKIPPED / steps


def skip_bytes() -> tuple[int, int]:
    sampler = make("map")
    state = sampler.data_state(STEP)
    plain = Envelope(LoaderState(state))
    sampler.load_state_dict(state.to_dict())
    skips = tuple(plan([StepRange(STEP, STEP + SKIPPED - 1)], sampler_layout(sampler, STEP, 1, None)))
    with_skip = Envelope(LoaderState(state), skips=skips)
    return len(json.dumps(plain.to_dict())), len(json.dumps(with_skip.to_dict()))


def main() -> None:
    print(f"{SIZE:,} samples, {RANKS} ranks x batch {BATCH}, checkpoint at step {STEP:,}, skip of {SKIPPED:,} steps")
    print(f"{'train input':<10} {'plain restore':>14} {'restore + skip':>15} {'added':>9} {'drain (indices only)':>21}")
    for kind in ("map", "mixture"):
        plain, skipped = best(first_batch(kind, False)), best(first_batch(kind, True))
        drain = drained(kind)
        print(
            f"{kind:<10} {plain * 1e3:>11.2f} ms {skipped * 1e3:>12.2f} ms {(skipped - plain) * 1e3:>6.2f} ms"
            f" {drain:>19.1f} s"
        )
    plain_bytes, with_skip = skip_bytes()
    print(f"data state: {plain_bytes} bytes, {with_skip} with the skip (+{with_skip - plain_bytes} bytes)")


if __name__ == "__main__":
    main()

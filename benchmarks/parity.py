"""Parity check: the library's speed against loose bounds and against the real alternatives.

``python benchmarks/parity.py [--quick]`` measures, in this process with one torch thread, and prints
a table; it exits 1 if a bound is missed. CI runs ``--quick`` (about 10 s). The bounds are loose on
purpose (a factor of several from what this machine measures), so that they catch a regression of the
design, an O(N) restore or a per-sample cost that grew, not the noise of a shared machine.

- a restore at 10^9 samples, from ``load_state_dict`` to the first batch: under 50 ms; of a mixture
  of 8 sources with the longest period: under 150 ms;
- per-sample seeding of the three global generators, as a worker does: under 25 µs a sample (this VM
  measures 10-12 µs, of which ``random.seed`` alone is about 7 µs; the derivation is frozen, so that
  cost stays: the bound catches a design regression such as ``torch.manual_seed``, 100 times slower);
- a whole epoch's indices: at least ``DistributedSampler``'s throughput, in the same run; and again
  with torch's default threads while two busy processes hold the cores, as loader workers and other
  ranks do in training (the index path once paid 6-18 times for intra-op parallelism there);
- the data state: under 1 KB added to a checkpoint (without the batch fingerprints, about 60 bytes a rank).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils.data import DistributedSampler

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its sibling modules
from timing import epoch_seconds, per_call_us
from workloads import IndexDataset, measure_restore

from lightning_resumable import ResumableSampler, SampleSeededDataset


def restore_ms(method: str = "lightning_resumable", size: int = 10**9) -> float:
    """Best of three restores to the first batch (each in this process; a mixture's table built in each)."""
    return min(measure_restore(method, size)["seconds"] for _ in range(3)) * 1000


def fresh_restore_ms(method: str, size: int) -> float:
    """A restore to the first batch in a fresh process, as a restarted job pays it (`workloads.measure_restore`)."""
    command = [sys.executable, str(Path(__file__).with_name("run.py")), "restore-one", method, str(size)]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(json.loads(output.strip().splitlines()[-1])["seconds"]) * 1000


def mixture_restore_ratio(size: int, repeats: int) -> float:
    """A mixture of 8 sources (decimal weights) over a plain dataset, from the loader ``train_dataloader()``
    returns to the first batch after a restore, in fresh processes: the ratio of the medians."""
    plain = statistics.median(fresh_restore_ms("plain", size) for _ in range(repeats))
    return statistics.median(fresh_restore_ms("mixture", size) for _ in range(repeats)) / plain


def seeding_us(batches: int) -> float:
    free = IndexDataset(64)
    wrapped = SampleSeededDataset(free)
    keys = [(index, 10**12 + index) for index in range(32)]
    bare = per_call_us(lambda: [free[index] for index, _ in keys], batches, 3) / 32
    return per_call_us(lambda: wrapped.fetch(keys, restore_globals=False), batches, 3) / 32 - bare


def throughput_ratio(size: int, repeats: int) -> float:
    """Ours over ``DistributedSampler``'s indices per second, rank 0 of 2, best of ``repeats`` each."""
    dataset = IndexDataset(size)
    theirs, ours = [], []
    for epoch in range(repeats):
        reference = DistributedSampler(dataset, 2, 0, seed=1)
        reference.set_epoch(epoch)
        theirs.append(epoch_seconds(reference))
        sampler = ResumableSampler(dataset, 2, 0, seed=1)
        sampler.set_epoch(epoch)
        ours.append(epoch_seconds(sampler))
    return min(theirs) / min(ours)


def oversubscribed_ratio(size: int, repeats: int) -> float:
    """`throughput_ratio` with torch's default intra-op threads while two busy processes hold the cores.

    The scheduler preempts either sampler's epoch at random there: best of 2 once measured 0.95x in CI
    where its median is about 1.9x, so each side takes the best of ``repeats`` (5 in both modes).
    """
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # torch's default
    try:
        return throughput_ratio(size, repeats)
    finally:
        torch.set_num_threads(threads)
        for process in busy:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)


def state_bytes() -> int:
    """Bytes the data state (without fingerprints) adds to a ``torch.save`` checkpoint."""
    sampler = ResumableSampler(IndexDataset(10**9), 1024, 0, seed=2**31 - 1, batch_size=32)
    sampler.set_epoch(999)

    def saved(callbacks: dict[str, object]) -> int:
        buffer = io.BytesIO()
        torch.save({"callbacks": callbacks}, buffer)
        return len(buffer.getvalue())

    return saved({"ResumableDataCallback": {"train": sampler.state_dict(12345)}}) - saved({})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI)")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON too")
    quick = parser.parse_args().quick
    torch.set_num_threads(1)
    checks = [
        ("restore at 10^9 samples to the first batch", restore_ms(), "ms", "<", 50.0),
        (
            "a mixture of 8: restore at 10^9, period 16384",
            restore_ms("mixture-longest-period"),
            "ms",
            "<",
            # Nearly all of it is building the period's table (16,384 offsets in a Python loop), which this
            # VM has run in 16 ms (2026-12-02) and in 37-44 ms (2026-12-04, the same code, idle), 51 ms with
            # the cores shared: 50 ms failed CI. A replay of 10^9 samples, the regression to catch, takes seconds.
            150.0,
        ),
        (
            "a mixture at 10^7 / a plain dataset (fresh)",
            mixture_restore_ratio(10**7, 3 if quick else 5),  # medians: one fresh process measured 2.7x
            "x",
            "<",
            # Issue 26's 2x in the full run. In CI's quick mode a loose bound: on 2026-12-03 medians of 3 fresh
            # processes measured 1.2x to 2.4x on the same code (2.34x on the code before issue 35), so 2x there
            # failed CI at random: the mixture's restore is about 2x a plain dataset's on this machine now (1.31x
            # when issue 26 measured it), a gap for the benchmark table, not for a random red CI.
            3.0 if quick else 2.0,
        ),
        ("per-sample seeding of the global generators", seeding_us(1000 if quick else 5000), "µs", "<", 25.0),
        ("epoch indices vs DistributedSampler (x faster)", throughput_ratio(10**6, 2 if quick else 5), "x", ">=", 1.0),
        (
            "the same, default threads, 2 busy processes",
            oversubscribed_ratio(10**6 if quick else 2 * 10**6, 5),  # best of 5: the spinning processes preempt it
            "x",
            ">=",
            1.0,
        ),
        ("bytes the data state adds to a checkpoint", float(state_bytes()), "B", "<", 1024.0),
    ]
    print(f"torch {torch.__version__}, 1 thread; {'quick' if quick else 'full'} mode")
    print(f"| {'measurement':<48} | {'measured':>12} | {'bound':>10} | verdict |")
    print(f"|{'-' * 50}|{'-' * 14}|{'-' * 12}|---------|")
    failed = 0
    for name, value, unit, relation, bound in checks:
        ok = value < bound if relation == "<" else value >= bound
        failed += not ok
        print(f"| {name:<48} | {value:>9.2f} {unit:<2} | {relation} {bound:>7g} | {'ok' if ok else 'MISSED':>7} |")
    if parser.parse_args().json:
        print(json.dumps({name: value for name, value, *_ in checks}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

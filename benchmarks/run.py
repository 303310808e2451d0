"""Benchmarks: ``python benchmarks/run.py`` prints one table per measurement (several minutes).

Split as Lightning's ``tests/parity_pytorch``: the timing code (`timing.py`), the workloads
(`workloads.py`), these tables, and a parity check with loose bounds that CI runs in its quick mode
(`parity.py`).

1. Restore to first batch, and peak memory, at N = 1M, 10M, 100M, 1B samples (2 ranks, batch 32,
   resuming at 90% of the epoch), each in a fresh process: ours (and a ``Mixture`` of 8 sources of N
   samples together, with decimal weights and with weights the longest period rounds) against torch's
   ``DistributedSampler`` fast-forwarded by ``StatefulDataLoader`` and torchdata's
   ``StatefulDistributedSampler``. The alternatives are run up to 10M: they hold the epoch's
   permutation as a Python list (about 36 bytes per sample on this rank), so 100M and 1B would need
   several to tens of GB and minutes.
2. Whole-epoch index throughput against ``DistributedSampler`` (N = 10M, 1 and 2 ranks).
3. Bytes the data state adds to a checkpoint.
4. Per-step cost of the callback and mixin in a real Lightning run (steps per second with and
   without them, and with the audit log, same data, alternating runs); the audit log's own work.
5. Per-sample seeding: the cost per sample of seeding the three global generators (in a worker,
   and in the main process, where their state is also saved and restored around each batch), of the
   explicit ``sample_rng()`` generators, and of the per-step reseed, next to a realistic
   ``__getitem__`` (random crop and flip of a 3x224x224 uint8 image).
6. Resume verification: the cost of fingerprinting the next batch at a save and of checking it at
   a resume, at batch sizes 32-256 of such images, next to ``torch.save`` of a ResNet-50-sized model.
7. Standard samplers (``WeightedRandomSampler``, ``RandomSampler(replacement=True)``,
   ``SubsetRandomSampler``): restore to the first batch at 90% of the epoch, ours against Lightning's
   ``DistributedSamplerWrapper``, which materialises ``list(sampler)`` on every ``iter()`` and then
   has to skip the consumed indices (2 ranks, batch 32, in this process, best of 3).

8. Streams: per-batch cost of the stream loader (its state recorded before every batch, each
   sample seeded) against torchdata's ``StatefulDataLoader`` over the same stateful stream, with 0 and
   2 workers (and without per-sample seeding, to separate its cost from the state's), and the time
   from a restore at the middle of the stream to its first batch.

9. A ``Mixture`` of 8 sources: from the loader ``train_dataloader()`` returns to the first batch after
   a restore, at N = 10M and 1B, each in a fresh process, against a plain dataset through the same
   window (the library's build, the owner's restore, the first batch); decimal weights, and weights
   the longest period (16384) rounds, whose interleave table is built in the restore.

``--quick`` runs smaller sizes, for a smoke test.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_resumable import ResumableSampler, SampleSeededDataset, sample_rng
from lightning_resumable.core.randomness import seed_global_generators, seed_training_step
from lightning_resumable.core.verification import check_fingerprints, fingerprint_next_batch
from lightning_resumable.format.state import DataState

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its sibling modules
from timing import epoch_seconds, per_call_us
from workloads import (
    BATCH_SIZE,
    RESUME_FRACTION,
    WORLD_SIZE,
    CountingStream,
    CropFlip,
    IndexDataset,
    lightning_steps_per_second,
    measure_restore,
)

RESTORE_REPEATS = 3
"""Fresh processes per (method, N); the table shows the median."""
METHODS = ("lightning_resumable", "DistributedSampler+StatefulDataLoader", "StatefulDistributedSampler")
MIXTURES = ("mixture", "mixture-longest-period")
"""A `Mixture` of 8 sources of N samples together (`workloads.MIXTURE_WEIGHTS`), against the same
window for a plain dataset (``plain``): from the loader ``train_dataloader()`` returns to the first batch."""


# ------------------------------------------------------------------------- 1. restore to first batch
def restore_table(sizes: list[int], alternatives_up_to: int) -> None:
    where = f"{WORLD_SIZE} ranks, batch {BATCH_SIZE}, at {RESUME_FRACTION:.0%} of the epoch"
    print(f"\n1. Restore to first batch ({where}; median of {RESTORE_REPEATS} fresh processes)")
    print(f"{'N':>14} | {'method':<38} | {'restore->batch':>14} | {'peak MB':>8} | {'ours faster by':>14}")
    print("-" * 100)
    for size in sizes:
        results: dict[str, dict[str, float]] = {}
        for method in METHODS:
            if method != "lightning_resumable" and size > alternatives_up_to:
                print(f"{size:>14,} | {method:<38} | {'not run: the permutation list does not fit':>42}")
                continue
            command = [sys.executable, __file__, "restore-one", method, str(size)]
            runs = []
            for _ in range(RESTORE_REPEATS):
                output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
                runs.append(json.loads(output.strip().splitlines()[-1]))
            results[method] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            ours = results["lightning_resumable"]["seconds"]
            ratio = "" if method == "lightning_resumable" else f"{results[method]['seconds'] / ours:,.0f}x"
            print(
                f"{size:>14,} | {method:<38} | {results[method]['seconds'] * 1000:>11.2f} ms"
                f" | {results[method]['peak_mb']:>8.1f} | {ratio:>14}"
            )


def fresh_process_restore(method: str, size: int) -> dict[str, float]:
    """The median of `RESTORE_REPEATS` restores of ``method`` at ``size``, each in a fresh process."""
    command = [sys.executable, __file__, "restore-one", method, str(size)]
    runs = [
        json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
        for _ in range(RESTORE_REPEATS)
    ]
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def mixture_restore_table(sizes: list[int]) -> None:
    print(
        f"\n9. A Mixture of 8 sources: from the loader train_dataloader() returns to the first batch after a restore"
        f" at {RESUME_FRACTION:.0%} of an epoch of N samples ({WORLD_SIZE} ranks, batch {BATCH_SIZE}; median of"
        f" {RESTORE_REPEATS} fresh processes), against a plain dataset of N samples through the same window"
    )
    print(f"{'N':>14} | {'train input':<44} | {'to first batch':>14} | {'peak MB':>8} | {'x the plain one':>15}")
    print("-" * 107)
    labels = {
        "plain": "DataLoader(dataset, shuffle=True)",
        "mixture": "Mixture, decimal weights (period 100)",
        "mixture-longest-period": "Mixture, weights rounded (period 16384)",
    }
    for size in sizes:
        plain = fresh_process_restore("plain", size)
        for method, label in labels.items():
            found = plain if method == "plain" else fresh_process_restore(method, size)
            ratio = "" if method == "plain" else f"{found['seconds'] / plain['seconds']:.2f}x"
            milliseconds = found["seconds"] * 1000
            print(f"{size:>14,} | {label:<44} | {milliseconds:>11.2f} ms | {found['peak_mb']:>8.1f} | {ratio:>15}")


# ---------------------------------------------------------------------------------- 2. throughput
def throughput_table(size: int, repeats: int) -> None:
    print(f"\n2. Whole-epoch index throughput, N = {size:,} (best of {repeats}, alternating)")
    print(f"{'ranks':>5} | {'DistributedSampler':>22} | {'lightning_resumable':>22} | {'ours / theirs':>13}")
    print("-" * 72)
    dataset = IndexDataset(size)
    for world_size in (1, 2):
        theirs, ours = [], []
        for epoch in range(repeats):
            reference = DistributedSampler(dataset, world_size, 0, seed=1)
            reference.set_epoch(epoch)
            theirs.append(epoch_seconds(reference))
            sampler = ResumableSampler(dataset, world_size, 0, seed=1)
            sampler.set_epoch(epoch)
            ours.append(epoch_seconds(sampler))
        per_rank = len(sampler)
        theirs_rate, ours_rate = per_rank / min(theirs) / 1e6, per_rank / min(ours) / 1e6
        print(
            f"{world_size:>5} | {theirs_rate:>15.2f} M idx/s | {ours_rate:>15.2f} M idx/s"
            f" | {min(theirs) / min(ours):>12.2f}x"
        )


# ---------------------------------------------------------------------------------- 3. state size
def state_size_table() -> None:
    sampler = ResumableSampler(IndexDataset(10**9), 1024, 0, seed=2**31 - 1, batch_size=BATCH_SIZE)
    sampler.set_epoch(999)
    state = {"train": sampler.state_dict(12345)}

    def saved_bytes(callbacks: dict[str, Any]) -> int:
        buffer = io.BytesIO()
        torch.save({"callbacks": callbacks}, buffer)
        return len(buffer.getvalue())

    added = saved_bytes({"ResumableDataCallback": state}) - saved_bytes({})
    print("\n3. Data state in the checkpoint (N = 1B, 1024 ranks, epoch 999)")
    print(f"   as JSON: {len(json.dumps(state))} bytes; added to a torch.save checkpoint: {added} bytes")


# ------------------------------------------------------------------------------- 4. step overhead
def loader_microseconds_per_batch(sampler: Any, batches: int, seeded: bool = False, restore: bool = False) -> float:
    """CPU time per batch of 8; ``seeded`` wraps the dataset as the mixin does (``restore``: seed_steps=False)."""
    dataset: Dataset[Any] = IndexDataset(1_000_000)
    if seeded:
        dataset = SampleSeededDataset(dataset, restore_globals=restore)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    iterator = iter(loader)
    next(iterator)  # the first chunk of indices is computed here, not per step
    start = time.process_time()
    for _ in range(batches):
        next(iterator)
    return (time.process_time() - start) / batches * 1e6


def overhead_table(steps: int, rounds: int) -> None:
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    variants = ["plain", "plain+empty_callback", "lightning_resumable", "lightning_resumable+audit"]
    lightning_steps_per_second("plain", steps)  # warm-up: first-run costs land on no variant
    rates: dict[str, list[float]] = {variant: [] for variant in variants}
    for round_index in range(rounds):
        shift = round_index % len(variants)
        rotated = variants[shift:] + variants[:shift]
        for variant in rotated:
            rates[variant].append(lightning_steps_per_second(variant, steps))
    from torch.utils.data import RandomSampler

    dataset = IndexDataset(1_000_000)
    plain_us = min(loader_microseconds_per_batch(RandomSampler(dataset), 20_000) for _ in range(rounds))
    ours_us = min(loader_microseconds_per_batch(ResumableSampler(dataset, 1, 0), 20_000) for _ in range(rounds))
    keyed = ResumableSampler(dataset, 1, 0, sample_keys=True)
    seeded_us = min(loader_microseconds_per_batch(keyed, 20_000, seeded=True) for _ in range(rounds))
    restored_us = min(loader_microseconds_per_batch(keyed, 20_000, seeded=True, restore=True) for _ in range(rounds))

    def added(us: float) -> str:
        return f"{us:.1f} us ({us - plain_us:+.1f} us)"

    print(f"\n4a. Loader CPU time per batch of 8, num_workers=0, a dataset that costs nothing (best of {rounds}):")
    print(f"    DataLoader(shuffle=True) {plain_us:.1f} us; with ResumableSampler {added(ours_us)};")
    print(f"    as the mixin builds it (keyed sampler + SampleSeededDataset): {added(seeded_us)};")
    print(f"    the same with seed_steps=False (generators put back after each batch): {added(restored_us)}.")
    print("    The callback's per-batch work is the step reseed (see 5).")
    setup = f"1 process, tiny model, {steps} steps, {rounds} rotating rounds"
    print(f"\n4b. Steps per second in a real Lightning run ({setup}; CPU time, noisy on a VM)")
    plain = statistics.median(rates["plain"])
    for variant in variants:
        median = statistics.median(rates[variant])
        runs = ", ".join(f"{rate:,.0f}" for rate in rates[variant])
        print(f"   {variant:<26} median {median:>7,.0f} steps/s  {(plain - median) / plain:+6.1%} vs plain  ({runs})")
    audit_table(rounds)


def audit_table(rounds: int) -> None:
    """The audit log's own work per step: the batch's indices (from the stream) and one flushed line."""
    from lightning_resumable.format.audit import AuditLog

    sampler = ResumableSampler(IndexDataset(1_000_000), 2, 0, batch_size=BATCH_SIZE, sample_keys=True)
    handed_out = iter(sampler)
    for _ in range(1002 * BATCH_SIZE):  # the loader's frontier, two batches ahead of the trainer
        next(handed_out)
    calls = 2000
    indices_us = min(per_call_us(lambda: sampler.batch_indices(1000), calls, 1) for _ in range(rounds))
    computed_us = min(per_call_us(lambda: sampler.batch_indices(10), calls, 1) for _ in range(rounds))
    folder = tempfile.mkdtemp(prefix="audit_")
    log = AuditLog(folder, 0)
    ids = list(range(BATCH_SIZE))
    write_us = min(per_call_us(lambda: log.write(1, 1000, ids), calls, 1) for _ in range(rounds))
    log.close()
    shutil.rmtree(folder)
    print(f"\n4c. Audit log per step (batch {BATCH_SIZE}, best of {rounds}): the batch's indices {indices_us:.1f} us")
    print(f"    (read from the chunks the sampler handed out; {computed_us:.1f} us when computed from the stream),")
    print(f"    one JSON line written and flushed {write_us:.1f} us; {indices_us + write_us:.1f} us a step in all.")


# ---------------------------------------------------------------------------- 5. per-sample seeding
def seeding_table(calls: int, rounds: int) -> None:
    """The overhead is measured on a dataset that costs nothing, so it is not lost in the noise of a real one."""
    free = IndexDataset(64)
    wrapped = SampleSeededDataset(free)
    explicit = SampleSeededDataset(free, seed_globals=False)
    realistic = CropFlip()
    keys = [(index, 10**12 + index) for index in range(32)]
    batches = calls // 32

    def per_sample(function: Any) -> float:
        return per_call_us(function, batches, rounds) / 32

    bare_us = per_sample(lambda: [free[index] for index, _ in keys])
    main_us = per_sample(lambda: wrapped.fetch(keys, restore_globals=True)) - bare_us
    # In a worker nothing is put back: the same path as restore_globals=False.
    worker_us = per_sample(lambda: wrapped.fetch(keys, restore_globals=False)) - bare_us
    explicit_us = per_sample(lambda: explicit.fetch(keys)) - bare_us
    getitem_us = per_sample(lambda: [realistic[index] for index, _ in keys])
    seed_us = per_call_us(lambda: seed_global_generators(123456789123), calls, rounds)
    torch_manual_seed_us = per_call_us(lambda: torch.manual_seed(123456789123), calls // 10, rounds)
    torch_rng_us = per_call_us(lambda: sample_rng_cost("torch"), calls, rounds)
    numpy_rng_us = per_call_us(lambda: sample_rng_cost("numpy"), calls // 4, rounds)
    step_us = per_call_us(lambda: seed_training_step(7, 3, 1234), calls, rounds)
    print(f"\n5. Per-sample seeding (best of {rounds}; microseconds per sample, batches of 32)")
    print(f"   a realistic __getitem__ (random crop + flip of 3x224x224 uint8):  {getitem_us:6.1f} us")
    print("   added per sample by SampleSeededDataset:")
    for label, added in [
        ("seeding torch CPU + random + NumPy (workers; default)", worker_us),
        ("the same, generators put back per batch (seed_steps=False)", main_us),
        ("no global seeding (seed_samples=False), sample_rng() ready", explicit_us),
    ]:
        print(f"     {label:<60} {added:6.1f} us  ({added / getitem_us:5.1%} of the __getitem__)")
    print(f"   one seed_global_generators call: {seed_us:.1f} us", end=" ")
    print(f"(torch.manual_seed alone: {torch_manual_seed_us:.1f} us, as it also seeds every accelerator backend)")
    print(f"   sample_rng().torch on first use in a sample: {torch_rng_us:.1f} us;", end=" ")
    print(f"sample_rng().numpy (Philox, as Grain): {numpy_rng_us:.1f} us")
    print(f"   per-step reseed (seed_training_step, once per training step): {step_us:.1f} us")


def sample_rng_cost(kind: str) -> None:
    from lightning_resumable.core.randomness import begin_sample, end_sample

    begin_sample(987654321, seed_globals=False)
    try:
        rng = sample_rng()
        _ = rng.torch if kind == "torch" else rng.numpy
    finally:
        end_sample()


# ------------------------------------------------------------------------------ 6. verification
def verification_table(batch_sizes: list[int], rounds: int) -> None:
    import io

    from torch.utils.data import default_collate

    print(f"\n6. Resume verification: fingerprint of the next batch (best of {rounds}; 1 process, crops as in 5)")
    print(f"{'batch':>6} | {'at a save':>10} | {'at a resume':>11} | {'per sample':>10} | batch bytes")
    print("-" * 62)
    for batch_size in batch_sizes:
        dataset = CropFlip(size=100_000)
        sampler = ResumableSampler(dataset, 1, 0, seed=7, batch_size=batch_size, sample_keys=True)
        loader = DataLoader(
            SampleSeededDataset(dataset), batch_size=batch_size, sampler=sampler, collate_fn=default_collate
        )
        state = DataState(7, 3, 40_000, 40_000 // batch_size, 100_000, True, False, batch_size, 1)
        saved = [fingerprint_next_batch(loader, state, 0, 1)]
        save_ms = per_call_us(lambda: fingerprint_next_batch(loader, state, 0, 1), 3, rounds) / 1000  # noqa: B023
        resume_ms = per_call_us(lambda: check_fingerprints(loader, state, saved, 0, 1), 3, rounds) / 1000  # noqa: B023
        print(
            f"{batch_size:>6} | {save_ms:>7.1f} ms | {resume_ms:>8.1f} ms | {save_ms * 1000 / batch_size:>7.0f} us |"
            f" {batch_size * 3 * 224 * 224 / 1e6:.1f} MB"
        )
    weights = {f"layer{i}": torch.randn(1_000_000) for i in range(25)}  # 25M float32, ResNet-50-sized
    buffer = io.BytesIO()
    start = time.perf_counter()
    torch.save(weights, buffer)
    save_ms = (time.perf_counter() - start) * 1000
    print(f"   for scale: torch.save of 25M float32 parameters (a ResNet-50) to memory: {save_ms:.0f} ms")


# --------------------------------------------------------------------------- 7. standard samplers
def standard_sampler_table(sizes: list[int], rounds: int) -> None:
    import itertools

    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from torch.utils.data import RandomSampler, SubsetRandomSampler, WeightedRandomSampler

    from lightning_resumable.readers.build import make_resumable

    print(f"\n7. Standard samplers: restore to first batch at 90% (2 ranks, batch 32; best of {rounds}, in process)")
    print(f"{'N':>12} | {'sampler':<28} | {'ours':>9} | {'DistributedSamplerWrapper':>25} | {'ours faster by':>14}")
    print("-" * 100)
    for size in sizes:
        dataset = IndexDataset(size)
        samplers = {
            "WeightedRandomSampler": WeightedRandomSampler(torch.rand(size, dtype=torch.float64), size),
            "RandomSampler(replacement)": RandomSampler(dataset, replacement=True),
            "SubsetRandomSampler (half)": SubsetRandomSampler(range(0, size, 2)),
        }
        for name, sampler in samplers.items():
            per_rank = -(-len(sampler) // WORLD_SIZE)
            batches_done = int(per_rank * RESUME_FRACTION) // BATCH_SIZE
            loader = make_resumable(
                DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler), seed=1, num_replicas=WORLD_SIZE, rank=0
            )
            ours_sampler: Any = loader.sampler
            state = ours_sampler.state_dict(batches_done)

            def ours() -> None:
                ours_sampler.load_state_dict(state)  # noqa: B023
                next(iter(ours_sampler))  # noqa: B023

            wrapper = DistributedSamplerWrapper(sampler, num_replicas=WORLD_SIZE, rank=0, shuffle=False)

            def theirs() -> None:
                next(itertools.islice(iter(wrapper), batches_done * BATCH_SIZE, None))  # noqa: B023

            ours_ms = per_call_us(ours, 1, rounds) / 1000
            theirs_ms = per_call_us(theirs, 1, rounds) / 1000
            print(
                f"{size:>12,} | {name:<28} | {ours_ms:>6.2f} ms | {theirs_ms:>22.1f} ms |"
                f" {theirs_ms / ours_ms:>13,.0f}x"
            )


# ------------------------------------------------------------------------------------- 8. streams
def stream_table(size: int, rounds: int) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lightning_resumable.readers.streams import make_stream_resumable

    def loaders(workers: int) -> dict[str, Any]:
        def theirs() -> Any:
            return StatefulDataLoader(CountingStream(size), batch_size=BATCH_SIZE, num_workers=workers)

        def ours(seed_samples: bool = True) -> Any:
            user = DataLoader(CountingStream(size), batch_size=BATCH_SIZE, num_workers=workers)
            return make_stream_resumable(
                user, seed=1, rank=0, seed_samples=seed_samples, restore_globals=False, epoch_source=lambda: 0
            )

        return {"StatefulDataLoader": theirs, "ours": ours, "ours, unseeded": lambda: ours(seed_samples=False)}

    batches = size // BATCH_SIZE
    print(f"\n8. Streams: {size:,} ids, batch {BATCH_SIZE}, a stream that costs nothing (best of {rounds})")
    print(f"{'workers':>7} | {'loader':<18} | {'µs a batch':>10} | {'restore at 50% to first batch':>29}")
    print("-" * 75)
    for workers in (0, 2):
        for name, build in loaders(workers).items():
            per_batch, restore = [], []
            for _ in range(rounds):
                loader = build()
                start = time.perf_counter()
                for position, _ in enumerate(loader):
                    if position == batches // 2:
                        mine = name.startswith("ours")
                        state = loader.state_after(position + 1) if mine else loader.state_dict()
                per_batch.append((time.perf_counter() - start) / batches * 1e6)
                restored = build()
                start = time.perf_counter()
                if name.startswith("ours"):
                    restored.resume_from(state, batches // 2 + 1)
                else:
                    restored.load_state_dict(state)
                next(iter(restored))
                restore.append((time.perf_counter() - start) * 1000)
            print(f"{workers:>7} | {name:<18} | {min(per_batch):>10.1f} | {min(restore):>26.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description="lightning-resumable benchmarks")
    parser.add_argument("command", nargs="?", default="all", choices=["all", "restore-one"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--only", type=int, nargs="*", help="run only these numbered measurements")
    options = parser.parse_args()
    if options.command == "restore-one":
        method, size = options.args
        print(json.dumps(measure_restore(method, int(size))))
        return
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread per process; times are wall-clock on this machine")
    quick = options.quick
    measurements = {
        1: lambda: restore_table(
            [10**4, 10**5] if quick else [10**6, 10**7, 10**8, 10**9], alternatives_up_to=10**5 if quick else 10**7
        ),
        2: lambda: throughput_table(10**5 if quick else 10**7, repeats=2 if quick else 5),
        3: state_size_table,
        4: lambda: overhead_table(steps=300 if quick else 2000, rounds=1 if quick else 6),
        5: lambda: seeding_table(calls=640 if quick else 6400, rounds=1 if quick else 5),
        6: lambda: verification_table([32] if quick else [32, 64, 128, 256], rounds=1 if quick else 3),
        7: lambda: standard_sampler_table([10**5] if quick else [10**6, 10**7], rounds=1 if quick else 3),
        8: lambda: stream_table(3_200 if quick else 64_000, rounds=1 if quick else 3),
        9: lambda: mixture_restore_table([10**5] if quick else [10**7, 10**9]),
    }
    for number, measure in measurements.items():
        if not options.only or number in options.only:
            measure()


if __name__ == "__main__":
    main()

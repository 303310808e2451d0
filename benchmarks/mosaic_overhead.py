"""What the library adds per batch to MosaicML Streaming's own loader: ``python benchmarks/mosaic_overhead.py``.

Needs ``streaming`` (without torchvision, as in CI's CPU environment:
``PYTHONPATH=tests/mosaic_site python benchmarks/mosaic_overhead.py``). Writes 9,600 samples (a
64-float array each) as MDS shards, then reads one epoch in batches of 32 through Mosaic's
``StreamingDataLoader`` and through the `MosaicLoader` the library makes of it (its state handed to
the dataset before the pass, each sample under its own seed, each batch kept for its digest), with
0 and 2 workers, alternating, best of 3 epochs each; prints a table of microseconds per batch and
the ratio. One process, the CPU build of torch, one intra-op thread.
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import streaming
import torch

from lightning_resumable.readers.mosaic import make_mosaic_resumable

SAMPLES, BATCH_SIZE, ROUNDS = 9_600, 32, 3


def own_loader(shards: str, workers: int) -> Any:
    """Mosaic's loader over the shards, shuffled."""
    dataset = streaming.StreamingDataset(local=shards, shuffle=True, shuffle_seed=1, batch_size=BATCH_SIZE)
    return streaming.StreamingDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=workers)


def epoch_us_per_batch(loader: Any) -> float:
    start, batches = time.perf_counter(), 0
    for _ in loader:
        batches += 1
    return (time.perf_counter() - start) / batches * 1e6


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="mosaic_overhead_") as tmp:
        shards = str(Path(tmp) / "shards")
        with streaming.MDSWriter(out=shards, columns={"id": "int", "x": "ndarray:float32:64"}) as writer:
            for sample_id in range(SAMPLES):
                writer.write({"id": sample_id, "x": np.full(64, sample_id, np.float32)})
        print(f"\n{SAMPLES:,} samples of 64 floats, batches of {BATCH_SIZE}, one epoch, best of {ROUNDS}")
        print("| workers | Mosaic's loader (µs/batch) | made resumable (µs/batch) | ratio |")
        print("|---|---|---|---|")
        for workers in (0, 2):
            resumable = make_mosaic_resumable(
                own_loader(shards, workers), seed=1, epoch_source=lambda: 0, rank=0, world_size=1
            )
            own = own_loader(shards, workers)
            times: dict[str, float] = {"own": float("inf"), "resumable": float("inf")}
            for _ in range(ROUNDS):
                times["own"] = min(times["own"], epoch_us_per_batch(own))
                times["resumable"] = min(times["resumable"], epoch_us_per_batch(resumable))
            ratio = times["resumable"] / times["own"]
            print(f"| {workers} | {times['own']:,.0f} | {times['resumable']:,.0f} | {ratio:.2f}x |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

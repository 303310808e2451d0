"""What the library adds per batch to LitData's own loader: ``python benchmarks/litdata_overhead.py``.

Needs ``litdata``. Writes 9,600 samples (a 64-float tensor each) as LitData chunks, then reads one
epoch in batches of 32 through LitData's ``StreamingDataLoader`` and through the `LitDataLoader` the
library makes of it (its state recorded before each batch, each sample under its own seed), with 0
and 2 workers, alternating, best of 3 epochs each; prints a table of microseconds per batch and the
ratio. One process, the CPU build of torch, one intra-op thread.
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import litdata
import torch

from lightning_resumable.readers.litdata import make_litdata_resumable

SAMPLES, BATCH_SIZE, ROUNDS = 9_600, 32, 3


def row(sample_id: int) -> dict[str, Any]:
    return {"id": sample_id, "x": torch.full((64,), float(sample_id))}


def own_loader(chunks: str, workers: int) -> Any:
    """LitData's loader over the chunks, shuffled (workers forked: ``litdata.optimize`` sets spawn)."""
    context = {"multiprocessing_context": "fork"} if workers else {}
    dataset = litdata.StreamingDataset(chunks, shuffle=True, seed=1)
    return litdata.StreamingDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=workers, **context)


def epoch_us_per_batch(loader: Any) -> float:
    start, batches = time.perf_counter(), 0
    for _ in loader:
        batches += 1
    return (time.perf_counter() - start) / batches * 1e6


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="litdata_overhead_") as tmp:
        chunks = str(Path(tmp) / "chunks")
        litdata.optimize(fn=row, inputs=list(range(SAMPLES)), output_dir=chunks, chunk_size=200, num_workers=2)
        print(f"\n{SAMPLES:,} samples of 64 floats, batches of {BATCH_SIZE}, one epoch, best of {ROUNDS}")
        print("| workers | LitData's loader (µs/batch) | made resumable (µs/batch) | ratio |")
        print("|---|---|---|---|")
        for workers in (0, 2):
            resumable = make_litdata_resumable(own_loader(chunks, workers), seed=1, epoch_source=lambda: 0)
            own = own_loader(chunks, workers)
            times: dict[str, float] = {"own": float("inf"), "resumable": float("inf")}
            for _ in range(ROUNDS):
                times["own"] = min(times["own"], epoch_us_per_batch(own))
                times["resumable"] = min(times["resumable"], epoch_us_per_batch(resumable))
            ratio = times["resumable"] / times["own"]
            print(f"| {workers} | {times['own']:,.0f} | {times['resumable']:,.0f} | {ratio:.2f}x |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""A restore on another layout against one on the same: ``python benchmarks/elsewhere_restore.py`` (issue 55).

Needs ``litdata``. Writes 40,000 samples (a 64-float tensor each) as LitData chunks of 200, reads part of an epoch
through the `LitDataLoader` the library makes of LitData's loader (batches of 32, 2 workers), takes its state at
batch 300, and times, from the restore to the first batch read: a loader of the same layout (LitData's own state,
LitData's own resume) and one with batches of 64 (the epoch's order computed from LitData's plan, its rest dealt
in global batches of 64 and read by chunk and index: `readers/litdata_elsewhere.py`). Also LitData's own loader's
first batch of a fresh epoch, for scale. Best of 3, one process, the CPU build of torch, one intra-op thread.
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

from lightning_resumable.format.envelope import StreamState
from lightning_resumable.readers.litdata import make_litdata_resumable

SAMPLES, BATCH_SIZE, WORKERS, STOP, ROUNDS = 40_000, 32, 2, 300, 3


def row(sample_id: int) -> dict[str, Any]:
    return {"id": sample_id, "x": torch.full((64,), float(sample_id))}


def own_loader(chunks: str, batch_size: int) -> Any:
    """LitData's loader over the chunks, shuffled (workers forked: ``litdata.optimize`` sets spawn)."""
    dataset = litdata.StreamingDataset(chunks, shuffle=True, seed=1)
    return litdata.StreamingDataLoader(
        dataset, batch_size=batch_size, num_workers=WORKERS, multiprocessing_context="fork"
    )


def saved_at_stop(chunks: str) -> StreamState:
    """The state of a layout of batches of 32 after `STOP` batches of its first epoch, as the callback saves it."""
    loader = make_litdata_resumable(own_loader(chunks, BATCH_SIZE), seed=1, epoch_source=lambda: 0)
    batches = iter(loader)
    for _ in range(STOP + 1):  # Lightning reads one batch ahead
        next(batches)
    state = loader.state_after(STOP)
    loader.retire_workers()
    return StreamState(1, 0, STOP, 1, WORKERS, False, False, [state], reader="litdata", batch_size=BATCH_SIZE)


def seconds_to_first_batch(chunks: str, saved: StreamState | None, batch_size: int) -> float:
    """From the restore of ``saved`` (``None``: a fresh epoch of LitData's own loader) to the first batch read."""
    start = time.perf_counter()
    if saved is None:
        own = own_loader(chunks, batch_size)
        next(iter(own))
        took = time.perf_counter() - start
        del own
        return took
    loader = make_litdata_resumable(own_loader(chunks, batch_size), seed=1, epoch_source=lambda: 0)
    start = time.perf_counter()
    state = loader.state_for_rank(saved, 0, 1)
    loader.resume_from(state, saved.batches)
    next(iter(loader))
    took = time.perf_counter() - start
    loader.retire_workers()
    return took


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="elsewhere_restore_") as tmp:
        chunks = str(Path(tmp) / "chunks")
        litdata.optimize(fn=row, inputs=list(range(SAMPLES)), output_dir=chunks, chunk_size=200, num_workers=2)
        saved = saved_at_stop(chunks)
        cases = {
            "LitData's own loader, a fresh epoch": (None, BATCH_SIZE),
            "restored on the same layout (batches of 32)": (saved, BATCH_SIZE),
            "restored on another layout (batches of 64)": (saved, 2 * BATCH_SIZE),
        }
        best = {name: min(seconds_to_first_batch(chunks, *case) for _ in range(ROUNDS)) for name, case in cases.items()}
        same = best["restored on the same layout (batches of 32)"]
        print(
            f"\n{SAMPLES:,} samples, chunks of 200, {WORKERS} workers, restored after {STOP} batches; best of {ROUNDS}"
        )
        print("| from the restore to the first batch | seconds | x the same layout's |")
        print("|---|---:|---:|")
        for name, seconds in best.items():
            print(f"| {name} | {seconds:.3f} | {seconds / same:.2f}x |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

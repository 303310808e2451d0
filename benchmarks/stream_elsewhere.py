"""A stream restored on another layout: ``python benchmarks/stream_elsewhere.py`` (issue 55).

Two streams of 24,000 samples (an id and 512 bytes each) in 16 shards, each read through the loader the library makes
of a torch ``DataLoader`` (2 workers each): a WebDataset pipeline (needs ``webdataset``: tar shards,
``wds.WebDataset(urls, shardshuffle=16, nodesplitter=split_by_node).shuffle(500).decode().map(...)``) and a Hugging
Face stream (``Dataset.to_iterable_dataset(num_shards=16).shuffle(buffer_size=500)``, split by node, a ``map``).
The first layout is 2 processes with batches of 32 (its ranks read one after the other in this process); its state
is taken after 150 batches of the epoch. Timed, best of 3:

- from the restore to the first batch: rank 0 on the same layout (its own state), and 1 process with batches of 64
  (the epoch's rest in the first layout's global order, `readers/stream_elsewhere.py`);
- the rest of the epoch read on that other layout (each of its workers reads every partition of the first layout
  and keeps its own batches), against a fresh epoch of the same stream on it (its own order), in samples per
  second: the price of the interrupted epoch's order on another layout, paid for that epoch only;
- a fresh epoch on that other layout of the stream declaring the first layout as its order
  (``resumable_stream_order``): the price of that order, paid for every epoch on another layout.

One process, the CPU build of torch, one intra-op thread; workers forked.
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import webdataset as wds
from torch.utils.data import DataLoader

from lightning_resumable.format.stream_state import STREAM_ORDER_ATTRIBUTE, StreamState
from lightning_resumable.readers.build import make_resumable

SHARDS, PER_SHARD, BUFFER, WORKERS, STOP, ROUNDS = 16, 1_500, 500, 2, 150, 3
FIRST, OTHER = (2, 32), (1, 64)  # (processes, batch size)


def decoded(sample: dict[str, Any]) -> tuple[int, torch.Tensor]:
    return int(sample["txt"]), torch.frombuffer(bytearray(sample["bin"]), dtype=torch.uint8).float()


def hf_decoded(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "x": torch.frombuffer(bytearray(row["bin"]), dtype=torch.uint8).float()}


def stream_of(source: Any, rank: int, world: int) -> Any:
    """The WebDataset pipeline over ``source`` (a list of tar URLs), or the Hugging Face stream of ``source`` (a
    ``datasets.Dataset``), for ``rank`` of ``world``."""
    if isinstance(source, list):
        return (
            wds.WebDataset(source, shardshuffle=len(source), nodesplitter=wds.split_by_node, seed=1, empty_check=False)
            .shuffle(BUFFER)
            .decode()
            .map(decoded)
        )
    from datasets.distributed import split_dataset_by_node

    stream = source.to_iterable_dataset(num_shards=SHARDS).shuffle(seed=1, buffer_size=BUFFER).map(hf_decoded)
    return split_dataset_by_node(stream, rank=rank, world_size=world)


def loader(source: Any, rank: int, layout: tuple[int, int], declared: bool = False) -> Any:
    """``declared``: the stream declares `FIRST` as its order."""
    world, batch = layout
    stream = stream_of(source, rank, world)
    if declared:
        setattr(stream, STREAM_ORDER_ATTRIBUTE, (FIRST[0], WORKERS, FIRST[1]))
    plain = DataLoader(stream, batch_size=batch, num_workers=WORKERS, multiprocessing_context="fork")
    return make_resumable(plain, seed=1, num_replicas=world, rank=rank, epoch_source=lambda: 0)


def saved_at_stop(source: Any) -> StreamState:
    """Each rank of the first layout after `STOP` batches of its epoch, as the callback saves them."""
    states = []
    for rank in range(FIRST[0]):
        each = loader(source, rank, FIRST)
        batches = iter(each)
        for _ in range(STOP + 1):  # Lightning reads one batch ahead
            next(batches)
        states.append(each.state_after(STOP))
        del batches
        each.retire_workers()
    return StreamState(1, 0, STOP, FIRST[0], WORKERS, False, False, states, batch_size=FIRST[1])


def restored(source: Any, saved: StreamState, layout: tuple[int, int]) -> Any:
    each = loader(source, 0, layout)
    each.resume_from(each.state_for_rank(saved, 0, layout[0]), saved.batches)
    return each


def seconds_to_first_batch(source: Any, saved: StreamState, layout: tuple[int, int]) -> float:
    start = time.perf_counter()
    each = restored(source, saved, layout)
    next(iter(each))
    took = time.perf_counter() - start
    each.retire_workers()
    return took


def samples_per_second(source: Any, saved: StreamState | None, declared: bool = False) -> float:
    """The rest of the epoch restored on `OTHER` (``saved``), or a fresh epoch on it (``None``; ``declared``: in the
    order of `FIRST`)."""
    each = loader(source, 0, OTHER, declared) if saved is None else restored(source, saved, OTHER)
    start, samples = time.perf_counter(), 0
    for batch in each:
        samples += len(batch["id"] if isinstance(batch, dict) else batch[0])
    took = time.perf_counter() - start
    each.retire_workers()
    return samples / took


def measured(name: str, source: Any) -> None:
    saved = saved_at_stop(source)
    same = min(seconds_to_first_batch(source, saved, FIRST) for _ in range(ROUNDS))
    other = min(seconds_to_first_batch(source, saved, OTHER) for _ in range(ROUNDS))
    rest = max(samples_per_second(source, saved) for _ in range(ROUNDS))
    fresh = max(samples_per_second(source, None) for _ in range(ROUNDS))
    declared = max(samples_per_second(source, None, declared=True) for _ in range(ROUNDS))
    print(
        f"\n{name}: {SHARDS * PER_SHARD:,} samples in {SHARDS} shards, a buffer of {BUFFER}, {WORKERS} workers; the"
        f" first layout {FIRST[0]} x {FIRST[1]}, saved after {STOP} batches; best of {ROUNDS}"
    )
    print("| from the restore to the first batch | seconds | x the same layout's |")
    print("|---|---:|---:|")
    print(f"| restored on the same layout ({FIRST[0]} x {FIRST[1]}) | {same:.3f} | 1.00x |")
    print(f"| restored on another layout ({OTHER[0]} x {OTHER[1]}) | {other:.3f} | {other / same:.2f}x |")
    print(f"\n| read on {OTHER[0]} x {OTHER[1]} | samples/s | x a fresh epoch's |")
    print("|---|---:|---:|")
    print(f"| a fresh epoch (its own order) | {fresh:,.0f} | 1.00x |")
    print(f"| the interrupted epoch's rest (the first layout's order) | {rest:,.0f} | {rest / fresh:.2f}x |")
    print(f"| a fresh epoch declared in the first layout's order | {declared:,.0f} | {declared / fresh:.2f}x |")


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    import datasets

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="stream_elsewhere_") as tmp:
        with wds.ShardWriter(str(Path(tmp) / "shard-%02d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
            for sample_id in range(SHARDS * PER_SHARD):
                sink.write({"__key__": f"s{sample_id:06d}", "txt": str(sample_id), "bin": bytes(512)})
        measured("A WebDataset pipeline", sorted(str(path) for path in Path(tmp).glob("shard-*.tar")))
    rows = datasets.Dataset.from_dict(
        {"id": list(range(SHARDS * PER_SHARD)), "bin": [bytes(512)] * (SHARDS * PER_SHARD)}
    )
    measured("A Hugging Face stream", rows)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""A stream shuffled through a buffer, taken over by windows: its mixing, its state and its restore.

``python benchmarks/stream_shuffle.py`` prints two tables (docs/performance.md holds a run's):

- Mixing, for the same ``buffer_size``: the library's windows against the buffer they replace, Hugging
  Face ``datasets``' (its real ``.shuffle(seed, buffer_size)``, its interleave of up to 10 shards) and
  WebDataset's (its ``_shuffle`` over shards read one after the other, if installed): how far a sample
  moves from its place in the stream read in order (the epoch's shard order, shard after shard), and
  how often neighbouring samples come from one shard. Over many shards a worker reads, and over one.
- State and restore, ``buffer_size`` 10^4 over a Hugging Face stream of 10^6 text samples (100 shards,
  one worker): the checkpoint bytes of the library's state against the buffer's contents as datasets
  PR #8408 would save them (the samples themselves, pickled), the samples read again at a restore
  (at the worst place: a window's last sample), and the time to the first sample after a restore
  against a fresh start. ``--samples`` and ``--buffer`` change the sizes.
"""

from __future__ import annotations

import argparse
import itertools
import pickle
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lightning_resumable.readers.hugging_face import take_over_buffers

SHARD_STRIDE = 10**9
"""A sample's id is ``shard * SHARD_STRIDE + its row``: its shard and row, read back from the id."""


def hf_stream(shards: int, rows: int, text: int = 0, reads: list[int] | None = None) -> Any:
    import datasets

    def generate(shards: list[int]) -> Iterator[dict[str, Any]]:
        for shard in shards:
            for row in range(rows):
                if reads is not None:
                    reads[0] += 1
                sample: dict[str, Any] = {"id": shard * SHARD_STRIDE + row}
                if text:
                    sample["text"] = f"{shard}:{row} " * (text // 8)
                yield sample

    return datasets.IterableDataset.from_generator(generate, gen_kwargs={"shards": list(range(shards))})


def mixing(ids: list[int], shard_order: list[int], rows: int) -> dict[str, float]:
    """Displacement from the place in the stream read in order, and the same-shard neighbour rate."""
    rank = {shard: number for number, shard in enumerate(shard_order)}
    in_order = np.array([rank[i // SHARD_STRIDE] * rows + i % SHARD_STRIDE for i in ids])
    moved = np.abs(np.arange(len(ids)) - in_order)
    shards = np.array([i // SHARD_STRIDE for i in ids])
    return {
        "median": float(np.median(moved)),
        "mean": float(moved.mean()),
        "p99": float(np.percentile(moved, 99)),
        "same shard": float((shards[1:] == shards[:-1]).mean()),
    }


def hf_orders(shards: int, rows: int, buffer: int) -> tuple[list[int], list[int], list[int]]:
    """datasets' own order, the library's, and the shard order both read (shard after shard)."""
    shuffled = hf_stream(shards, rows).shuffle(seed=3, buffer_size=buffer)
    own = [row["id"] for row in shuffled]
    windows = [row["id"] for row in take_over_buffers(shuffled, 0, 0, False)]
    unshuffled = shuffled._ex_iterable.ex_iterable  # the shards in datasets' order, shard after shard
    first_rows = [key for key, _ in itertools.islice(iter(_sequential(unshuffled)), 0, None, rows)]
    return own, windows, [i // SHARD_STRIDE for i in first_rows]


def _sequential(chain: Any) -> Any:
    while type(chain).__name__ != "ExamplesIterable":
        chain = chain.ex_iterable
    chain._init_state_dict()
    return ((example["id"], example) for _, example in chain)


def wds_orders(shards: int, rows: int, buffer: int) -> tuple[list[int], list[int]] | None:
    """WebDataset's buffer over the shards read in order, and the library's windows over them read 4 side by side."""
    try:
        from webdataset import filters
    except ImportError:
        return None
    from lightning_resumable.core.window_shuffle import INTERLEAVED_SOURCES, fresh_place, read_shuffled

    stream = [shard * SHARD_STRIDE + row for shard in range(shards) for row in range(rows)]
    own = list(filters._shuffle(iter(stream), bufsize=buffer, initial=buffer, seed=3))
    groups = max(1, min(shards, INTERLEAVED_SOURCES))
    bounds = [shards * n // groups for n in range(groups + 1)]

    class Group:
        def __init__(self, first: int, last: int) -> None:
            self.items = [s * SHARD_STRIDE + r for s in range(first, last) for r in range(rows)]

        def open(self, position: Any) -> Iterator[int]:
            return iter(self.items)

        def position(self) -> Any:
            return None

    sources = [Group(bounds[n], bounds[n + 1]) for n in range(groups)]
    return own, list(read_shuffled(sources, buffer, 3, fresh_place(groups), seed_reads=False))


def mixing_table(buffer: int) -> list[str]:
    lines = [
        f"Mixing, buffer_size {buffer}: displacement from the place in the stream read in order (samples),"
        " and neighbours from one shard",
        f"{'stream':44} {'shuffle':18} {'median':>9} {'mean':>9} {'p99':>9} {'same shard':>11}",
    ]
    for shards, rows in ((64, 2_000), (1, 64_000)):
        setup = f"{shards} shard{'s' if shards > 1 else ''} of {rows:,}"
        own, windows, order = hf_orders(shards, rows, buffer)
        for name, ids in (("datasets' buffer", own), ("library's windows", windows)):
            row = mixing(ids, order, rows)
            lines.append(
                f"{'Hugging Face, ' + setup:44} {name:18} {row['median']:9.0f} {row['mean']:9.0f} {row['p99']:9.0f}"
                f" {row['same shard']:11.2f}"
            )
        orders = wds_orders(shards, rows, buffer)
        if orders is not None:
            for name, ids in zip(("WebDataset's buffer", "library's windows"), orders, strict=True):
                row = mixing(ids, list(range(shards)), rows)
                lines.append(
                    f"{'WebDataset, ' + setup:44} {name:18} {row['median']:9.0f} {row['mean']:9.0f}"
                    f" {row['p99']:9.0f} {row['same shard']:11.2f}"
                )
    return lines


def timed(first: Callable[[], Any]) -> float:
    start = time.perf_counter()
    first()
    return time.perf_counter() - start


def shortened(sample: dict[str, Any]) -> dict[str, Any]:
    """A ``.map`` (as a user's pipeline has one): its stage adds its own fields to each worker's state."""
    return {"id": sample["id"], "length": len(sample.get("text", ""))}


def checkpoint_json_per_worker(shuffled: Any, samples: int) -> int:
    """The JSON bytes a checkpoint holds per worker (what ``inspect --json`` shows) for ``shuffled`` with a ``.map``,
    read by the library's loader (2 workers, batch 50) to about ``samples`` samples in all."""
    import json

    from torch.utils.data import DataLoader

    from lightning_resumable.readers.build import make_resumable

    dataset = shuffled.map(shortened)
    loader = make_resumable(
        DataLoader(dataset, batch_size=50, num_workers=2), seed=5, num_replicas=1, rank=0, epoch_source=lambda: 0
    )
    batches = samples // 50
    iterator = iter(loader)
    for _ in range(batches + 1):  # one read ahead, as Lightning reads: the state after ``batches`` is recorded
        next(iterator)
    workers = loader.state_after(batches)["_snapshot"]["_worker_snapshots"].values()
    del iterator
    loader.retire_workers()
    return max(len(json.dumps(worker)) for worker in workers)


def restore_table(samples: int, buffer: int) -> list[str]:
    """The state's bytes, the samples read again and the time to the first sample after a restore."""
    from lightning_resumable.readers import hf_windows

    shards = 100
    rows = samples // shards
    generated, inner = [0], [0]
    opened = hf_windows._Inner.open

    def counted(self: Any, position: Any) -> Iterator[Any]:  # the samples the windows read
        for sample in opened(self, position):
            inner[0] += 1
            yield sample

    hf_windows._Inner.open = counted  # type: ignore[method-assign]
    shuffled = hf_stream(shards, rows, text=512, reads=generated).shuffle(seed=3, buffer_size=buffer)
    stream = take_over_buffers(shuffled, 0, 0, False)
    at = 5 * buffer - 1  # a window's last sample but one: the worst place, the window read again
    yielded = list(itertools.islice(iter(stream), at))
    state = stream.state_dict()
    in_window = state["examples_iterable"]["yielded"]
    buffered = yielded[-min(buffer, len(yielded)) :]  # as many samples as the buffer holds, as #8408 saves them
    fresh_s = statistics.median(timed(lambda: next(iter(take_over_buffers(shuffled, 0, 0, False)))) for _ in range(3))
    restored_s = []
    for _ in range(3):
        resumed = take_over_buffers(shuffled, 0, 0, False)
        resumed.load_state_dict(state)
        generated[0] = inner[0] = 0
        restored_s.append(timed(lambda resumed=resumed: next(iter(resumed))))
    hf_windows._Inner.open = opened  # type: ignore[method-assign]
    return [
        f"State and restore: buffer_size {buffer:,} over a Hugging Face stream of {samples:,} text samples"
        f" ({shards} shards of {rows:,}, 10 read side by side), restored after {at:,} samples",
        f"{'checkpoint bytes per worker, the library (pickled state)':58} {len(pickle.dumps(state)):>12,}",
        f"{'  as the checkpoint holds it: JSON, with a .map, 2 workers':58}"
        f" {checkpoint_json_per_worker(shuffled, 2 * at):>12,}",
        f"{'checkpoint bytes per worker, the buffer (PR #8408)':58} {len(pickle.dumps(buffered)):>12,}",
        f"{'samples the restore reads into its window':58} {inner[0]:>12,}",
        f"{'  of which yielded before the checkpoint (read again)':58} {in_window:>12,}",
        f"{'rows datasets generates to seek its shards (its own cost)':58} {generated[0] - inner[0]:>12,}",
        f"{'time to the first sample, fresh start (s)':58} {fresh_s:>12.3f}",
        f"{'time to the first sample, restored (s)':58} {statistics.median(restored_s):>12.3f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10**6)
    parser.add_argument("--buffer", type=int, default=10**4)
    parser.add_argument("--mixing-buffer", type=int, default=1_000)
    arguments = parser.parse_args()
    print("\n".join(mixing_table(arguments.mixing_buffer)))
    print()
    print("\n".join(restore_table(arguments.samples, arguments.buffer)))


if __name__ == "__main__":
    main()

"""A stream read through the library against the same pipeline read by its own library: samples per second.

``python benchmarks/stream_throughput.py`` prints one table (docs/performance.md holds a run's): each stream the
library reads, shuffled as its library shuffles it, one epoch in batches of 32, with 0, 2 and 4 workers, read
as its library reads it (a ``DataLoader`` over it) and through the loader the library makes of that loader
(`make_resumable` as the callback calls it by default: its state recorded before each batch, each sample under
its own seed, the buffer replaced by windows of the same size), the two alternating, best of ``--rounds`` epochs each:

- a Hugging Face stream (``Dataset.to_iterable_dataset(num_shards=32)`` of 64-float rows, ``.shuffle(seed,
  buffer_size=1000)``), as Python rows and ``.with_format("torch")``: ``datasets``' own buffer against the
  library's windows;
- a WebDataset pipeline (32 tar shards of ``.npy`` rows, ``.shuffle(1000)``, decoded), if installed;
- LitData's ``StreamingDataLoader`` over a shuffled ``StreamingDataset`` (chunks of 200 rows), if installed.

The last column reads the same loader made with ``seed_samples=False`` (no seeding of the global generators before
each sample: for a stream that draws nothing from them), in the same rounds: what the seeding costs.

One process, the CPU build of torch, one intra-op thread; workers forked. The chunked LLM mixture against
LitData's ``CombinedStreamingDataset`` is ``benchmarks/llm_mixture.py``'s table.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from lightning_resumable.readers.build import make_resumable

BATCH_SIZE, BUFFER, SHARDS, FEATURES = 32, 1_000, 32, 64


def hf_loader(samples: int, workers: int, _: Path, torch_format: bool = False) -> DataLoader[Any]:
    import datasets

    rows = datasets.Dataset.from_dict(
        {"id": list(range(samples)), "x": np.arange(samples * FEATURES, dtype=np.float32).reshape(samples, FEATURES)}
    )
    stream = rows.to_iterable_dataset(num_shards=SHARDS).shuffle(seed=1, buffer_size=BUFFER)
    if torch_format:
        stream = stream.with_format("torch")
    return DataLoader(stream, batch_size=BATCH_SIZE, num_workers=workers, **_forked(workers))


def hf_torch_loader(samples: int, workers: int, root: Path) -> DataLoader[Any]:
    return hf_loader(samples, workers, root, torch_format=True)


def web_dataset_loader(samples: int, workers: int, root: Path) -> DataLoader[Any]:
    import webdataset as wds

    shards = root / "wds"
    if not shards.exists():
        shards.mkdir()
        with wds.ShardWriter(str(shards / "shard-%03d.tar"), maxcount=samples // SHARDS, verbose=0) as sink:
            for sample in range(samples):
                features = io.BytesIO()
                np.save(features, np.full(FEATURES, sample, dtype=np.float32))
                sink.write({"__key__": f"{sample:08d}", "cls": str(sample).encode(), "npy": features.getvalue()})
    urls = [str(path) for path in sorted(shards.glob("*.tar"))]
    pipeline = wds.WebDataset(urls, shardshuffle=len(urls), seed=1).shuffle(BUFFER).decode()
    return DataLoader(pipeline, batch_size=BATCH_SIZE, num_workers=workers, **_forked(workers))


def litdata_loader(samples: int, workers: int, root: Path) -> Any:
    import litdata

    chunks = root / "litdata"
    if not chunks.exists():
        litdata.optimize(fn=_litdata_row, inputs=list(range(samples)), output_dir=str(chunks), chunk_size=200)
    dataset = litdata.StreamingDataset(str(chunks), shuffle=True, seed=1)
    return litdata.StreamingDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=workers, **_forked(workers))


def _litdata_row(sample: int) -> dict[str, Any]:
    return {"id": sample, "x": torch.full((FEATURES,), float(sample))}


def _forked(workers: int) -> dict[str, Any]:
    return {"multiprocessing_context": "fork"} if workers else {}


STREAMS: dict[str, tuple[str, Callable[[int, int, Path], Any]]] = {
    "Hugging Face, .shuffle(buffer_size=1000)": ("datasets", hf_loader),
    "Hugging Face, .shuffle(buffer_size=1000), .with_format('torch')": ("datasets", hf_torch_loader),
    "WebDataset, .shuffle(1000)": ("webdataset", web_dataset_loader),
    "LitData's loader, shuffle=True": ("litdata", litdata_loader),
}


def samples_per_second(loader: Any) -> tuple[float, int]:
    start, samples = time.perf_counter(), 0
    for batch in loader:
        samples += len(batch["__key__"] if "__key__" in batch else batch["id"])
    return samples / (time.perf_counter() - start), samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4])
    arguments = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(f"\n{arguments.samples:,} samples of {FEATURES} floats, batches of {BATCH_SIZE}, best of {arguments.rounds}")
    print(
        "| stream | workers | its own library (samples/s) | through the library (samples/s) | x its own"
        " | x its own, seed_samples=False |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="stream_throughput_") as tmp:
        for name, (package, make) in STREAMS.items():
            if importlib.util.find_spec(package) is None:
                print(f"| {name} | - | ({package} is not installed) | | |")
                continue
            for workers in arguments.workers:
                own = make(arguments.samples, workers, Path(tmp))
                # restore_globals=False: as the callback builds it by default (seed_steps=True reseeds every step)
                readers = {"own": own}
                for which, seeded in (("library", True), ("unseeded", False)):
                    made = make(arguments.samples, workers, Path(tmp))
                    options = {"seed": 1, "num_replicas": 1, "rank": 0, "restore_globals": False}
                    readers[which] = make_resumable(made, seed_samples=seeded, **options)
                best = dict.fromkeys(readers, 0.0)
                for _ in range(arguments.rounds):
                    for which, loader in readers.items():
                        rate, samples = samples_per_second(loader)
                        assert samples == arguments.samples, f"{name}: {which} read {samples} samples"
                        best[which] = max(best[which], rate)
                ratio, unseeded = best["library"] / best["own"], best["unseeded"] / best["own"]
                print(
                    f"| {name} | {workers} | {best['own']:,.0f} | {best['library']:,.0f} | {ratio:.2f}x"
                    f" | {unseeded:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""The LLM pretraining data path against LitData's own loader: ``python benchmarks/llm_mixture.py [--quick]``.

Needs ``litdata``. Writes two token datasets with ``litdata.optimize`` (``TokensLoader``, blocks of 256
int32 tokens, chunks of 1,024 blocks: 1 MB), "web" and "code", and reads their 0.7/0.3 mixture as users
write it, ``StreamingDataLoader(CombinedStreamingDataset([web, code], weights=[0.7, 0.3],
iterate_over_all=False))``, in two ways in the same run, one process, batches of 32:

- **LitData**: LitData's own loader;
- **Mixture**: the loader the library makes of it (`lightning_resumable.readers.build.build_resumable`:
  the equivalent ``Mixture``, each source read chunk by chunk, windows of 4 chunks).

Each reads LitData's epoch (the samples until its first source runs out, the same count for both), the
chunks fetched from a "remote" directory (a ``counted:`` URL: LitData's local downloader, each fetch
logged) into a cache directory of its own, so every chunk fetch is counted; the cache's size is polled
every 10 ms for its peak. With 0 and 2 workers (forked), best of ``ROUNDS`` epochs for the speed.

Then the restore: from ``build_resumable`` of a weighted combined dataset's loader to its first batch,
restored at 90% of an epoch of 10^8 token blocks (two ``Chunked`` sources of 7 * 10^7 and 3 * 10^7
blocks in chunks of 10^4, blocks made on the fly: the cost is the library's, not a read), median of 5.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import types
import warnings
from pathlib import Path
from typing import Any

import litdata
import torch
from litdata.streaming import downloader as litdata_downloader
from litdata.streaming.downloader import LocalDownloaderWithCache, register_downloader
from litdata.streaming.resolver import Dir

from lightning_resumable import Chunked, Mixture
from lightning_resumable.readers.base import BuildOptions
from lightning_resumable.readers.build import build_resumable

BLOCK, BLOCKS_PER_CHUNK, BATCH_SIZE = 256, 1024, 32
SOURCES = {"web": (48, 0.7), "code": (24, 0.3)}  # chunks, weight
FETCH_LOG = "LLM_MIXTURE_FETCH_LOG"


class CountedDownloader(LocalDownloaderWithCache):  # type: ignore[misc]  # litdata is untyped
    """LitData's local downloader under its own URL prefix (``counted:``); `counted_copy` counts its fetches."""

    def download_file(self, remote_filepath: str, local_filepath: str) -> None:
        super().download_file(remote_filepath.replace("counted:", "local:"), local_filepath)


def counted_copy(source: str, destination: str) -> Any:
    """``shutil.copy`` as LitData's downloader calls it (under its lock, when the chunk is not cached yet),
    each chunk copied appended to ``$LLM_MIXTURE_FETCH_LOG``: the fetches, in every process."""
    if source.endswith(".bin"):
        with open(os.environ[FETCH_LOG], "a") as log:
            log.write(Path(source).name + "\n")
    return shutil.copy2(source, destination)


def chunk_of_blocks(chunk: int) -> torch.Tensor:
    """Chunk ``chunk``'s tokens: block ``b`` of the dataset starts with ``b`` (to check what was read)."""
    blocks = torch.arange(chunk * BLOCKS_PER_CHUNK, (chunk + 1) * BLOCKS_PER_CHUNK, dtype=torch.int32)
    return blocks.repeat_interleave(BLOCK)


def write(root: Path) -> None:
    for name, (chunks, _) in SOURCES.items():
        if not (root / name / "index.json").exists():
            litdata.optimize(
                fn=chunk_of_blocks, inputs=list(range(chunks)), output_dir=str(root / name),
                chunk_size=BLOCK * BLOCKS_PER_CHUNK, item_loader=litdata.TokensLoader(), num_workers=1,
            )  # fmt: skip


def users_loader(root: Path, cache: Path, workers: int) -> Any:
    datasets = [
        litdata.StreamingDataset(
            Dir(path=str(cache / name), url=f"counted:{root / name}"),
            item_loader=litdata.TokensLoader(block_size=BLOCK),
            shuffle=True,
            seed=3,
        )
        for name in SOURCES
    ]
    weights = [weight for _, weight in SOURCES.values()]
    combined = litdata.CombinedStreamingDataset(datasets, seed=3, weights=weights, iterate_over_all=False)
    context = {"multiprocessing_context": "fork"} if workers else {}
    return litdata.StreamingDataLoader(combined, batch_size=BATCH_SIZE, num_workers=workers, **context)


class CachePeak:
    """The peak bytes of chunk files under a directory, polled every 10 ms on a thread."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.peak, self._stop = directory, 0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.01):
            size = 0
            for path in self.directory.rglob("*.bin"):
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    size += path.stat().st_size
            self.peak = max(self.peak, size)

    def __enter__(self) -> CachePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def read(loader: Any, samples: int | None) -> tuple[int, float]:
    """Read ``loader`` until ``samples`` (``None``: its end); the samples read and the seconds taken."""
    start, read_so_far = time.perf_counter(), 0
    for batch in loader:
        read_so_far += len(batch)
        if samples is not None and read_so_far >= samples:
            break
    return read_so_far, time.perf_counter() - start


def one_epoch(root: Path, tmp: Path, how: str, workers: int, samples: int | None, round_: int) -> dict[str, float]:
    cache = tmp / f"cache-{how}-{workers}-{round_}"
    log = tmp / f"fetches-{how}-{workers}-{round_}.log"
    log.touch()
    os.environ[FETCH_LOG] = str(log)
    loader = users_loader(root, cache, workers)
    if how == "Mixture":
        loader = build_resumable(loader, BuildOptions(seed=3, num_replicas=1, rank=0)).loader
    with CachePeak(cache) as peak:
        read_count, seconds = read(loader, samples)
    return {
        "samples": read_count,
        "per_second": read_count / seconds,
        "fetches": len(log.read_text().splitlines()),
        "peak_mb": peak.peak / 2**20,
    }


class Blocks:
    """``size`` token blocks made on the fly (block ``b`` starts with ``b``): a source of 10^8 without the disk."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((BLOCK,), index, dtype=torch.int32)


def restore_ms(total: int) -> float:
    """From ``build_resumable`` to the first batch, restored at 90% of an epoch of ``total`` blocks."""
    from torch.utils.data import DataLoader

    from lightning_resumable.format.envelope import MixtureRecord, MixtureState
    from lightning_resumable.format.loader_state import LoaderState
    from lightning_resumable.format.state import DataState
    from lightning_resumable.lightning.mixture_owner import MixtureOwner

    web, code = int(total * 0.7), total - int(total * 0.7)
    sources = {"web": Chunked(Blocks(web), 10_000), "code": Chunked(Blocks(code), 10_000)}
    mixture = Mixture(sources, {"web": 0.7, "code": 0.3})
    start = time.perf_counter()
    built = build_resumable(DataLoader(mixture, batch_size=BATCH_SIZE), BuildOptions(seed=3, num_replicas=2, rank=1))
    owner = MixtureOwner(built.loader)
    batches = int(0.9 * total) // (2 * BATCH_SIZE)
    data = DataState(
        seed=3, epoch=0, position=batches * 2 * BATCH_SIZE, batches=batches, dataset_size=total, shuffle=True,
        drop_last=False, batch_size=BATCH_SIZE, world_size=2, draws="mixture", cycle=0, drop_last_batch=False,
        anchor_position=0, anchor_batches=0, stream_length=total,
    )  # fmt: skip
    chunks = {name: chunked.digest() for name, chunked in mixture.chunks.items()}
    record = MixtureRecord(
        0, batches, 0, 10, {"web": 7, "code": 3}, {"web": 0, "code": 0}, {"web": web, "code": code}, chunks
    )
    owner.restore(MixtureState(LoaderState(data), record), 0, False, lambda *arguments: None)
    batch = next(iter(built.loader))
    elapsed = (time.perf_counter() - start) * 1000
    assert int(batch[0][0]) >= 0
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round each")
    options = parser.parse_args()
    rounds = 1 if options.quick else 3
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    register_downloader("counted:", CountedDownloader, overwrite=True)
    litdata_downloader.shutil = types.SimpleNamespace(
        copy=counted_copy, copyfile=shutil.copyfile, copyfileobj=shutil.copyfileobj
    )
    # As from object storage: LitData 0.2.76 reads any local directory "POSIX-fast" (memory maps evicted
    # by its prefetch thread), where its own loader crashed here (SIGSEGV) in 2 of 3 runs.
    os.environ["LITDATA_POSIX_FAST"] = "0"
    with tempfile.TemporaryDirectory(prefix="llm_mixture_") as name:
        tmp = Path(name)
        write(tmp / "data")
        rows = []
        for workers in (0, 2):
            results: dict[str, list[dict[str, float]]] = {"LitData": [], "Mixture": []}
            for round_ in range(rounds):
                own = one_epoch(tmp / "data", tmp, "LitData", workers, None, round_)
                results["LitData"].append(own)
                results["Mixture"].append(one_epoch(tmp / "data", tmp, "Mixture", workers, int(own["samples"]), round_))
            rows.append((workers, results))
        chunks = sum(count for count, _ in SOURCES.values())
        print(f"\n0.7/0.3 mixture of {chunks} chunks of {BLOCKS_PER_CHUNK} blocks of {BLOCK} tokens (1 MB each),")
        print(
            f"batches of {BATCH_SIZE}, one process, LitData's epoch (until its first source runs out), best of {rounds}"
        )
        print("| workers | loader | samples/s | x LitData | chunk fetches/epoch | x LitData | peak cache (MB) |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        for workers, results in rows:
            own_best = max(each["per_second"] for each in results["LitData"])
            own_fetches = statistics.median(each["fetches"] for each in results["LitData"])
            for how in ("LitData", "Mixture"):
                best = max(each["per_second"] for each in results[how])
                fetches = statistics.median(each["fetches"] for each in results[how])
                peak = max(each["peak_mb"] for each in results[how])
                print(
                    f"| {workers} | {how} | {best:,.0f} | {best / own_best:.2f}x | {fetches:.0f} |"
                    f" {fetches / own_fetches:.2f}x | {peak:.0f} |"
                )
    total = 10**8
    times = sorted(restore_ms(total) for _ in range(1 if options.quick else 5))
    median = statistics.median(times)
    print(f"\nrestore at 90% of an epoch of {total:,} token blocks, to the first batch: median {median:.1f} ms", end="")
    print(f" (min {times[0]:.1f}, max {times[-1]:.1f})")


if __name__ == "__main__":
    sys.exit(main())

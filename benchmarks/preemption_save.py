"""What a preemption's save costs on the exception path, against the world size (simulated ranks).

``python benchmarks/preemption_save.py`` builds the loader the mixin builds for rank 0 of ``W`` ranks
over a dataset whose ``__getitem__`` takes 1 ms (a decode), batch 8, and times, for each ``W``:

- before (0.2.x): the save from the exception path had rank 0 fetch and fingerprint the next batch of
  every rank itself (no rank may wait for another there): ``W`` batch fetches, on the one rank;
- now: where the ranks act on the signal together, each rank fingerprints its own next batch (one
  fetch, on every rank at once; plus a gather of 16-byte digests, not simulated here), and the save on
  the exception path writes what was captured.

Prints a table: the first column grows with ``W``, the second stays flat.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.verification import fingerprint_next_batch
from lightning_resumable.readers.build import make_resumable


class Decoded(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.001)  # a JPEG decode
        return torch.full((3, 8, 8), float(index))


def seconds(world_size: int, ranks_fetched: int) -> float:
    loader = make_resumable(DataLoader(Decoded(), batch_size=8, shuffle=True), seed=1, num_replicas=world_size, rank=0)
    sampler = loader.sampler
    assert isinstance(sampler, ResumableSampler)
    state = sampler.data_state(100)
    start = time.perf_counter()
    for rank in range(ranks_fetched):
        fingerprint_next_batch(loader, state, rank, world_size)
    return time.perf_counter() - start


def main() -> None:
    print("| world size | before: rank 0 fingerprints every rank's batch | now: each rank its own |")
    print("|---:|---:|---:|")
    for world_size in (1, 8, 64, 256, 1024):
        before = seconds(world_size, world_size) if world_size <= 256 else seconds(world_size, 64) * world_size / 64
        now = seconds(world_size, 1)
        estimated = " (from 64 ranks)" if world_size > 256 else ""
        print(f"| {world_size} | {before:.2f} s{estimated} | {now * 1000:.1f} ms |")


if __name__ == "__main__":
    main()

"""The timing code of the benchmarks: wall-clock per call, per epoch, and peak memory."""

from __future__ import annotations

import resource
import time
from typing import Any


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def per_call_us(function: Any, calls: int, rounds: int) -> float:
    """Best of ``rounds`` of the mean wall-clock microseconds per call."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def epoch_seconds(sampler: Any) -> float:
    start = time.perf_counter()
    for _ in sampler:
        pass
    return time.perf_counter() - start

"""The order in which a mixture's sources take turns: a deterministic low-discrepancy interleave.

Promise: for sources with whole-number parts ``n_1..n_k`` of a period ``D = n_1 + ... + n_k``, the
source at every offset, and every source's count before it, is a pure function of the parts and
the offset, computed in O(1) from one table of the period (no replay). Every source's count in the
first ``t`` offsets stays within ``1 - 1/(2k - 2)`` of ``n_i t / D`` (Tijdeman's bound, best possible
for every k), so in **any window** of ``n`` consecutive offsets it is within ``2 - 1/(k - 1)`` of
``n_i n / D``: within 1 for two sources, under 2 for any number. (Within 1 for every window cannot
be had for three sources or more: no sequence of ten offsets holds it for weights 8:2:1, which
``tests/test_interleave.py`` shows by exhaustion.) Random draws, by contrast, stray by the square
root of ``n``.

Construction: Tijdeman's earliest-deadline rule ("The chairman assignment problem", Discrete
Mathematics 32, 1980). At offset ``t`` the ``c``-th turn of source ``i`` may be taken once
``n_i (t + 1) / D - c >= 1/(2k - 2)`` and is due by ``(c + 1 - 1/(2k - 2)) D / n_i``; of the turns
that may be taken, the earliest due goes first (ties to the earlier source). Every count returns to
``n_i`` at offset ``D``, so the sequence repeats with period ``D``. Integer arithmetic only: the same
table on every platform. Each period's table is built once per process (16 to 44 ms for the largest,
``MAX_PERIOD`` with 8 sources, on this project's 2-core VM) and kept.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from fractions import Fraction

import torch

from lightning_resumable.errors import MixtureError

__all__ = ["MAX_PERIOD", "Interleave", "interleave", "prefix_bound", "realised_parts", "window_bound"]

MAX_PERIOD = 1 << 14
"""The longest period: weights that no common denominator up to it expresses exactly are rounded to
multiples of ``1 / MAX_PERIOD`` (largest remainders), at most ``1 / MAX_PERIOD`` from the given ones."""


def prefix_bound(sources: int) -> float:
    """How far a source's count in the first ``t`` offsets of a segment may stray from its share of ``t``."""
    return 0.0 if sources < 2 else 1 - 1 / (2 * sources - 2)


def window_bound(sources: int) -> float:
    """How far a source's count in any window of offsets within a segment may stray from its share."""
    return 2 * prefix_bound(sources)


def _exact(weight: object, name: str) -> Fraction:
    if isinstance(weight, bool) or not isinstance(weight, (int, float, Fraction)):
        try:
            weight = float(weight)  # type: ignore[arg-type]  # a NumPy or torch scalar
        except (TypeError, ValueError):
            raise MixtureError(f"the weight of source {name!r} must be a number, got {weight!r:.80}") from None
    if isinstance(weight, float) and not math.isfinite(weight):
        raise MixtureError(f"the weight of source {name!r} must be finite, got {weight}")
    # A float's shortest decimal form: 0.1 is 1/10, as the user wrote it, not the binary double's value.
    exact = Fraction(repr(weight)) if isinstance(weight, float) else Fraction(weight)
    if exact < 0:
        raise MixtureError(f"the weight of source {name!r} must not be negative, got {weight}")
    return exact


def realised_parts(weights: Sequence[tuple[str, object]]) -> tuple[tuple[int, ...], int]:
    """See `_realised_parts`; kept per process for weights of plain numbers (read at every restore)."""
    try:
        return _kept_parts(tuple(weights))
    except TypeError:  # an unhashable weight: refused or parsed as it is
        return _realised_parts(weights)


@functools.lru_cache(maxsize=256)
def _kept_parts(weights: tuple[tuple[str, object], ...]) -> tuple[tuple[int, ...], int]:
    return _realised_parts(weights)


def _realised_parts(weights: Sequence[tuple[str, object]]) -> tuple[tuple[int, ...], int]:
    """Whole-number parts of a period for ``(name, weight)`` pairs, and the period: the weights exactly
    where a common denominator up to `MAX_PERIOD` expresses them (``0.6, 0.3, 0.1`` is ``6, 3, 1`` of
    10), else rounded to that denominator by largest remainders (a positive weight keeps a part).

    Raises:
        MixtureError: a weight is not a finite non-negative number, or none is positive.
    """
    exact = [_exact(weight, name) for name, weight in weights]
    total = sum(exact, Fraction(0))
    if total == 0:
        raise MixtureError(f"at least one source must have a positive weight, got {dict(weights)}")
    shares = [weight / total for weight in exact]
    period = math.lcm(*(share.denominator for share in shares))
    if period <= MAX_PERIOD:
        return tuple(int(share * period) for share in shares), period
    period = MAX_PERIOD
    positive = sum(1 for share in shares if share > 0)
    if positive > period:
        raise MixtureError(f"at most {period} sources may have a positive weight, got {positive}")
    parts = [max(1, math.floor(share * period)) if share > 0 else 0 for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: (-(shares[i] * period - parts[i]), i))
    for i in by_remainder[: period - sum(parts)]:  # the largest remainders take the parts left
        parts[i] += 1
    while sum(parts) > period:  # a part raised to 1 above: take it back from the largest
        parts[max(range(len(parts)), key=lambda i: (parts[i], -i))] -= 1
    return tuple(parts), period


class Interleave:
    """One period of the interleave of sources with ``parts`` (a zero part is never taken).

    Attributes:
        parts: each source's turns per period.
        period: ``sum(parts)``.
        sources: ``(period,)`` int64, the source at each offset of the period.
        earlier: ``(period,)`` int64, how often that source was taken before the offset in the period.
    """

    def __init__(self, parts: Sequence[int]) -> None:
        if not parts or min(parts) < 0 or sum(parts) == 0:
            raise MixtureError(f"an interleave needs non-negative parts, one positive at least, got {list(parts)}")
        self.parts = tuple(int(part) for part in parts)
        self.period = period = sum(self.parts)
        taking = [i for i, part in enumerate(self.parts) if part > 0]
        slack = max(1, 2 * len(taking) - 2)  # 1/(2k - 2): how early a turn may be taken, and how late
        alone = len(taking) == 1
        # Turn c of source i may be taken from offset t on where slack * (n_i (t + 1) - c D) >= D, and is
        # due by (slack c + slack - 1) / (slack n_i). The due times are compared as doubles, which is exact
        # here: numerators and denominators stay below 2**18, so two that differ do so by 2**-36 or more,
        # and two that are equal round alike. Ties go to the lower source.
        waiting = [(0 if alone else self._release(i, 0, slack), i) for i in taking]  # (release offset, source)
        heapq.heapify(waiting)
        ready: list[tuple[float, int]] = []  # (due, source)
        taken = [0] * len(self.parts)
        sources, earlier = [0] * period, [0] * period
        for offset in range(period):
            while waiting and waiting[0][0] <= offset:
                _, i = heapq.heappop(waiting)
                heapq.heappush(ready, ((slack * taken[i] + slack - 1) / (slack * self.parts[i]), i))
            if not ready:  # Tijdeman's theorem: never; a wrong stream is never the fallback
                raise AssertionError(f"no source may take offset {offset} of the interleave of {self.parts}")
            _, best = heapq.heappop(ready)
            sources[offset], earlier[offset] = best, taken[best]
            taken[best] += 1
            if taken[best] < self.parts[best]:  # its next turn in the period
                heapq.heappush(waiting, (0 if alone else self._release(best, taken[best], slack), best))
        self.sources = torch.tensor(sources, dtype=torch.int64)
        self.earlier = torch.tensor(earlier, dtype=torch.int64)
        self._parts = torch.tensor(self.parts, dtype=torch.int64)

    def _release(self, source: int, turn: int, slack: int) -> int:
        """The first offset at which ``turn`` of ``source`` may be taken."""
        part, period = self.parts[source], self.period
        return max(0, -(-(period + slack * turn * period) // (slack * part)) - 1)

    def at(self, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The source at each of ``offsets`` (int64, non-negative) and its count before the offset."""
        whole = torch.div(offsets, self.period, rounding_mode="floor")
        within = offsets - whole * self.period
        sources = self.sources[within]
        return sources, whole * self._parts[sources] + self.earlier[within]

    def counts(self, offset: int) -> list[int]:
        """Every source's count in the first ``offset`` offsets."""
        whole, within = divmod(offset, self.period)
        partial = torch.bincount(self.sources[:within], minlength=len(self.parts)).tolist()
        return [whole * part + extra for part, extra in zip(self.parts, partial, strict=True)]


@functools.lru_cache(maxsize=64)
def interleave(parts: tuple[int, ...]) -> Interleave:
    """The interleave of ``parts``, built once per process."""
    return Interleave(parts)

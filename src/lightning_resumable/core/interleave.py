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
table on every platform. Each period's table is built once per process (under 20 ms for the largest,
``MAX_PERIOD`` with 8 sources) and kept.
"""

from __future__ import annotations

import functools
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
        taken = [0] * len(self.parts)
        sources, earlier = [0] * period, [0] * period
        for offset in range(period):
            best = -1
            for i in taking:
                part, count = self.parts[i], taken[i]
                if len(taking) > 1 and slack * (part * (offset + 1) - count * period) < period:
                    continue  # too early: taking it would put the source a whole turn ahead
                # due by (slack * count + slack - 1) / (slack * part) periods: compare by cross-multiplying
                if (
                    best < 0
                    or (slack * count + slack - 1) * self.parts[best] < (slack * taken[best] + slack - 1) * part
                ):
                    best = i
            if best < 0:  # Tijdeman's theorem: never; a wrong stream is never the fallback
                raise AssertionError(f"no source may take offset {offset} of the interleave of {self.parts}")
            sources[offset], earlier[offset] = best, taken[best]
            taken[best] += 1
        self.sources = torch.tensor(sources, dtype=torch.int64)
        self.earlier = torch.tensor(earlier, dtype=torch.int64)
        self._parts = torch.tensor(self.parts, dtype=torch.int64)

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

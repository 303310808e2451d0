"""A small covering array: every pair of values of every two dimensions appears in some scenario."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

Row = dict[str, Any]


def pairs_of(row: Mapping[str, Any], names: Sequence[str]) -> set[tuple[str, Any, str, Any]]:
    return {(a, row[a], b, row[b]) for a, b in itertools.combinations(names, 2)}


def all_pairs(dimensions: Mapping[str, Sequence[Any]]) -> set[tuple[str, Any, str, Any]]:
    names = list(dimensions)
    return {(a, x, b, y) for a, b in itertools.combinations(names, 2) for x in dimensions[a] for y in dimensions[b]}


def pairwise(dimensions: Mapping[str, Sequence[Any]], shareable: str | None = None) -> list[Row]:
    """Greedy, deterministic: repeatedly take the full-product row that covers the most uncovered pairs.

    With ``shareable``, a row whose other values repeat an earlier row's scores one pair higher:
    rows that differ only in ``shareable`` can share an expensive run.
    """
    names = list(dimensions)
    uncovered = all_pairs(dimensions)
    candidates = [dict(zip(names, values, strict=True)) for values in itertools.product(*dimensions.values())]
    rows: list[Row] = []
    seen: set[tuple[Any, ...]] = set()

    def rest(row: Row) -> tuple[Any, ...]:
        return tuple(value for name, value in row.items() if name != shareable)

    def score(row: Row) -> int:
        return len(pairs_of(row, names) & uncovered) + (shareable is not None and rest(row) in seen)

    while uncovered:
        best = max(candidates, key=score)
        rows.append(best)
        seen.add(rest(best))
        uncovered -= pairs_of(best, names)
    return rows

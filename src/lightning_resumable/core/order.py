"""The order of an epoch: a bijection of ``[0, size)`` computed position by position.

Promise: the dataset index at any position of any epoch is a pure function of
``(seed, epoch, size, position)``. Nothing is stored, nothing is replayed, so starting an epoch at
position ``p`` costs the same as starting it at 0, whatever ``size`` (up to 2**40).

Construction: a Feistel network with modular addition over ``Z_side x Z_side``, ``side`` the
smallest integer with ``side**2 >= size``, three rounds keyed by ``(seed, epoch)``, and cycle walking
to stay inside ``[0, size)``. A Feistel network is a bijection of its domain for any round
function; cycle walking restricts it to a bijection of ``[0, size)``. Fewer than ``2 * side``
values of the domain lie outside, so almost no position walks at all. Three rounds is the
Luby-Rackoff bound for a pseudorandom permutation under forward queries, the only kind a shuffle
answers; the tests check the mixing statistically (uniformity, adjacent correlation, differences).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from lightning_resumable.format._keys import MASK32, domain_key, epoch_order_round_keys

__all__ = ["MAX_SIZE", "EpochOrder", "one_thread", "orders_at", "position_hash", "round_keys"]

MAX_SIZE = 1 << 40
"""The largest dataset the order supports: positions and halves must fit int64 arithmetic."""

_ROUNDS = 3
_MASK32 = MASK32


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch ops on this thread alone. The index path is a few small tensor ops per chunk, which
    pay for intra-op parallelism when the cores are busy with loader workers or other ranks: on a
    busy 2-core machine, 6-18 times slower than on one thread."""
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)


def _hash32(values: torch.Tensor) -> torch.Tensor:
    """A 32-bit multiply-xorshift-multiply hash, in place: the Feistel round function's mixer.

    Its inputs vary only in their low bits (a half of at most 20 bits, xored with a 32-bit key), so
    the first multiply spreads them upward, the shift folds the high bits down, and the second
    multiply spreads again; only the high bits are used afterwards. int64 products may wrap past
    2**63; masking keeps exactly the low 32 bits, so the result is the same on every platform.
    """
    values.mul_(0x85EBCA6B).bitwise_and_(_MASK32)
    values ^= values >> 15
    values.mul_(0xC2B2AE35).bitwise_and_(_MASK32)
    return values


def position_hash(seed: int, epoch: int, positions: torch.Tensor, domain: int) -> torch.Tensor:
    """A 63-bit hash of each position of an epoch, as non-negative int64 values, one stream per ``domain``.

    The low 32 bits are a bijection of ``positions & 0xFFFFFFFF`` for a fixed ``positions >> 32``, so
    no two positions of an epoch of up to 4B share them.
    """
    key = domain_key(seed, domain, epoch)
    low_key, high_key = key & _MASK32, key >> 32
    low = _hash32((positions & _MASK32) ^ low_key)
    low = _hash32(low ^ (positions >> 32) ^ high_key)  # positions >> 32 is 0 below 4B samples
    high = _hash32(low ^ low_key) >> 1  # 31 bits, so the int64 stays non-negative
    return (high << 32) | low


Keys = list[int] | list[torch.Tensor]
"""The round keys of a Feistel pass: one int each, or one per element."""


def _encrypt(values: torch.Tensor, side: int | torch.Tensor, round_keys: Keys) -> torch.Tensor:
    """One pass of the Feistel network over Z_side x Z_side (a bijection of [0, side**2)); ``side`` and
    the keys are one for all values, or one per value."""
    left = torch.div(values, side, rounding_mode="floor")
    right = values - left * side
    for key in round_keys:
        # Lemire's range reduction maps the 32-bit hash onto [0, side) without a division.
        mixed = _hash32(right ^ key).mul_(side).bitwise_right_shift_(32)
        mixed += left
        mixed -= (mixed >= side) * side  # (left + F(right)) mod side, both terms below side
        left, right = right, mixed
    left *= side
    left += right
    return left


def _walked(positions: torch.Tensor, size: int | torch.Tensor, side: int | torch.Tensor, keys: Keys) -> torch.Tensor:
    """The Feistel pass, cycle-walked into ``[0, size)``."""
    indices = _encrypt(positions, side, keys)
    each = isinstance(size, torch.Tensor)
    outside = torch.nonzero(indices >= size).squeeze(1)
    while outside.numel():
        if each:
            assert isinstance(size, torch.Tensor) and isinstance(side, torch.Tensor)
            walked = _encrypt(indices[outside], side[outside], [key[outside] for key in keys])  # type: ignore[index]
            indices[outside] = walked
            outside = outside[walked >= size[outside]]
        else:
            walked = _encrypt(indices.index_select(0, outside), side, keys)
            indices.index_copy_(0, outside, walked)
            outside = outside[walked >= size]
    return indices


def orders_at(positions: torch.Tensor, sizes: torch.Tensor, round_keys: torch.Tensor) -> torch.Tensor:
    """``EpochOrder(size, seed, epoch)(position)`` for each element, its size and its order's round keys
    (``(n, 3)``, `lightning_resumable.format._keys.epoch_order_round_keys`) per element: many orders in
    one vectorised pass (a mixture's sources and passes), each equal to its own `EpochOrder`'s."""
    limit = sizes - 1
    roots = torch.sqrt(limit.double()).long()  # isqrt, corrected where the double's rounding erred
    roots += ((roots + 1) * (roots + 1) <= limit).long()
    roots -= (roots * roots > limit).long()
    indices = _walked(positions, sizes, roots + 1, [round_keys[:, number] for number in range(round_keys.shape[1])])
    return torch.where(sizes == 1, positions, indices)


def round_keys(seed: int, epoch: int) -> list[int]:
    """The round keys of ``EpochOrder(size, seed, epoch)`` (any size), for `orders_at`."""
    return epoch_order_round_keys(seed, epoch, _ROUNDS)


class EpochOrder:
    """The order in which one epoch visits a dataset of ``size`` elements.

    ``order(positions)`` maps a tensor of positions in ``[0, size)`` to dataset indices, one
    vectorised pass for the whole tensor. With ``shuffle=False`` the order is the identity.

    Args:
        size: number of elements, 1 to ``MAX_SIZE``.
        seed: the shuffle seed (any integer).
        epoch: the epoch number (any non-negative integer).
        shuffle: ``False`` for the identity order.
    """

    def __init__(self, size: int, seed: int, epoch: int, shuffle: bool = True) -> None:
        if not 1 <= size <= MAX_SIZE:
            raise ValueError(f"EpochOrder size must be between 1 and 2**40, got {size}")
        if epoch < 0:
            raise ValueError(f"EpochOrder epoch must be non-negative, got {epoch}")
        self.size = size
        self.seed = seed
        self.epoch = epoch
        self.shuffle = shuffle
        # The Feistel domain is side * side, the smallest square holding size: at most 2*side - 1
        # values lie outside [0, size), so cycle walking is rare and short.
        self._side = math.isqrt(size - 1) + 1
        self._round_keys = epoch_order_round_keys(seed, epoch, _ROUNDS)

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        """Dataset indices at ``positions`` (an int64 tensor of values in ``[0, size)``)."""
        if not self.shuffle or self.size == 1:
            return positions.clone()
        return _walked(positions, self.size, self._side, self._round_keys)

    def index_at(self, position: int) -> int:
        """Dataset index at one position; for tools and tests, not the hot path."""
        if not 0 <= position < self.size:
            raise IndexError(f"position {position} is outside [0, {self.size})")
        return int(self(torch.tensor([position], dtype=torch.int64))[0])

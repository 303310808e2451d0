"""What each position of an epoch's global stream draws: a pure function of (seed, epoch, position).

Promise: for every sampler torch ships for map-style datasets, a `Draws` with the same
distribution whose draw at position ``p`` is computed from ``(seed, epoch, p)`` alone, counter-based,
so a stream can start at any position without replaying the ones before it:

- `Permutation`: ``shuffle=True/False``, ``RandomSampler``, ``SequentialSampler``,
  ``DistributedSampler``. O(1) per position.
- `RepeatedPermutation`: ``RandomSampler(num_samples=k)`` without replacement: whole
  permutations, then the head of one more. O(1) per position.
- `UniformDraws`: ``RandomSampler(replacement=True)``. O(1) per position.
- `WeightedDraws`: ``WeightedRandomSampler``. With replacement, O(log N) per position (a
  binary search of the cumulative weights); without, the epoch's order is computed once per epoch
  (Efraimidis-Spirakis keys, O(N log N)) and kept.
- `SubsetPermutation`: ``SubsetRandomSampler``. O(1) per position.

The sampler splits the stream across ranks (rank ``r`` takes positions ``r, r + W, ...``), as
Lightning's ``DistributedSamplerWrapper`` splits a custom sampler's stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from lightning_resumable.core.order import MAX_SIZE, EpochOrder, position_hash
from lightning_resumable.format._keys import Domain, repeated_round_seed

__all__ = ["Draws", "Permutation", "RepeatedPermutation", "SubsetPermutation", "UniformDraws", "WeightedDraws"]


def _uniform(seed: int, epoch: int, positions: torch.Tensor, domain: int) -> torch.Tensor:
    """A float64 in [0, 1) for each position, with 53 random bits."""
    return (position_hash(seed, epoch, positions, domain) >> 10).double() * (2.0**-53)


def _digest(values: torch.Tensor) -> str:
    """8 hex digits identifying a tensor of weights or indices, so a changed one is refused on resume."""
    flat = values.detach().cpu().contiguous().reshape(-1)
    return hashlib.blake2b(flat.view(torch.uint8).numpy().tobytes(), digest_size=4).hexdigest()


class Draws:
    """The dataset indices of an epoch's global stream of ``length`` positions.

    Attributes:
        length: positions per epoch, all ranks together (``num_samples`` of the sampler it replaces).
        dataset_size: indices are in ``[0, dataset_size)``.
    """

    length: int
    dataset_size: int

    def describe(self) -> str:
        """What identifies the draws in a checkpoint: a resume with other draws is refused."""
        raise NotImplementedError

    def epoch_length(self, seed: int, epoch: int) -> int:
        """Positions in the epoch's stream: ``length``, unless the draws vary it by epoch."""
        return self.length

    def __call__(self, seed: int, epoch: int, positions: torch.Tensor) -> torch.Tensor:
        """Dataset indices at ``positions`` (int64, each in ``[0, length)``), one vectorised pass."""
        raise NotImplementedError


class Permutation(Draws):
    """Each index once per epoch, shuffled by (seed, epoch), or in order."""

    def __init__(self, size: int, shuffle: bool = True) -> None:
        self.length = self.dataset_size = size
        self.shuffle = shuffle

    def describe(self) -> str:
        return "permutation" if self.shuffle else "sequential"

    def __call__(self, seed: int, epoch: int, positions: torch.Tensor) -> torch.Tensor:
        return EpochOrder(self.dataset_size, seed, epoch, self.shuffle)(positions)


class RepeatedPermutation(Draws):
    """``num_samples`` draws without replacement: permutation after permutation, as ``RandomSampler`` does."""

    def __init__(self, size: int, num_samples: int) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        self.dataset_size, self.length = size, num_samples

    def describe(self) -> str:
        return f"repeated-permutation(num_samples={self.length})"

    def __call__(self, seed: int, epoch: int, positions: torch.Tensor) -> torch.Tensor:
        rounds = torch.div(positions, self.dataset_size, rounding_mode="floor")
        offsets = positions - rounds * self.dataset_size
        indices = torch.empty_like(positions)
        for round_index in range(int(rounds.min()), int(rounds.max()) + 1):  # a chunk spans few rounds
            in_round = rounds == round_index
            round_seed = repeated_round_seed(seed, round_index)
            indices[in_round] = EpochOrder(self.dataset_size, round_seed, epoch)(offsets[in_round])
        return indices


class UniformDraws(Draws):
    """``num_samples`` independent uniform draws, with replacement."""

    def __init__(self, size: int, num_samples: int) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        self.dataset_size, self.length = size, num_samples

    def describe(self) -> str:
        return f"uniform-with-replacement(num_samples={self.length})"

    def __call__(self, seed: int, epoch: int, positions: torch.Tensor) -> torch.Tensor:
        indices = (_uniform(seed, epoch, positions, Domain.DRAW) * self.dataset_size).long()
        return indices.clamp_(max=self.dataset_size - 1)


class WeightedDraws(Draws):
    """``num_samples`` draws with probability proportional to ``weights``, as ``WeightedRandomSampler``.

    Zero-weight indices are never drawn. Without replacement, ``num_samples`` may not exceed the
    number of positive weights.
    """

    def __init__(self, weights: Sequence[float] | torch.Tensor, num_samples: int, replacement: bool = True) -> None:
        self.weights = torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
        if self.weights.numel() == 0 or self.weights.numel() > MAX_SIZE:
            raise ValueError(f"weights must hold 1 to 2**40 values, got {self.weights.numel()}")
        if not torch.isfinite(self.weights).all() or (self.weights < 0).any():
            raise ValueError("weights must be finite and non-negative")
        positive = int((self.weights > 0).sum())
        if positive == 0:
            raise ValueError("at least one weight must be positive")
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        if not replacement and num_samples > positive:
            raise ValueError(
                f"num_samples={num_samples} draws without replacement need as many positive weights, got {positive}"
            )
        self.dataset_size, self.length, self.replacement = self.weights.numel(), num_samples, replacement
        self._cumulative = self.weights.cumsum(0)
        self._epoch_order: tuple[int, int, torch.Tensor] | None = None  # (seed, epoch, order) without replacement
        kind = "with" if replacement else "without"
        # Digested once: describe() runs at every save and restore, which must not cost O(N).
        self._description = f"weighted-{kind}-replacement(num_samples={num_samples}, weights={_digest(self.weights)})"

    def describe(self) -> str:
        return self._description

    def __call__(self, seed: int, epoch: int, positions: torch.Tensor) -> torch.Tensor:
        if self.replacement:
            targets = _uniform(seed, epoch, positions, Domain.DRAW) * self._cumulative[-1]
            indices = torch.searchsorted(self._cumulative, targets, right=True)
            return indices.clamp_(max=self.dataset_size - 1)
        return self._order(seed, epoch)[positions]

    def _order(self, seed: int, epoch: int) -> torch.Tensor:
        """The epoch's draws without replacement: the ``length`` largest keys ``log(u) / w``, largest first."""
        if self._epoch_order is None or self._epoch_order[:2] != (seed, epoch):
            items = torch.arange(self.dataset_size)
            keys = torch.log(_uniform(seed, epoch, items, Domain.WEIGHT).clamp_(min=2.0**-60)) / self.weights
            self._epoch_order = (seed, epoch, torch.topk(keys, self.length).indices)  # 0 weights: -inf, never taken
        return self._epoch_order[2]


class SubsetPermutation(Draws):
    """Each index of a subset once per epoch, shuffled, as ``SubsetRandomSampler``."""

    def __init__(self, indices: Sequence[int] | torch.Tensor, dataset_size: int) -> None:
        self.indices = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        if self.indices.numel() == 0:
            raise ValueError("the subset is empty")
        if int(self.indices.min()) < 0 or int(self.indices.max()) >= dataset_size:
            raise ValueError(f"the subset's indices must lie in [0, {dataset_size})")
        self.length, self.dataset_size = self.indices.numel(), dataset_size
        self._description = f"subset-permutation(size={self.length}, indices={_digest(self.indices)})"

    def describe(self) -> str:
        return self._description

    def __call__(self, seed: int, epoch: int, positions: torch.Tensor) -> torch.Tensor:
        return self.indices[EpochOrder(self.length, seed, epoch)(positions)]

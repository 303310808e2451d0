"""Which source of a mixture each sample of a batch came from, for per-source signals in the training step.

Promise: the sources are looked up from the batch's stream positions (what the sampler handed out),
so the dataset needs no field of its own and the collate function is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BatchSources"]


@dataclass(frozen=True)
class BatchSources:
    """The source of each sample of this rank's batch in training.

    Attributes:
        names: the mixture's sources, in its order.
        ids: per sample, in the batch's order, its source's place in ``names`` (a ``torch.long`` tensor).

    Example:
        ```python
        sources = ResumableDataCallback.of(self.trainer).batch_sources()
        losses = sources.means(per_sample_loss)  # {"web": tensor(2.31), "code": tensor(1.87)}
        ```
    """

    names: tuple[str, ...]
    ids: torch.Tensor

    def totals(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per source, in ``names``' order, the sum of ``values`` (one per sample) and the samples counted:
        two tensors on ``values``' device, ready for an all-reduce across ranks."""
        if values.shape[:1] != self.ids.shape:
            raise ValueError(
                f"one value per sample of the batch: {tuple(self.ids.shape)} samples, values {tuple(values.shape)}"
            )
        ids = self.ids.to(values.device)
        sums = torch.zeros(len(self.names), dtype=values.dtype, device=values.device).index_add_(0, ids, values)
        counts = torch.bincount(ids, minlength=len(self.names))
        return sums, counts

    def means(self, values: torch.Tensor) -> dict[str, torch.Tensor]:
        """The mean of ``values`` (one per sample) per source in this batch (sources absent from it left out)."""
        sums, counts = self.totals(values)
        present = torch.bincount(self.ids, minlength=len(self.names)).tolist()  # on the CPU: no device sync
        return {name: sums[place] / counts[place] for place, name in enumerate(self.names) if present[place]}

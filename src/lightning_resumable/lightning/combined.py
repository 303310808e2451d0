"""Several train loaders: a list, a dict or a ``CombinedLoader``, each loader resumed under its own key.

Promise: each loader's state is stored under its key (a dict's key, a list's index), never matched by
position in a flat list; each has a seed of its own, derived from the run's seed and its key; and the
place of each loader in the epoch follows from the trainer's count of batches and the mode, including
how many times ``max_size_cycle`` has restarted a shorter loader.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning.pytorch.utilities import CombinedLoader

from lightning_resumable.errors import IncompatibleStateError, UnsupportedLoaderError
from lightning_resumable.format._keys import loader_seed
from lightning_resumable.internals._lightning import combined_loader_mode

__all__ = [
    "MODES",
    "TrainLoaders",
    "key_seed",
    "loader_position",
    "refuse_cycles_a_reload_prefetches",
    "refuse_other_batch_sizes",
    "split_train_loaders",
]

MODES = ("max_size_cycle", "max_size", "min_size")
"""The ``CombinedLoader`` modes Lightning trains with (``sequential`` is refused by Lightning itself)."""

TrainLoaders = tuple[dict[str, Any], str, Callable[[dict[str, Any]], Any]]
"""The loaders by key, the mode, and a function that puts rebuilt loaders back in the user's container."""


def key_seed(seed: int, key: str) -> int:
    """The seed of the loader under ``key``: a pure function of the run's seed and the key (below 2**63)."""
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return loader_seed(seed, digest)


def loader_position(mode: str, batches: int, length: int) -> tuple[int, int]:
    """``(cycle, batches into the cycle)`` of a loader of ``length`` batches after the trainer's ``batches``.

    ``max_size_cycle`` restarts a shorter loader whenever it runs out; ``max_size`` leaves it exhausted
    (it then yields ``None``); ``min_size`` ends the epoch with the shortest loader.
    """
    if mode == "max_size_cycle" and length > 0:
        return divmod(batches, length)
    return 0, min(batches, length)


_PAIRED_BY_STEP = {
    "max_size_cycle": "restarts a shorter loader whenever it runs out, so in batches of another size the shorter"
    " loaders would restart at other steps and the epoch would end at another sample of them",
    "min_size": "ends the epoch when the shortest loader runs out, so in batches of another size it would end at"
    " another sample of the others",
    "max_size": "reads every loader whole, where another size could be exact, but it is not built for several"
    " loaders (their counts, skips and verification are one loader's or a mixture's only)",
}


def refuse_other_batch_sizes(mode: str, saved: Mapping[str, int], now: Mapping[str, int]) -> None:
    """Raise where a loader's batch size (``saved``, by key) is not the one it has ``now``, saying why it would not
    be exact: the loaders' batches are paired step by step and the mode decides where the epoch ends."""
    changed = {key: (size, now[key]) for key, size in saved.items() if size != now[key]}
    if changed:
        sizes = ", ".join(f"{key!r}: {old} -> {new}" for key, (old, new) in sorted(changed.items()))
        raise IncompatibleStateError(
            f"the checkpoint's train loaders read other batch sizes per process ({sizes}). Lightning pairs several"
            f" loaders' batches step by step, and CombinedLoader(mode={mode!r}) {_PAIRED_BY_STEP[mode]}. Resume with"
            " the checkpoint's batch sizes; one train loader or a Mixture goes on with another batch size"
        )


def refuse_cycles_a_reload_prefetches(loaders: Mapping[str, Any], mode: str, reload_every: int) -> None:
    """Raise where Lightning's reload would start a shorter loader's epoch at another cycle than a resume there does.

    A reload makes an iterator Lightning never reads, then the one it trains from; where the first one's workers
    prefetch a loader's whole pass (no more batches per process than ``num_workers * prefetch_factor``), its sampler
    takes that pass as read and ``max_size_cycle`` begins the epoch at its next cycle, which a resume at or after the
    epoch's start does not (it makes one iterator). Not yet told apart from a pass read; refused, never inexact.
    """
    if mode != "max_size_cycle" or reload_every <= 0:
        return
    for key, loader in sorted(loaders.items()):
        prefetched = loader.num_workers * (loader.prefetch_factor or 0)
        if loader.num_workers and len(loader) <= prefetched:
            raise UnsupportedLoaderError(
                f"the train loader {key!r} has {len(loader)} batches per process, which its {loader.num_workers}"
                f" workers prefetch whole ({prefetched} batches ahead): with reload_dataloaders_every_n_epochs="
                f"{reload_every}, Lightning makes an iterator it never reads, then another, and in max_size_cycle mode"
                " the loader would begin each reloaded epoch at its next cycle, a resume there at its first: not"
                " exact. Pass reload_dataloaders_every_n_epochs=0, or give the loader more batches than num_workers"
                " * prefetch_factor (fewer workers, a smaller prefetch_factor or batch_size), or use max_size mode"
            )


def split_train_loaders(train_loaders: object) -> TrainLoaders | None:
    """The loaders of a list, tuple, dict or ``CombinedLoader`` by key; ``None`` for a single loader.

    Raises:
        UnsupportedLoaderError: a nested collection, a ``sequential`` CombinedLoader, or no loader at all.
    """
    mode = "max_size_cycle"  # what Lightning wraps a bare list or dict in
    wrap_combined = False
    if isinstance(train_loaders, CombinedLoader):
        mode, wrap_combined = combined_loader_mode(train_loaders), True
        train_loaders = train_loaders.iterables
    if mode not in MODES:
        raise UnsupportedLoaderError(f"a CombinedLoader in {mode!r} mode cannot train; use one of {MODES}")
    if isinstance(train_loaders, Mapping):
        loaders = {str(key): loader for key, loader in train_loaders.items()}
        keys = list(train_loaders)
        if len(set(loaders)) != len(keys):
            raise UnsupportedLoaderError(f"the train loaders' keys {keys!r} are not distinct as strings")

        def container(rebuilt: dict[str, Any]) -> Any:
            return {key: rebuilt[str(key)] for key in keys}
    elif isinstance(train_loaders, Sequence) and not isinstance(train_loaders, (str, bytes)):
        loaders = {str(index): loader for index, loader in enumerate(train_loaders)}
        sequence_type = type(train_loaders) if isinstance(train_loaders, (list, tuple)) else list

        def container(rebuilt: dict[str, Any]) -> Any:
            return sequence_type(rebuilt[str(index)] for index in range(len(rebuilt)))
    else:
        if wrap_combined:
            raise UnsupportedLoaderError(f"a CombinedLoader over a {type(train_loaders).__name__} is not supported")
        return None
    if not loaders:
        # Lightning would fit on nothing (an epoch of no batch, with a warning) and its checkpoints hold no position.
        raise UnsupportedLoaderError(
            f"train_dataloader() returned an empty {type(train_loaders).__name__}: no train loader. Return at least"
            " one loader; to validate or test without training, call trainer.validate() or trainer.test()"
        )
    for key, loader in loaders.items():
        if isinstance(loader, (Mapping, CombinedLoader)) or (
            isinstance(loader, Sequence) and not hasattr(loader, "dataset")
        ):
            raise UnsupportedLoaderError(f"the train loader under {key!r} is a nested collection; flatten it")

    def rebuild(rebuilt: dict[str, Any]) -> Any:
        inner = container(rebuilt)
        return CombinedLoader(inner, mode) if wrap_combined else inner  # type: ignore[arg-type]  # one of MODES

    return loaders, mode, rebuild

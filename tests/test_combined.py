"""Several train loaders: keys, seeds, and each loader's place in the epoch by mode."""

from __future__ import annotations

from typing import Any

import pytest
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader

from lightning_resumable import UnsupportedLoaderError
from lightning_resumable.lightning.combined import key_seed, loader_position, split_train_loaders


def test_a_shorter_loader_cycles_in_max_size_cycle() -> None:
    # A loader of 3 batches, after 7 of the epoch's batches: cycles 0 and 1 done, 1 batch into cycle 2.
    assert loader_position("max_size_cycle", 7, 3) == (2, 1)
    assert loader_position("max_size_cycle", 6, 3) == (2, 0)  # ran out exactly: the next cycle starts at 0
    assert loader_position("max_size_cycle", 2, 5) == (0, 2)


def test_a_shorter_loader_stays_exhausted_in_max_size_and_min_size_never_passes_the_shortest() -> None:
    assert loader_position("max_size", 7, 3) == (0, 3)
    assert loader_position("max_size", 2, 3) == (0, 2)
    assert loader_position("min_size", 2, 3) == (0, 2)


def test_each_key_has_a_seed_of_its_own_and_the_same_one_every_time() -> None:
    seeds = {key: key_seed(42, key) for key in ("a", "b", "0", "1")}
    assert len(set(seeds.values())) == 4
    assert seeds == {key: key_seed(42, key) for key in seeds}
    assert key_seed(43, "a") != seeds["a"]


def loaders() -> dict[str, DataLoader[Any]]:
    return {"a": DataLoader(range(8)), "b": DataLoader(range(4))}


@pytest.mark.parametrize("mode", ["max_size_cycle", "max_size", "min_size"])
def test_a_combined_loader_is_split_by_key_and_rebuilt_in_its_mode(mode: str) -> None:
    split = split_train_loaders(CombinedLoader(loaders(), mode))  # type: ignore[arg-type]
    assert split is not None
    by_key, found_mode, rebuild = split
    assert sorted(by_key) == ["a", "b"] and found_mode == mode
    rebuilt = rebuild(by_key)
    assert isinstance(rebuilt, CombinedLoader) and rebuilt._mode == mode
    assert rebuilt.iterables == by_key


def test_a_list_is_keyed_by_index_and_a_single_loader_is_not_split() -> None:
    split = split_train_loaders([DataLoader(range(8)), DataLoader(range(4))])
    assert split is not None
    by_key, mode, rebuild = split
    assert sorted(by_key) == ["0", "1"] and mode == "max_size_cycle"
    assert rebuild(by_key) == [by_key["0"], by_key["1"]]
    assert split_train_loaders(DataLoader(range(8))) is None


def test_sequential_mode_and_nested_collections_are_refused() -> None:
    with pytest.raises(UnsupportedLoaderError, match="'sequential' mode"):
        split_train_loaders(CombinedLoader(loaders(), "sequential"))
    with pytest.raises(UnsupportedLoaderError, match="nested"):
        split_train_loaders({"a": loaders()})

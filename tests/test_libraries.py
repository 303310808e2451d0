"""Data libraries this release does not resume yet (LitData, MosaicML Streaming), and any dataset whose
``state_dict`` takes required arguments, are refused with `UnsupportedLoaderError` naming the library
and the way that works; the user's loader was rebuilt, and the contract check called ``state_dict()``
with no arguments: ``TypeError: ... missing 3 required positional arguments``. Their classes are
stood in for here by classes of the same packages (``__module__``); none is imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
from torch.utils.data import DataLoader, IterableDataset

from lightning_resumable import (
    ContractViolationError,
    ResumableDataCallback,
    ResumableDataModule,
    UnsupportedLoaderError,
)
from lightning_resumable.readers.build import make_resumable
from lightning_resumable.readers.contract import check_contract
from lightning_resumable.readers.libraries import library_of, required_state_dict_arguments

from .helpers import Model, trainer


class LitDataStream(IterableDataset[int]):
    """Stands in for ``litdata.StreamingDataset``: its ``state_dict`` takes the loader's counts."""

    def __iter__(self) -> Any:
        return iter(range(8))

    def state_dict(self, num_samples_yielded: int, num_workers: int, batch_size: int) -> dict[str, Any]:
        return {"num_samples_yielded": num_samples_yielded, "num_workers": num_workers, "world_size": 2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


LitDataStream.__module__ = "litdata.streaming.dataset"


class MosaicLoader(DataLoader[Any]):
    """Stands in for ``streaming.StreamingDataLoader``, a ``DataLoader`` with a state of its own."""

    def state_dict(self) -> dict[str, Any]:
        return {"sample_in_epoch": 0}


MosaicLoader.__module__ = "streaming.base.dataloader"


class OwnCounts(IterableDataset[int]):
    """A user's stream whose ``state_dict`` wants its loader's counts, as Mosaic's dataset's does."""

    def __iter__(self) -> Any:
        return iter(range(8))

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        return {"sample_in_epoch": num_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def resumable(loader: object) -> object:
    return make_resumable(loader, seed=0, num_replicas=1, rank=0)


def test_a_litdata_dataset_is_refused_naming_the_library_and_the_way_that_works() -> None:
    with pytest.raises(UnsupportedLoaderError, match=r"holds LitData's LitDataStream at loader\.dataset") as refused:
        resumable(DataLoader(LitDataStream(), batch_size=2))
    assert "return LitData's StreamingDataLoader (or a torch DataLoader) over a" in str(refused.value)
    assert "or a CombinedStreamingDataset of them, which this library resumes" in " ".join(str(refused.value).split())


def test_a_mosaic_loader_is_refused_naming_the_library() -> None:
    with pytest.raises(UnsupportedLoaderError, match=r"holds MosaicML Streaming's MosaicLoader at loader\. "):
        resumable(MosaicLoader(list(range(8)), batch_size=2))


def test_a_state_dict_with_required_arguments_is_refused_not_called() -> None:
    assert required_state_dict_arguments(OwnCounts()) == ["num_samples", "from_beginning"]
    with pytest.raises(UnsupportedLoaderError, match=r"takes required\s+arguments \['num_samples', 'from_beginning'\]"):
        resumable(DataLoader(OwnCounts(), batch_size=2))


def test_the_refusal_comes_before_any_step_under_a_trainer(tmp_path: Path) -> None:
    class Data(ResumableDataModule, L.LightningDataModule):
        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(LitDataStream(), batch_size=2)

    with pytest.raises(UnsupportedLoaderError, match="LitData"):
        trainer(tmp_path, [ResumableDataCallback()], max_steps=1).fit(Model(), Data())


class Adapter(IterableDataset[int]):
    """A user's adapter whose state is the LitData stream's own (with its ``num_workers``)."""

    def __init__(self, dataset: object) -> None:
        self.dataset = dataset

    def __iter__(self) -> Any:
        return iter(range(8))

    def state_dict(self) -> dict[str, Any]:
        return {"num_samples_yielded": 4, "num_workers": 2, "world_size": 2}


def test_a_librarys_own_position_keys_are_not_taken_for_derived_quantities() -> None:
    """LitData records ``num_workers`` and ``world_size`` to resume on other ones: its bookkeeping, not a
    derived quantity persisted by mistake; the same keys from a user's own object are refused."""
    assert library_of(LitDataStream()) is not None and library_of(Adapter(None)) is None
    check_contract(DataLoader(Adapter(LitDataStream())))  # LitData's object never has its state_dict called
    with pytest.raises(ContractViolationError, match="persists the key 'num_workers'"):
        check_contract(DataLoader(Adapter(list(range(8)))))


def test_importing_the_library_imports_no_data_library() -> None:
    """LitData is imported only when a train loader holds it (`lightning_resumable.readers.litdata`)."""
    import subprocess
    import sys

    code = "import sys, lightning_resumable; print(sorted({'litdata', 'streaming'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"

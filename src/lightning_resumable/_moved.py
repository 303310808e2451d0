"""0.2.0's module paths of its public names, importable until 0.4.0.

0.2.0 kept its modules at the package's top (``lightning_resumable.sampler``, ``.callback``...); 0.3.0
put them in layers (`lightning_resumable.core`, ``.lightning``, ``.format``...). A user's
``from lightning_resumable.sampler import ResumableSampler`` still works: each old path is a module
made on import whose public names are the new objects, each read with a ``DeprecationWarning`` that
names the import to write instead. Only the names 0.2.0 documented are kept; its private helpers are not.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "REMOVED_IN", "install"]

REMOVED_IN = "0.4.0"
_PUBLIC = "lightning_resumable"
MOVED: dict[str, dict[str, str]] = {
    "batches": {"ResumableBatchSampler": _PUBLIC},
    "callback": {"ResumableDataCallback": _PUBLIC},
    "contract": {"PassThroughWrapper": _PUBLIC},
    "datamodule": {"ResumableDataModule": _PUBLIC},
    "order": {"EpochOrder": _PUBLIC},
    "randomness": {"SampleRng": _PUBLIC, "SampleSeededDataset": _PUBLIC, "sample_rng": _PUBLIC},
    "sampler": {"ResumableSampler": _PUBLIC},
    "state": {"DataState": _PUBLIC},
    "streams": {"StreamState": "lightning_resumable.format.envelope"},
}
"""Each 0.2.0 module (under ``lightning_resumable``): its public names, and the module each is imported from now."""


class _MovedModule(ModuleType):
    def __getattr__(self, name: str) -> Any:
        old = self.__name__.rpartition(".")[2]
        new = MOVED[old].get(name)
        if new is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"{self.__name__}.{name} is deprecated and will be removed in {REMOVED_IN}: use `from {new} import {name}`",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    def __dir__(self) -> list[str]:
        return sorted(MOVED[self.__name__.rpartition(".")[2]])


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``lightning_resumable.<old>`` for each old module that no module of the package is named now."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        package, _, old = fullname.rpartition(".")
        if package != _PUBLIC or old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = _MovedModule(spec.name, f"0.2.0's {spec.name}, moved in 0.3.0 (removed in {REMOVED_IN})")
        module.__all__ = sorted(MOVED[spec.name.rpartition(".")[2]])  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: ModuleType) -> None:
        pass


def install() -> None:
    """Make the old paths importable: once per process, after every other finder (a real module wins)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())

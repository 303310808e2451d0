"""Lightning's recording of a loader's arguments, undone when a loader hook raises.

While ``train_dataloader()`` runs, Lightning patches ``__init__``, ``__setattr__`` and ``__delattr__`` of
``DataLoader``, ``BatchSampler`` and their subclasses to record the arguments each is built with
(``lightning.fabric.utilities.data._replace_dunder_methods``), and puts the originals back after the hook
returns, but not when it raises (lightning 2.6: no ``finally``). The library refuses a loader by raising
there; a process that goes on (a notebook, a sweep that tries the next setup) would then record the arguments
of every loader it builds, which changes how the library rebuilds them. Checked against lightning 2.6.6 by
``tests/test_lightning_internals.py``.
"""

from __future__ import annotations

from lightning_utilities.core.inheritance import get_all_subclasses
from torch.utils.data import BatchSampler, DataLoader

__all__ = ["undo_argument_recording"]

_PATCHED = ("__setattr__", "__delattr__", "__init__")


def undo_argument_recording() -> None:
    """Put back the methods Lightning's recording replaced, as its context manager does when it ends."""
    for base in (DataLoader, BatchSampler):
        for cls in get_all_subclasses(base) | {base}:
            for name in _PATCHED:
                if f"__old{name}" in cls.__dict__:
                    setattr(cls, name, cls.__dict__[f"__old{name}"])
                    delattr(cls, f"__old{name}")

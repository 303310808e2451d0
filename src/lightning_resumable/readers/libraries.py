"""The data libraries users already have: how each is recognised, what it keeps as its own position,
and what this release does with it.

Promise: an object of LitData or MosaicML Streaming anywhere in a train loader (the loader, its
dataset, sampler, or what they wrap) is refused with `UnsupportedLoaderError` naming the library and
the way that works today, before anything calls its ``state_dict``, unless it is the library's loader
(or a torch loader) over its dataset, which `lightning_resumable.readers.build` hands to the library's
reader; so is any other object whose ``state_dict`` takes required arguments (those libraries' take
their loader's counts), never with the ``TypeError`` that calling it would raise. A library is
recognised by the package its class comes from: none is imported here.

The keys each library keeps as the bookkeeping of its own global position are declared here, in
`Library.position_keys`: the contract check (`lightning_resumable.readers.contract`) accepts them in a
chain that holds that library's object, where it would refuse a derived quantity of the same name
(LitData records ``num_workers`` and ``world_size`` to resume elastically).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import cast

from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.internals._chunk_tables import is_of
from lightning_resumable.readers.base import Adapter, Library

__all__ = [
    "LIBRARIES",
    "adapter_of",
    "adapters_for",
    "is_of",
    "library_of",
    "refuse_unsupported",
    "required_state_dict_arguments",
]


LIBRARIES = {
    library.package: library
    for library in (
        Library(
            "LitData",
            "litdata",
            frozenset({"num_samples_yielded", "num_workers", "batch_size", "world_size", "sample_in_epoch"}),
            "Its StreamingDataset keeps its position in its own StreamingDataLoader, whose state_dict hands the"
            " dataset the loader's counts: return LitData's StreamingDataLoader (or a torch DataLoader) over a"
            " StreamingDataset, or a CombinedStreamingDataset of them, which this library resumes exactly"
            " (ParallelStreamingDataset is not resumed yet)",
            adapter="lightning_resumable.readers.litdata",
        ),
        Library(
            "MosaicML Streaming",
            "streaming",
            frozenset({"epoch", "sample_in_epoch", "num_canonical_nodes", "initial_physical_nodes"}),
            "Its StreamingDataset keeps its position in its own StreamingDataLoader, whose state_dict hands the"
            " dataset the loader's counts: return Mosaic's StreamingDataLoader (or a torch DataLoader) over a"
            " StreamingDataset itself, which this library resumes exactly",
            adapter="lightning_resumable.readers.mosaic",
        ),
        Library(
            "WebDataset",
            "webdataset",
            frozenset(),
            "WebDataset keeps no state; this library takes over a wds.WebDataset or wds.DataPipeline of tar shards"
            " returned in a torch DataLoader, a StatefulDataLoader or a WebLoader without stages of its own",
            adapter="lightning_resumable.readers.web_dataset",
        ),
    )
}
"""The data libraries, by the package their classes come from: what is known of each before it is
imported (the contract and the refusals need it for any object of the library), and its adapter module,
which imports the library and is imported only where an object of the library was built. The one entry
a new data library adds here, beside its adapter module."""


def package_of(node: object) -> str:
    return type(node).__module__.partition(".")[0]


def library_of(node: object) -> Library | None:
    """The data library ``node``'s class comes from, if it is one of `LIBRARIES`."""
    return LIBRARIES.get(package_of(node))


def adapters_for(loader: object) -> list[Adapter]:
    """The adapters (imported now) of the data libraries, imported already, whose class (or a subclass of
    it) ``loader`` or its dataset is of."""
    classes = (cls for each in (loader, getattr(loader, "dataset", None)) for cls in type(each).__mro__)
    packages = {cls.__module__.partition(".")[0] for cls in classes}  # a user's subclass is its library's
    return [
        cast(Adapter, importlib.import_module(library.adapter))
        for package, library in LIBRARIES.items()
        if package in packages and package in sys.modules
    ]


def adapter_of(node: object) -> Adapter | None:
    """The adapter (imported now) of the data library ``node``'s class, or a base class of it, comes from."""
    for cls in type(node).__mro__:
        library = LIBRARIES.get(cls.__module__.partition(".")[0])
        if library is not None and library.package in sys.modules:
            return cast(Adapter, importlib.import_module(library.adapter))
    return None


def required_state_dict_arguments(node: object) -> list[str]:
    """The names of the arguments ``node.state_dict`` requires (``[]``: it takes none, or has none)."""
    state_dict = getattr(node, "state_dict", None)
    if not callable(state_dict):
        return []
    try:
        parameters = inspect.signature(state_dict).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called as the protocol says
        return []
    return [
        parameter.name
        for parameter in parameters
        if parameter.default is inspect.Parameter.empty
        and parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]


def refuse_unsupported(chain: list[tuple[str, object]]) -> None:
    """Refuse a loader's chain (`lightning_resumable.readers.contract.pipeline`) that holds an object of a
    library this release does not resume, or whose ``state_dict`` takes required arguments.

    Raises:
        UnsupportedLoaderError: naming the object, its path, the library and the way that works.
    """
    for path, node in chain:
        library = library_of(node)
        if library is not None:  # LitData's own loader is routed to its owner before this walk
            raise UnsupportedLoaderError(
                f"the train loader holds {library.name}'s {type(node).__qualname__} at {path}. " + library.supported
            )
        required = required_state_dict_arguments(node)
        if required:
            package = type(node).__module__.partition(".")[0]
            raise UnsupportedLoaderError(
                f"{type(node).__qualname__} at {path} (from {package}) has a state_dict that takes required"
                f" arguments {required}: its state is kept by a loader of its own, which hands it those, so"
                " neither Lightning nor this library can save it. Give the dataset state_dict() without"
                " arguments and load_state_dict(state) (torchdata's Stateful protocol), or resume it with"
                " its library's own loader under plain Lightning"
            )

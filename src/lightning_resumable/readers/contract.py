"""The pass-through contract: a wrapper's persisted state is its inner object's true state, never a
derived quantity (rank, world size, shard offset), which is recomputed from the current setup.

Promise: every loader the mixin builds is walked (loader, batch sampler, sampler, dataset, and each
wrapper's inner object) when it is built and again at every save. State that names a derived
quantity at any depth, or a wrapper whose state differs from its inner object's, is refused with
`ContractViolationError` naming the object's class, its path in the loader and the key. A data
library's own bookkeeping of its global position (`lightning_resumable.readers.libraries`) is not derived.

`PassThroughWrapper` is the base class for your own wrappers of a dataset, sampler or batch
sampler: its ``state_dict``/``load_state_dict`` delegate to the wrapped object and cannot be
overridden, so pass-through is the only behaviour it can have.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from lightning_resumable.core.verification import digest_of
from lightning_resumable.errors import ContractViolationError
from lightning_resumable.readers.libraries import library_of, required_state_dict_arguments

__all__ = ["DERIVED_KEYS", "INNER_ATTRIBUTES", "PassThroughWrapper", "check_contract", "pipeline"]

DERIVED_KEYS = frozenset(
    {
        "rank",
        "global_rank",
        "local_rank",
        "node_rank",
        "world_size",
        "num_replicas",
        "num_processes",
        "process_index",
        "shard_offset",
        "shard_index",
        "shard_id",
        "num_shards",
        "worker_id",
        "num_workers",
    }
)
"""State keys that name a quantity derived from the current setup; never persisted."""

INNER_ATTRIBUTES = ("dataset", "inner", "sampler", "batch_sampler")
"""The attributes through which the walk goes from an object to the one it holds or wraps."""


class PassThroughWrapper:
    """Base class for a wrapper of a dataset, sampler or batch sampler that persists nothing of its own.

    ``state_dict()`` is the wrapped object's state, unchanged (``{}`` if it has none), and
    ``load_state_dict()`` hands the state to it. Subclasses cannot override either. List the
    attributes the wrapper derives from the current setup in ``derived_attributes``: the walk refuses
    those names as state keys anywhere in the loader. Attributes the wrapper does not have are read
    from the wrapped object, which is ``.inner``; ``len()`` is the wrapped object's.

    Example:
        ```python
        class EveryOther(PassThroughWrapper, Dataset):
            derived_attributes = ("offset",)

            def __init__(self, dataset, offset):
                super().__init__(dataset)
                self.offset = offset  # derived from the rank, recomputed on every restore

            def __len__(self):
                return len(self.inner) // 2

            def __getitem__(self, index):
                return self.inner[2 * index + self.offset]
        ```
    """

    derived_attributes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("state_dict", "load_state_dict"):
            if name in vars(cls):
                raise ContractViolationError(
                    f"{cls.__qualname__} defines {name}(): a PassThroughWrapper's state is its inner object's,"
                    " unchanged; put the state in the wrapped object, and derive the rest on restore"
                )

    def state_dict(self) -> dict[str, Any]:
        """The wrapped object's state, unchanged (``{}`` if it has none)."""
        inner_state_dict = getattr(self.inner, "state_dict", None)
        return dict(inner_state_dict()) if callable(inner_state_dict) else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Hand ``state`` to the wrapped object; the wrapper's own attributes are derived, not restored."""
        inner_load = getattr(self.inner, "load_state_dict", None)
        if callable(inner_load):
            inner_load(state)
        elif state:
            raise ContractViolationError(
                f"{type(self).__qualname__} was given state {sorted(state)} but wraps a"
                f" {type(self.inner).__qualname__}, which has no load_state_dict"
            )

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (unpickling): don't recurse
            raise AttributeError(name)
        return getattr(self.inner, name)


# ------------------------------------------------------------------------------------- the walk
def pipeline(loader: object) -> list[tuple[str, object]]:
    """Every object of a loader's chain with its path (``loader.dataset.inner``), outermost first."""
    found: list[tuple[str, object]] = []
    seen: set[int] = set()

    def visit(path: str, node: object) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        found.append((path, node))
        attributes = getattr(node, "__dict__", None)
        if not isinstance(attributes, dict):
            return
        for name in INNER_ATTRIBUTES:
            inner = attributes.get(name)
            if inner is not None and not isinstance(inner, (int, float, str, bool, range)):
                visit(f"{path}.{name}", inner)

    visit("loader", loader)
    return found


def _state_of(node: object) -> Mapping[str, Any] | None:
    state_dict = getattr(node, "state_dict", None)
    if not callable(state_dict) or required_state_dict_arguments(node):
        return None  # no state; or one only its library's loader can take (`lightning_resumable.readers.libraries`)
    state = state_dict()
    return state if isinstance(state, Mapping) else {"": state}


def _key_paths(state: object, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(key, where)`` for every mapping key at any depth of a state."""
    if isinstance(state, Mapping):
        for key, value in state.items():
            where = f"{prefix}[{key!r}]"
            yield str(key), where
            yield from _key_paths(value, where)
    elif isinstance(state, (list, tuple)):
        for position, value in enumerate(state):
            yield from _key_paths(value, f"{prefix}[{position}]")


def check_contract(loader: object, owned: tuple[object, ...] = ()) -> None:
    """Refuse state that breaks the pass-through contract anywhere in ``loader``'s chain.

    ``owned`` are the library's own objects (the sampler whose state the callback persists), which
    are walked through but not checked.

    Raises:
        ContractViolationError: naming the object's class, its path and the key.
    """
    chain = pipeline(loader)
    forbidden = set(DERIVED_KEYS)
    for _, node in chain:
        forbidden.update(getattr(type(node), "derived_attributes", ()))
    for _, node in chain:  # a library's own bookkeeping of its global position is its state, not derived
        library = library_of(node)
        forbidden -= library.position_keys if library is not None else set()
    # Innermost first: an outer wrapper that reads its state through inherits a violation, and the
    # object to name is the one that holds the key.
    for path, node in reversed(chain):
        if any(node is mine for mine in owned):
            continue
        state = _state_of(node)
        if state is None:
            continue
        for key, where in _key_paths(state):
            if key in forbidden:
                raise ContractViolationError(
                    f"{type(node).__qualname__} at {path} persists the key {key!r} (state{where}), a quantity"
                    " derived from the current setup; a restore on another rank or world size would apply it"
                    " wrongly. Leave it out of state_dict() and recompute it on restore"
                )
        attributes = getattr(node, "__dict__", {})
        for name in INNER_ATTRIBUTES:
            inner = attributes.get(name) if isinstance(attributes, dict) else None
            inner_state = _state_of(inner) if inner is not None else None
            if inner_state is None:
                continue
            if digest_of(dict(state)) != digest_of(dict(inner_state)):
                differing = sorted(set(state) ^ set(inner_state)) or sorted(
                    key for key in state if digest_of(state[key]) != digest_of(inner_state[key])
                )
                raise ContractViolationError(
                    f"{type(node).__qualname__} at {path} persists a state that differs from that of the"
                    f" {type(inner).__qualname__} it wraps ({path}.{name}); keys that differ: {differing}. A"
                    " wrapper's state must be its inner object's, unchanged (see PassThroughWrapper)"
                )

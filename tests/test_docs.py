"""The docs build's check (``docs/hooks.py``): it finds an undocumented public name, and there is none."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace

import lightning_resumable

DOCS = Path(__file__).resolve().parents[1] / "docs"


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Documented:
    """A class with a docstring."""

    def method(self) -> None:
        """A method with one."""


class Bare:
    def method(self) -> None:
        pass

    @property
    def size(self) -> int:
        return 0

    def _private(self) -> None:
        pass


def undocumented() -> None:
    pass


def test_every_public_name_is_documented_and_referenced() -> None:
    hooks = load_hooks()
    assert hooks.undocumented_names(lightning_resumable) == []
    assert hooks.unreferenced_names(lightning_resumable, DOCS) == []


def test_the_check_finds_undocumented_classes_members_and_functions(tmp_path: Path) -> None:
    hooks = load_hooks()
    module = SimpleNamespace(
        __all__=["Documented", "Bare", "undocumented"], Documented=Documented, Bare=Bare, undocumented=undocumented
    )
    assert hooks.undocumented_names(module) == ["Bare", "Bare.method", "Bare.size", "undocumented"]
    for page in hooks.REFERENCE_PAGES:
        (tmp_path / page).write_text("::: lightning_resumable.Documented\n")
    assert hooks.unreferenced_names(module, tmp_path) == ["Bare", "undocumented"]

"""MkDocs hook: the build fails when a public name lacks a docstring or a page in the reference.

Public means listed in ``lightning_resumable.__all__``; each such class or function needs its own
docstring, each public method or property of such a class one (its own or the one it overrides), and
each name a ``::: lightning_resumable.NAME`` block in ``api.md`` or ``exceptions.md``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

REFERENCE_PAGES = ("api.md", "exceptions.md")


def undocumented_names(module: Any) -> list[str]:
    """The public names of ``module`` (and public members of its classes) without a docstring."""
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not (obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__):
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        for member, value in vars(obj).items():
            if member.startswith("_") or member.startswith("on_") or member in ("setup", "teardown"):
                continue
            if (inspect.isfunction(value) or isinstance(value, (property, classmethod, staticmethod))) and not (
                inspect.getdoc(getattr(obj, member))
            ):
                missing.append(f"{name}.{member}")
    return missing


def unreferenced_names(module: Any, docs_dir: Path) -> list[str]:
    """The public names of ``module`` that no reference page renders."""
    pages = "\n".join((docs_dir / page).read_text() for page in REFERENCE_PAGES)
    return [name for name in module.__all__ if f"::: lightning_resumable.{name}\n" not in pages]


def on_pre_build(config: Any) -> None:
    from mkdocs.exceptions import PluginError

    import lightning_resumable

    missing = undocumented_names(lightning_resumable)
    unreferenced = unreferenced_names(lightning_resumable, Path(config["docs_dir"]))
    if missing or unreferenced:
        raise PluginError(f"public names without a docstring: {missing}; not in the reference pages: {unreferenced}")

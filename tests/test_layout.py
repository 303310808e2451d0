"""The package's shape: no circular imports, the core free of Lightning, modules of a readable size."""

from __future__ import annotations

import re
from pathlib import Path

import lightning_resumable

PACKAGE = Path(lightning_resumable.__file__).parent
CORE = {
    *("_keys", "_torch", "_torchdata", "order", "draws", "batches", "state", "passes", "sampler", "watched_globals"),
    *(
        "randomness",
        "format",
        "verification",
        "contract",
        "libraries",
        "errors",
        "held_generators",
        "produced",
        "settings",
        "_parsing",
        "stream_state",
    ),
}
IMPORT = re.compile(r"^\s*from lightning_resumable(?:\.(\w+))? import \(?\s*(\w+)", re.MULTILINE)
MODULES = {path.stem for path in PACKAGE.glob("*.py")}


def imports() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.glob("*.py"):
        text = path.read_text()  # type-only imports included: a circle of types is a circle to read
        graph[path.stem] = {module or name for module, name in IMPORT.findall(text) if (module or name) in MODULES}
        graph[path.stem].discard(path.stem)
    return graph


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = imports()

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(d == target or (d not in seen and reaches(d, target, seen | {d})) for d in graph[start])

    assert [module for module in graph if reaches(module, module, set())] == []


def test_the_core_imports_neither_lightning_nor_the_other_layers() -> None:
    graph = imports()
    for module in CORE:
        text = (PACKAGE / f"{module}.py").read_text()
        assert not re.search(r"^\s*(from|import) lightning\b", text, re.MULTILINE), module
        assert graph[module] <= CORE, (module, graph[module] - CORE)


def test_no_module_is_much_over_350_lines() -> None:
    lengths = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.glob("*.py")}
    assert {name: length for name, length in lengths.items() if length > 380} == {}


def test_the_callback_class_keeps_the_hooks_and_little_else() -> None:
    """About 200 lines of code (the docstring aside): the hooks, the options, the seed, the world-size policy."""
    import ast

    tree = ast.parse((PACKAGE / "callback.py").read_text())
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ResumableDataCallback"]
    docstring = cls.body[0]
    assert cls.end_lineno is not None and docstring.end_lineno is not None
    code_lines = cls.end_lineno - docstring.end_lineno
    assert code_lines <= 230, code_lines


def test_no_test_module_imports_another() -> None:
    """What tests share lives in ``helpers.py`` (and ``e2e/harness.py``, ``e2e/processes.py``), not in a test module."""
    tests = Path(__file__).parent
    importing = [
        path.relative_to(tests).as_posix()
        for path in tests.rglob("*.py")
        if re.search(
            r"^\s*from \.+(?:\w+\.)*test_\w+ import|^\s*from tests(?:\.\w+)*\.test_\w+ import", path.read_text(), re.M
        )
    ]
    assert importing == []

"""What the docs promise names its test (issue 53): in the pages that state what is exact and what is refused, every
paragraph, list item or table row that says so names a test module (``tests/...py``) or an example that shows it,
and every module, ``module::test`` and backticked ``test_...`` name the pages give exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/long-runs.md", "docs/streams-and-loaders.md", "docs/guarantees.md")
CLAIM = re.compile(r"\bexact|\brefus", re.IGNORECASE)
NAMED = re.compile(r"(?:tests|examples)/[\w/]+\.py")


def blocks(text: str) -> list[tuple[int, str]]:
    """The page's paragraphs, list items and table rows (outside code fences), each with its first line's number;
    a table's header row is not a claim."""
    found: list[tuple[int, str]] = []
    current: list[str] = []
    start, fenced = 0, False
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
        starts = fenced or not line.strip() or re.match(r"\s*([-*] |\d+\. |\||#)", line) is not None
        if starts and current:
            found.append((start, " ".join(current)))
            current = []
        header = line.startswith("|") and number < len(lines) and lines[number].startswith("|---")
        if line.strip() and not fenced and not line.startswith(("```", "#")) and not header:
            start = start if current else number
            current.append(line)
    return [*found, *([(start, " ".join(current))] if current else [])]


def test_the_check_finds_a_claim_without_its_test() -> None:
    page = "| a | b |\n|---|---|\n| this resumes exactly | yes |\n\n- refused, `tests/test_x.py`\n\nexact text\n"
    unnamed = [number for number, block in blocks(page) if CLAIM.search(block) and not NAMED.search(block)]
    assert unnamed == [3, 7]


@pytest.mark.parametrize("page", PAGES)
def test_every_claim_of_exactness_or_refusal_names_its_test(page: str) -> None:
    unnamed = [
        f"{page}:{number}: {block[:100]}"
        for number, block in blocks((ROOT / page).read_text())
        if CLAIM.search(block) and not NAMED.search(block)
    ]
    assert unnamed == [], "claims that name no test:\n" + "\n".join(unnamed)


def functions_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


@pytest.mark.parametrize("page", PAGES)
def test_every_test_the_docs_name_exists(page: str) -> None:
    text = re.sub(r"\s+", " ", (ROOT / page).read_text().replace("::\n", "::"))
    every = {name for path in ROOT.glob("tests/**/*.py") for name in functions_in(path)}
    missing = [path for path in NAMED.findall(text) if not (ROOT / path).is_file()]
    for module, name in re.findall(r"((?:tests)/[\w/]+\.py):: ?(test_\w+)", text):
        if name not in functions_in(ROOT / module):
            missing.append(f"{module}::{name}")
    missing += [name for name in re.findall(r"`(test_\w+)`", text) if name not in every]
    assert missing == []

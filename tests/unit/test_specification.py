"""docs/SPECIFICATION.md names, for every numeric promise, the bench file and a marker
(text that stands in that file where the target is defined or reported): both must
exist, so the specification cannot drift from the benchmarks that measure it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "SPECIFICATION.md"
# A "measured by" cell: `bench/FILE.py`: `MARKER`
_MEASURED_BY = re.compile(r"`(bench/[A-Za-z0-9_/]+\.py)`: `([^`]+)`")
# A promise row: | id | promise | target | measured by | latest | met? |
_ROW = re.compile(r"^\| ([A-Z][0-9]+) \|(.*)\|$", re.M)


def promises() -> list[tuple[str, str]]:
    return _ROW.findall(SPEC.read_text())


def test_the_specification_lists_promises() -> None:
    ids = [pid for pid, _ in promises()]
    assert len(ids) >= 20, ids  # guards the pattern itself
    assert len(ids) == len(set(ids)), "promise ids repeat"


@pytest.mark.parametrize("row", promises(), ids=lambda r: r[0])
def test_every_promise_names_a_bench_row_that_exists(row: tuple[str, str]) -> None:
    pid, cells = row
    found = _MEASURED_BY.findall(cells)
    assert len(found) == 1, f"{pid}: no `bench/…py`: `marker` cell"
    path, marker = found[0]
    source = ROOT / path
    assert source.is_file(), f"{pid}: {path} does not exist"
    assert marker in source.read_text(), f"{pid}: {marker!r} is not in {path}"
    assert cells.rstrip().endswith(("| yes", "| no")), f"{pid}: met? must be yes or no"


def test_every_bench_file_cited_in_prose_exists() -> None:
    cited = set(re.findall(r"`(bench/[A-Za-z0-9_/]+\.py)`", SPEC.read_text()))
    assert cited and all((ROOT / p).is_file() for p in cited), cited

"""Every file path the docs cite exists: a design document that names a test or a module
that is gone has stopped describing the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/design.md", "docs/benchmarks.md"]
# A cited path: a backticked or linked token that ends in a source or data file suffix.
_CITED = re.compile(r"[`(]([A-Za-z0-9_./-]+\.(?:py|json|yaml|yml|c|md|sh|toml))[`)]")
# Where a short path is read from: the checkout, the package, the test tree.
_BASES = [ROOT, ROOT / "src", ROOT / "src" / "agentbox", ROOT / "tests"]
# Paths that name things outside this checkout on purpose.
_ELSEWHERE = {"gateway.yaml", "config.toml", "mcp.json", "SKILL.md", "CLAUDE.md"}


def cited_paths(doc: str) -> list[str]:
    text = (ROOT / doc).read_text()
    # A dotfile name (`.npmrc`) is a kind of file the docs talk about, not one of ours.
    # `../shared/…` is beside the checkout, not in it.
    found = {m for m in _CITED.findall(text) if not re.match(r"\.[^/]|\.\./", m)}
    return sorted(m for m in found if Path(m).name not in _ELSEWHERE)


def exists(cited: str) -> bool:
    if "/" not in cited:  # a sibling named after its neighbour (`gateway/a.py`, `b.py`)
        return (ROOT / cited).exists() or any(ROOT.glob(f"[!.]*/**/{cited}"))
    rel = cited.removeprefix("./").removeprefix("agentbox/")
    return any((base / c).exists() for base in _BASES for c in (cited, rel))


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_path_exists(doc: str) -> None:
    missing = [p for p in cited_paths(doc) if not exists(p)]
    assert not missing, f"{doc} cites paths that do not exist: {missing}"


def test_the_check_sees_citations() -> None:
    # Guards the pattern itself: the design document cites dozens of files.
    assert len(cited_paths("docs/design.md")) > 30

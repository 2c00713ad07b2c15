"""The README's fenced snippets, found by the marker comment above each
(``<!-- kind:name -->``), so the tests run what the README says and the docs cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def snippet(kind: str, name: str) -> str:
    match = re.search(rf"<!-- {kind}:{name} -->\n```\w*\n(.*?)```", README.read_text(), re.DOTALL)
    assert match, f"README has no {kind}:{name} snippet"
    return match.group(1)

"""Real-world shell (tests/data/shell_corpus.jsonl) is analysed, not refused by the parser."""

from __future__ import annotations

import re

from shell_corpus import load, run

_SOURCE = re.compile(r".+ \((?:CC BY 4\.0|MIT|Apache-2\.0)\)")


def test_the_corpus_is_large_and_every_entry_names_its_source_and_licence() -> None:
    rows = load()
    assert len(rows) >= 1000
    assert len({r["cmd"] for r in rows}) == len(rows)
    for row in rows:
        assert set(row) == {"cmd", "source"}, row
        assert row["cmd"].strip() and _SOURCE.fullmatch(row["source"]), row


def test_the_whole_corpus_is_analysed_without_crashes() -> None:
    outcome = run([r["cmd"] for r in load()])
    assert outcome.crashes == []
    assert outcome.analysed_share >= 0.995, (outcome.analysed_share, outcome.parser_refused)

"""Where in a run of raw bytes a secret could be: the pre-filter of the secret scan.

detect-secrets' regexes run at ~10 MB/s in Python, too slow for every byte of a
snapshot. Each of its pattern detectors can only match text that holds some literal
(``AKIA``, ``eyJ``, ``PRIVATE KEY``, ``-us``) or, for the keyword detectors, one of a few
words (``key``, ``pass``, ``token``; case-insensitive); the few whose literal is one or two
characters get a bytes regex of a shape every match has (a ``.`` between two token runs).
``bytes.find`` looks for those at memchr speed, and only the lines around a hit (the
hit's line and the next, each cut ``WINDOW`` bytes from the hit) go to the detectors.

It is exact by construction, not a heuristic: a detector this module cannot pre-filter
(detect-secrets added one) makes every byte a candidate (slow, never blind), and a test
holds the list complete. Non-ASCII letters that IGNORECASE folds to ASCII (the long s, the
Kelvin sign) also make their line a candidate, so ``\\u212aey = …`` is not a way round.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

WINDOW = 2048  # bytes kept each side of a hit; a secret with its keyword is far shorter
_MIN_LITERAL = 3  # a shorter required literal (``A``, ``:``) would hit everywhere
# Detectors whose required literal is too short: a shape each of their matches contains.
_SHAPES = {
    r'(?:\s|=|:|"|^)AP[\dABCDEF][a-zA-Z0-9]{8,}(?:\s|"|$)': rb"AP[0-9A-F][a-zA-Z0-9]{8}",
    r"(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}": rb"A(?:3T|BIA|CCA|KIA|SIA)",
    r"(glpat|gldt|glft|glsoat|glrt)-[A-Za-z0-9_\-]{20,50}(?!\w)": rb"gl(?:pat|dt|ft|soat|rt)-",
    r"AC[a-z0-9]{32}": rb"AC[a-z0-9]{32}",
    r"SK[a-z0-9]{32}": rb"SK[a-z0-9]{32}",
    r"(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}": rb"gh[pousr]_",
    r"\d{8,10}:[0-9A-Za-z_-]{35}": rb"[0-9]{8}:[0-9A-Za-z_-]{35}",
    r"[MNO][a-zA-Z\d_-]{23,25}\.[a-zA-Z\d_-]{6}\.[a-zA-Z\d_-]{27}": (
        rb"[a-zA-Z0-9_-]{6}\.[a-zA-Z0-9_-]{27}"
    ),
}
# The secret scan's own detector (``aws_secret_access_key = …``) needs this word.
_EXTRA_WORDS = ("secret",)
# Letters outside ASCII that IGNORECASE matches to ASCII ones (long s, Kelvin sign, the
# dotted and the dotless i).
_FOLD_TRAPS = tuple(c.encode() for c in "\u017f\u212a\u0130\u0131")


@dataclass(frozen=True)
class Prefilter:
    literals: tuple[bytes, ...]  # case-sensitive
    folded: tuple[bytes, ...]  # looked for in the lower-cased bytes
    shapes: re.Pattern[bytes] | None
    everything: bool  # a detector could not be pre-filtered: all bytes are candidates


def build(detectors: list[tuple[str, str, bool, tuple[str, ...]]]) -> Prefilter:
    """From (pattern, required literal, ignore-case, required words) of each detector."""
    literals: set[bytes] = set()
    folded: set[bytes] = {w.encode() for w in _EXTRA_WORDS}
    shapes: list[bytes] = []
    everything = False
    for pattern, literal, ignore_case, words in detectors:
        if words:
            folded.update(w.encode() for w in words)
        elif len(literal) >= _MIN_LITERAL:
            (folded if ignore_case else literals).add(literal.encode())
        elif pattern in _SHAPES:
            shapes.append(_SHAPES[pattern])
        else:
            everything = True
    joined = re.compile(b"|".join(shapes)) if shapes else None
    return Prefilter(tuple(sorted(literals)), tuple(sorted(folded)), joined, everything)


@functools.cache
def default() -> Prefilter:
    from agentbox.policy.redaction import Redactor

    return build(
        [(d.pattern.pattern, d.literal, d.ignore_case, d.words) for d in Redactor().detectors]
    )


def _hits(data: bytes, needle: bytes, lo: int, hi: int, out: list[int]) -> None:
    at = data.find(needle, lo, hi + len(needle) - 1)
    while at != -1:
        out.append(at)
        at = data.find(needle, at + 1, hi + len(needle) - 1)


def hits(data: bytes, lo: int, hi: int, pf: Prefilter | None = None) -> list[int]:
    """Offsets in [lo, hi) where a candidate starts, sorted."""
    pf = pf or default()
    if pf.everything:
        return list(range(lo, hi, WINDOW)) if hi > lo else []
    out: list[int] = []
    for needle in pf.literals:
        _hits(data, needle, lo, hi, out)
    lowered = data.lower()  # bytes.lower() folds ASCII only: offsets are kept
    for needle in pf.folded:
        _hits(lowered, needle, lo, hi, out)
    for needle in _FOLD_TRAPS:
        _hits(data, needle, lo, hi, out)
    if pf.shapes is not None:
        out.extend(m.start() for m in pf.shapes.finditer(data, lo, min(len(data), hi + 128)))
    return sorted({h for h in out if lo <= h < hi})


def windows(data: bytes, offsets: list[int]) -> list[tuple[int, int]]:
    """Merged [start, end) spans: each hit's line and the next, at most ``WINDOW`` bytes
    either side of it (a line longer than that, as in a binary, is cut)."""
    spans: list[tuple[int, int]] = []
    size = len(data)
    for h in offsets:
        floor = max(0, h - WINDOW)
        start = data.rfind(b"\n", floor, h) + 1 or floor
        ceiling = min(size, h + WINDOW)
        end = data.find(b"\n", h, ceiling)
        if end == -1:
            end = ceiling
        else:  # and the next line (a value may follow its keyword there)
            after = data.find(b"\n", end + 1, min(size, end + 1 + WINDOW))
            end = after if after != -1 else min(size, end + 1 + WINDOW)
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


__all__ = ["WINDOW", "Prefilter", "build", "default", "hits", "windows"]

"""Where in a run of raw bytes a secret could be: the pre-filter of the secret scan.

detect-secrets' regexes run at ~10 MB/s in Python, too slow for every byte of a
snapshot. Each of its pattern detectors can only match text that holds some literal
(``AKIA``, ``eyJ``, ``PRIVATE KEY``, ``-us``) or, for the keyword detectors, one of a few
words followed by an assignment (``pass =``, ``token:``; case-insensitive); the few whose
literal is one or two characters get a shape every match has (``AKIA`` or ``ASIA``…, a
``.`` between two token runs), as a regex that starts with a literal. ``bytes.find`` and
re's literal-prefix search look for those in C, and only the lines around a hit (its line
and the next, each cut ``WINDOW`` bytes from the hit) go to the detectors.

It is exact by construction, not a heuristic: a detector this module cannot pre-filter
(detect-secrets added one) makes every byte a candidate (slow, never blind), and a test
holds the list complete. Non-ASCII letters that IGNORECASE folds to ASCII (the long s, the
Kelvin sign) also make their line a candidate, so ``\\u212aey = …`` is not a way round.
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass

from agentbox.storage import secrethits

WINDOW = 2048  # bytes kept each side of a hit; a secret with its keyword is far shorter
_MIN_LITERAL = 3  # a shorter required literal (``A``, ``:``) would hit everywhere
# What follows the word in every keyword detector (a quote, ``]``, spaces, ``=``, ``:``).
_AFTER = rb"[\"'\] =:]"
# The keyword detectors (``cloudant_password = …``) hold one of these words then _AFTER:
# a regex that starts with a literal, which re looks for in C, then checks the rest.
_WORDS = {
    "key": rb"key" + _AFTER,
    "pw": rb"pw[\"'\] =:d]",  # pwd
    "pass": rb"pass[\"'\] =:w]",  # password
    "token": rb"token" + _AFTER,
}
# Detectors whose required literal is too short: literals or literal-led regexes that
# every one of their matches contains.
_SHAPES: dict[str, tuple[bytes, ...]] = {
    r'(?:\s|=|:|"|^)AP[\dABCDEF][a-zA-Z0-9]{8,}(?:\s|"|$)': (rb"AP[0-9A-F][a-zA-Z0-9]{8}",),
    r"(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}": (
        b"A3T",
        b"ABIA",
        b"ACCA",
        b"AKIA",
        b"ASIA",
    ),
    r"(glpat|gldt|glft|glsoat|glrt)-[A-Za-z0-9_\-]{20,50}(?!\w)": (
        b"glpat-",
        b"gldt-",
        b"glft-",
        b"glsoat-",
        b"glrt-",
    ),
    r"AC[a-z0-9]{32}": (rb"AC[a-z0-9]{32}",),
    r"SK[a-z0-9]{32}": (rb"SK[a-z0-9]{32}",),
    r"(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}": (b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_"),
    r"\d{8,10}:[0-9A-Za-z_-]{35}": (rb":[0-9A-Za-z_-]{35}",),
    r"[MNO][a-zA-Z\d_-]{23,25}\.[a-zA-Z\d_-]{6}\.[a-zA-Z\d_-]{27}": (
        rb"\.[a-zA-Z0-9_-]{6}\.[a-zA-Z0-9_-]{27}",
    ),
}
# For those same detectors, what a window's text must hold before their (slow) regex runs
# on it: their shape as a str regex. Digits are ASCII ones (``\\d`` in the detectors also
# takes other scripts' digits, which no issued token holds).
GATES = {
    r"(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}": r"A3T|ABIA|ACCA|AKIA|ASIA",
    r"\d{8,10}:[0-9A-Za-z_-]{35}": r":[0-9A-Za-z_-]{35}",
    r"[MNO][a-zA-Z\d_-]{23,25}\.[a-zA-Z\d_-]{6}\.[a-zA-Z\d_-]{27}": (
        r"\.[a-zA-Z0-9_-]{6}\.[a-zA-Z0-9_-]{27}"
    ),
    r'(?:\s|=|:|"|^)AP[\dABCDEF][a-zA-Z0-9]{8,}(?:\s|"|$)': r"AP[0-9A-F][a-zA-Z0-9]{8}",
}
# Letters outside ASCII that IGNORECASE matches to ASCII ones (long s, Kelvin sign, the
# dotted and the dotless i).
_FOLD_TRAPS = tuple(c.encode() for c in "\u017f\u212a\u0130\u0131")
_PLAIN = re.compile(rb"[A-Za-z0-9_\-]*")


@dataclass(frozen=True)
class Prefilter:
    literals: tuple[bytes, ...]  # case-sensitive
    folded: tuple[bytes, ...]  # looked for in the lower-cased bytes
    shapes: tuple[re.Pattern[bytes], ...]  # in the bytes
    folded_shapes: tuple[re.Pattern[bytes], ...]  # in the lower-cased bytes
    everything: bool  # a detector could not be pre-filtered: all bytes are candidates


def _add(item: bytes, literals: set[bytes], regexes: set[bytes]) -> None:
    (literals if _PLAIN.fullmatch(item) else regexes).add(item)


def build(detectors: list[tuple[str, str, bool, tuple[str, ...]]]) -> Prefilter:
    """From (pattern, required literal, ignore-case, required words) of each detector."""
    literals: set[bytes] = set()
    folded: set[bytes] = {b"secret"}  # the scan's own detector: aws_secret_access_key = …
    shapes: set[bytes] = set()
    folded_shapes: set[bytes] = set()
    everything = False
    for pattern, literal, ignore_case, words in detectors:
        if len(literal) >= _MIN_LITERAL:
            (folded if ignore_case else literals).add(literal.encode())
        elif words and all(w in _WORDS for w in words):
            for w in words:
                _add(_WORDS[w], folded, folded_shapes)
        elif pattern in _SHAPES:
            for item in _SHAPES[pattern]:
                _add(item, literals, shapes)
        else:
            everything = True
    return Prefilter(
        tuple(sorted(literals)),
        tuple(sorted(folded)),
        tuple(re.compile(x) for x in sorted(shapes)),
        tuple(re.compile(x) for x in sorted(folded_shapes)),
        everything,
    )


@functools.cache
def default() -> Prefilter:
    from agentbox.policy.redaction import Redactor

    return build(
        [(d.pattern.pattern, d.literal, d.ignore_case, d.words) for d in Redactor().detectors]
    )


_PIECE = re.compile(rb"(\\.|\[(?:\\.|[^\]])*\]|[^\\\[])(?:\{(\d+)\})?")


def _byte_set(piece: bytes, fold: bool) -> frozenset[int]:
    """The bytes one piece of a shape matches: ``x``, ``\\.`` or a class like ``[a-z_-]``."""
    if not piece.startswith(b"["):
        chars = {piece[-1]}
    else:
        body = re.sub(rb"\\(.)", rb"\1", piece[1:-1])
        chars = set()
        i = 0
        while i < len(body):
            if i + 2 < len(body) and body[i + 1] == ord("-"):
                chars.update(range(body[i], body[i + 2] + 1))
                i += 3
            else:
                chars.add(body[i])
                i += 1
    if fold:
        chars |= {c ^ 0x20 for c in chars if chr(c).isascii() and chr(c).isalpha()}
    return frozenset(chars)


def _needle(shape: bytes, fold: bool) -> list[tuple[frozenset[int], int]]:
    """A literal or a shape (literal bytes, escapes and classes, each with an optional
    ``{n}``: nothing that varies in length) as the C pass's needle."""
    out: list[tuple[frozenset[int], int]] = []
    pos = 0
    while pos < len(shape):
        m = _PIECE.match(shape, pos)
        assert m is not None, shape
        out.append((_byte_set(m.group(1), fold), int(m.group(2) or 1)))
        pos = m.end()
    return out


@functools.cache
def _program(pf: Prefilter) -> tuple[bytes, int]:
    """The C pass's program for ``pf``, and the index of its first fold trap needle."""
    needles = [_needle(re.escape(x), False) for x in pf.literals]
    needles += [_needle(re.escape(x), True) for x in pf.folded]
    needles += [_needle(x.pattern, False) for x in pf.shapes]
    needles += [_needle(x.pattern, True) for x in pf.folded_shapes]
    traps = len(needles)
    needles += [_needle(re.escape(x), False) for x in _FOLD_TRAPS]
    return secrethits.program(needles), traps


def _hits(data: bytes, needle: bytes, lo: int, hi: int, out: list[int]) -> None:
    at = data.find(needle, lo, hi + len(needle) - 1)
    while at != -1:
        out.append(at)
        at = data.find(needle, at + 1, hi + len(needle) - 1)


_TRAP_LEADS = frozenset(t[0] for t in _FOLD_TRAPS)
_LETTERS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def _in_word(data: bytes, at: int) -> bool:
    """Whether the fold trap at ``at`` touches a letter or another trap: in every keyword
    it could spell (a long-s "secret", a Kelvin-sign "token") it does; in binary noise it
    mostly does not."""
    before = data[at - 1] if at else -1
    width = 3 if data[at] == 0xE2 else 2
    after = data[at + width] if at + width < len(data) else -1
    after_trap = (
        data[max(0, at - 2) : at] in _FOLD_TRAPS or data[max(0, at - 3) : at] in _FOLD_TRAPS
    )
    return before in _LETTERS or after in _LETTERS or after in _TRAP_LEADS or after_trap


def hits(data: bytes, lo: int, hi: int, pf: Prefilter | None = None) -> list[int]:
    """Offsets in [lo, hi) where a candidate starts, sorted."""
    pf = pf or default()
    if pf.everything:
        return list(range(lo, hi, WINDOW)) if hi > lo else []
    if secrethits.available():
        prog, traps = _program(pf)
        with contextlib.suppress(secrethits.Unsupported):  # then the Python pass
            found = secrethits.hits(data, lo, hi, prog)
            return sorted({h for h, k in found if k < traps or _in_word(data, h)})
    return _python_hits(data, lo, hi, pf)


def _python_hits(data: bytes, lo: int, hi: int, pf: Prefilter) -> list[int]:
    out: list[int] = []
    for needle in pf.literals:
        _hits(data, needle, lo, hi, out)
    lowered = data.lower()  # bytes.lower() folds ASCII only: offsets are kept
    for needle in pf.folded:
        _hits(lowered, needle, lo, hi, out)
    traps: list[int] = []
    for needle in _FOLD_TRAPS:
        _hits(data, needle, lo, hi, traps)
    out.extend(h for h in traps if _in_word(data, h))
    reach = min(len(data), hi + 256)  # a shape that starts before hi may end past it
    for shape in pf.shapes:
        out.extend(m.start() for m in shape.finditer(data, lo, reach))
    for shape in pf.folded_shapes:
        out.extend(m.start() for m in shape.finditer(lowered, lo, reach))
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


__all__ = ["GATES", "WINDOW", "Prefilter", "build", "default", "hits", "windows"]

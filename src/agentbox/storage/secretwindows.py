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
holds the list complete. A letter s, k or i of a case-insensitive needle may also be
spelled by the non-ASCII letter that IGNORECASE folds to it (the long s, the Kelvin sign,
the dotted and the dotless i), so ``\\u212aey = …`` is a candidate too: not a way round.

The pass (``secrethits.c``) looks at the bytes and, in the same loop, at their even and
their odd bytes (UTF-16 as plain text), each view read in place.
"""

from __future__ import annotations

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
# ``pw`` alone is in Cloudant's detector only, right after ``cl``, ``clou`` or
# ``cloudant``, a ``_`` or ``-``, or ``api``: the letter before it is one of those
# ends. Two random bytes spell ``pw`` (either case) too often: on noise it was most of
# the windows the detectors ran on. ``pwd`` (IBM's, SoftLayer's) needs no letter before.
_WORDS: dict[str, tuple[bytes, ...]] = {
    "key": (rb"key" + _AFTER,),
    "pw": (rb"pwd" + _AFTER, rb"[ltui_\-]pw" + _AFTER),
    "pass": (rb"pass[\"'\] =:w]",),  # password
    "token": (rb"token" + _AFTER,),
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
# Detectors whose required literal is long enough but common in noise (three letters
# either case: ~1 window a MiB each, most of what noise gave the detectors), and a
# fixed-length shape every one of their matches holds (in their case mode), used instead.
# Slack's token: ``xox``, one of its letters, ``-``. (AWS's secret key, ``aws`` then a
# keyword at most 20 characters on: no fixed-length shape but its quoted value, whose
# quote starts so many places in noise that the C pass cost more than the windows saved.)
_TIGHTER: dict[str, tuple[bytes, ...]] = {
    r"xox(?:a|b|p|o|s|r)-(?:\d+-)+[a-z0-9]+": (rb"xox[abposr]-",),
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
_TRAP_LETTERS = {  # the letter each stands for, in a folded needle's byte set
    ord("s"): ("\u017f".encode(),),
    ord("k"): ("\u212a".encode(),),
    ord("i"): ("\u0130".encode(), "\u0131".encode()),
}
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
        if pattern in _TIGHTER:
            for item in _TIGHTER[pattern]:
                _add(item, *((folded, folded_shapes) if ignore_case else (literals, shapes)))
        elif len(literal) >= _MIN_LITERAL:
            (folded if ignore_case else literals).add(literal.encode())
        elif words and all(w in _WORDS for w in words):
            for w in words:
                for item in _WORDS[w]:
                    _add(item, folded, folded_shapes)
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
def _needles(pf: Prefilter) -> list[tuple[bool, list[tuple[frozenset[int], int]]]]:
    """Every needle of ``pf`` as (folded, elements), in the order the hits name them."""
    needles = [(False, _needle(re.escape(x), False)) for x in pf.literals]
    needles += [(True, _needle(re.escape(x), True)) for x in pf.folded]
    needles += [(False, _needle(x.pattern, False)) for x in pf.shapes]
    needles += [(True, _needle(x.pattern, True)) for x in pf.folded_shapes]
    return needles


@functools.cache
def _program(pf: Prefilter) -> bytes | None:
    """The C pass's program for ``pf``; None: the C pass cannot run it (or is missing)."""
    if not secrethits.available():
        return None
    try:
        prog = secrethits.program(_needles(pf))
        secrethits.hits(b"", 0, 0, prog)  # compiles it: Unsupported here, not mid-scan
    except secrethits.Unsupported:
        return None
    return prog


def hits(data: bytes, lo: int, hi: int, pf: Prefilter | None = None) -> list[int]:
    """Offsets in [lo, hi) where a candidate starts, sorted."""
    return view_hits(data, lo, hi, False, pf)[0]


def view_hits(
    data: bytes, lo: int, hi: int, views: bool, pf: Prefilter | None = None
) -> tuple[list[int], list[int], list[int]]:
    """Candidates in [lo, hi) of ``data``, and (with ``views``) in [lo//2, hi//2) of its
    even bytes ``data[0::2]`` and its odd bytes ``data[1::2]`` (offsets in each view),
    sorted: one pass in C, the views never copied out."""
    pf = pf or default()
    if pf.everything:
        every = list(range(lo, hi, WINDOW)) if hi > lo else []
        half = list(range(lo // 2, hi // 2, WINDOW)) if views and hi // 2 > lo // 2 else []
        return every, half, list(half)
    prog = _program(pf)
    if prog is None:
        if not views:
            return _python_hits(data, lo, hi, pf), [], []
        return (
            _python_hits(data, lo, hi, pf),
            _python_hits(data[0::2], lo // 2, hi // 2, pf),
            _python_hits(data[1::2], lo // 2, hi // 2, pf),
        )
    out: tuple[list[int], list[int], list[int]] = ([], [], [])
    for at, _, view in secrethits.hits(data, lo, hi, prog, views):
        found = out[view]
        if not found or found[-1] != at:  # several needles at one place: one candidate
            found.append(at)
    return out


def _hits(data: bytes, needle: bytes, lo: int, hi: int, out: list[int]) -> None:
    at = data.find(needle, lo, hi + len(needle) - 1)
    while at != -1:
        out.append(at)
        at = data.find(needle, at + 1, hi + len(needle) - 1)


def _python_hits(data: bytes, lo: int, hi: int, pf: Prefilter) -> list[int]:
    out: list[int] = []
    for needle in pf.literals:
        _hits(data, needle, lo, hi, out)
    lowered = data.lower()  # bytes.lower() folds ASCII only: offsets are kept
    for needle in pf.folded:
        _hits(lowered, needle, lo, hi, out)
    reach = min(len(data), hi + 256)  # a shape that starts before hi may end past it
    for shape in pf.shapes:
        out.extend(m.start() for m in shape.finditer(data, lo, reach))
    for shape in pf.folded_shapes:
        out.extend(m.start() for m in shape.finditer(lowered, lo, reach))
    if any(t in data for t in _FOLD_TRAPS):
        for spelled in _trap_spellings(pf):
            out.extend(m.start() for m in spelled.finditer(data, lo, reach))
    return sorted({h for h in out if lo <= h < hi})


@functools.cache
def _trap_spellings(pf: Prefilter) -> list[re.Pattern[bytes]]:
    """The folded needles as regexes in which a letter s, k or i may also be a fold trap
    (the C pass's rule): every place, overlapping ones included (a lookahead)."""
    patterns = []
    for folded, needle in _needles(pf):
        if not folded:
            continue
        parts = []
        for byte_set, count in needle:
            alternatives = [b"[" + b"".join(re.escape(bytes([b])) for b in sorted(byte_set)) + b"]"]
            for letter, traps in _TRAP_LETTERS.items():
                if letter in byte_set:
                    alternatives += [re.escape(t) for t in traps]
            parts.append(b"(?:" + b"|".join(alternatives) + b"){%d}" % count)
        patterns.append(re.compile(b"(?=" + b"".join(parts) + b")"))
    return patterns


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

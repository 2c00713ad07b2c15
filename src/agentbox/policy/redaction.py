"""Redaction of tool output (and anything else leaving the gateway for a model or a log).

Two sources of findings, replaced by typed placeholders such as ``[REDACTED:aws-access-key]``:

* literal secrets the operator names (``redaction.literals_from_env``): their values are
  read from the environment at start and replaced wherever they appear;
* the pattern detectors of detect-secrets (AWS, GitHub, GitLab, Slack, Stripe, private
  keys, JWTs, …). The entropy and keyword detectors are left out: on command output they
  flag ordinary words, and a redactor that mangles ``hello world`` is not usable.

A private key is redacted from its BEGIN line through its END line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

_SKIPPED_DETECTORS = {
    "Base64HighEntropyString",
    "HexHighEntropyString",
    "KeywordDetector",
    "IPPublicDetector",  # a public IP is not a secret
}
_PRIVATE_KEY_BLOCK = re.compile(
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----"
    r".*?(-----END[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\Z)",
    re.DOTALL,
)
_MIN_LITERAL = 4  # shorter values would redact ordinary text
# Some detectors are slow keyword regexes (lookbehinds tried at every position). Each can
# only match text containing one of these words (its patterns are case-insensitive), so
# they run only then: an exact prefilter, not a heuristic.
_CREDENTIAL_WORDS = ("key", "pw", "pass", "token")
_REQUIRED_WORDS = {
    "(?:key|pwd|pw|password|pass|token)": _CREDENTIAL_WORDS,
    "(?:key|pwd|password|pass|token)": _CREDENTIAL_WORDS,
    "(?:secret[-_]?(?:access)?[-_]?key)": ("key",),
    r"\.cloudant\.com": ("cloudant.com",),
    "api.softlayer.com": ("softlayer.com",),
}


def _parsed(pattern: re.Pattern[str]) -> Any:
    try:
        from re import _parser  # type: ignore[attr-defined]

        return _parser.parse(pattern.pattern, pattern.flags)
    except Exception:  # a private module: if it changes, prefilters are simply not used
        return None


def _literal_runs(items: Any, out: list[str]) -> list[str]:
    """Runs of literal characters every match of the sequence ``items`` must contain:
    top-level literals and plain groups (not branches, repeats or flag changes)."""
    from re import _constants  # type: ignore[attr-defined]

    run: list[str] = []
    for op, av in items:
        if op is _constants.LITERAL:
            run.append(chr(av))
            continue
        if run:
            out.append("".join(run))
            run = []
        if op is _constants.SUBPATTERN and not av[1] and not av[2]:
            _literal_runs(av[3], out)
    if run:
        out.append("".join(run))
    return out


def _required_words(pattern: re.Pattern[str]) -> tuple[str, ...]:
    for fragment, words in _REQUIRED_WORDS.items():
        if fragment in pattern.pattern:
            return words
    return ()


@dataclass(frozen=True)
class _Detector:
    """A pattern and what any text it matches must contain (exact prefilters, checked
    before the regex runs: most detectors then cost one substring search)."""

    kind: str
    pattern: re.Pattern[str]
    min_length: int = 0
    literal: str = ""  # a substring every match contains
    words: tuple[str, ...] = ()  # a match contains one of these (lower case)
    ignore_case: bool = False

    @classmethod
    def of(cls, kind: str, pattern: re.Pattern[str]) -> _Detector:
        tree = _parsed(pattern)
        if tree is None:
            return cls(kind, pattern)
        literal = max(_literal_runs(tree, []), key=len, default="")
        ignore_case = bool(pattern.flags & re.IGNORECASE)
        if ignore_case:
            literal = literal.lower()
        words = _required_words(pattern)
        return cls(kind, pattern, int(tree.getwidth()[0]), literal, words, ignore_case)

    def may_match(self, text: str, lowered: str | None) -> bool:
        """False when the prefilters rule a match in ``text`` out; ``lowered``: ``text``
        with ASCII letters lower-cased, or None when that is not exact (see findings)."""
        if self.ignore_case:
            return lowered is None or not (
                (self.literal and self.literal not in lowered)
                or (self.words and not any(w in lowered for w in self.words))
            )
        return not self.literal or self.literal in text


def kind_slug(secret_type: str) -> str:
    """A detect-secrets type as the short kind redaction and the secret scan report."""
    return re.sub(r"[^a-z0-9]+", "-", secret_type.lower()).strip("-")


@dataclass(frozen=True)
class Finding:
    kind: str
    start: int
    end: int


class Redactor:
    def __init__(self, literals: dict[str, str] | None = None, detectors: bool = True) -> None:
        self.literals = {
            name: value for name, value in (literals or {}).items() if len(value) >= _MIN_LITERAL
        }
        self.detectors: list[_Detector] = []
        if detectors:
            mapping: dict[str, Any] = dict(get_mapping_from_secret_type_to_class())
            for secret_type, plugin in sorted(mapping.items()):
                if plugin.__name__ in _SKIPPED_DETECTORS:
                    continue
                if plugin.__name__ == "PrivateKeyDetector":
                    self.detectors.append(_Detector.of("private-key", _PRIVATE_KEY_BLOCK))
                    continue
                for pattern in getattr(plugin(), "denylist", ()) or ():
                    self.detectors.append(_Detector.of(kind_slug(secret_type), pattern))
        # Shortest possible match first: a short string (an id, a tool name) stops early.
        self.detectors.sort(key=lambda d: d.min_length)

    @classmethod
    def from_env(cls, names: Iterable[str], detectors: bool = True) -> Redactor:
        return cls({n: os.environ[n] for n in names if os.environ.get(n)}, detectors)

    def findings(self, text: str) -> list[Finding]:
        found: list[Finding] = []
        for name, value in self.literals.items():
            start = text.find(value)
            while start != -1:
                found.append(Finding(name, start, start + len(value)))
                start = text.find(value, start + 1)
        lowered = text.lower() if text.isascii() else None
        size = len(text)
        # may_match inlined: this loop runs for every string leaving the gateway.
        for d in self.detectors:
            if size < d.min_length:
                break  # sorted by min_length: no later detector can match either
            if d.ignore_case:
                # These also match some non-ASCII letters whose lower() differs (U+017F
                # long s matches "s"): only ASCII text can be prefiltered exactly.
                if lowered is not None and (
                    (d.literal and d.literal not in lowered)
                    or (d.words and not any(w in lowered for w in d.words))
                ):
                    continue
            elif d.literal and d.literal not in text:
                continue
            for match in d.pattern.finditer(text):
                if match.end() > match.start():
                    found.append(Finding(d.kind, match.start(), match.end()))
        return found

    def redact(self, text: str) -> str:
        if not text:
            return text
        found = self.findings(text)
        if not found:
            return text
        # Merge overlapping spans; the earliest-starting (then longest) finding names it.
        found.sort(key=lambda f: (f.start, -f.end))
        out: list[str] = []
        cursor = 0
        current: Finding | None = None
        for f in found:
            if current is not None and f.start < current.end:
                current = Finding(current.kind, current.start, max(current.end, f.end))
                continue
            if current is not None:
                out += [text[cursor : current.start], f"[REDACTED:{current.kind}]"]
                cursor = current.end
            current = f
        assert current is not None
        out += [text[cursor : current.start], f"[REDACTED:{current.kind}]", text[current.end :]]
        return "".join(out)

    def redact_bytes(self, data: bytes) -> bytes:
        # surrogateescape keeps invalid UTF-8 bytes exactly as they were around the findings.
        text = data.decode("utf-8", "surrogateescape")
        redacted = self.redact(text)
        return data if redacted is text else redacted.encode("utf-8", "surrogateescape")

    def contains_secret(self, text: str) -> bool:
        return bool(self.findings(text))

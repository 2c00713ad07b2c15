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


def _min_width(pattern: re.Pattern[str]) -> int:
    """The shortest text ``pattern`` can match: shorter strings skip it (exact)."""
    try:
        from re import _parser  # type: ignore[attr-defined]

        return int(_parser.parse(pattern.pattern, pattern.flags).getwidth()[0])
    except Exception:  # a private module: if it changes, fall back to always running
        return 0


def _required_words(pattern: re.Pattern[str]) -> tuple[str, ...]:
    for fragment, words in _REQUIRED_WORDS.items():
        if fragment in pattern.pattern:
            return words
    return ()


def _slug(secret_type: str) -> str:
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
        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        self._needs: dict[re.Pattern[str], tuple[str, ...]] = {}
        self._min: dict[re.Pattern[str], int] = {}
        if detectors:
            mapping: dict[str, Any] = dict(get_mapping_from_secret_type_to_class())
            for secret_type, plugin in sorted(mapping.items()):
                if plugin.__name__ in _SKIPPED_DETECTORS:
                    continue
                if plugin.__name__ == "PrivateKeyDetector":
                    self.patterns.append(("private-key", _PRIVATE_KEY_BLOCK))
                    continue
                for pattern in getattr(plugin(), "denylist", ()) or ():
                    self.patterns.append((_slug(secret_type), pattern))
                    self._needs[pattern] = _required_words(pattern)
                    self._min[pattern] = _min_width(pattern)

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
        lowered = text.lower()
        for kind, pattern in self.patterns:
            if len(text) < self._min.get(pattern, 0):
                continue
            needs = self._needs.get(pattern, ())
            if needs and not any(word in lowered for word in needs):
                continue
            for match in pattern.finditer(text):
                if match.end() > match.start():
                    found.append(Finding(kind, match.start(), match.end()))
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

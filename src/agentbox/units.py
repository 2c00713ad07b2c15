"""Parsing of human sizes ("512MiB", "2G") and durations ("90s", "15m", "24h")."""

from __future__ import annotations

import re

from agentbox.errors import InvalidRequest

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, what: str = "size") -> int:
    """Bytes in ``value``; plain integers are bytes. Refuses zero, negatives and unknown units."""
    if isinstance(value, bool):
        raise InvalidRequest(f"{what} must be a size like 512MiB, not a boolean")
    if isinstance(value, int):
        number: float = value
    elif not isinstance(value, str):  # JSON and YAML can hold anything here
        raise InvalidRequest(f"{what} must be a size like 512MiB, not {type(value).__name__}")
    else:
        m = _NUMBER_UNIT.match(value)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _SIZE_UNITS:
            raise InvalidRequest(
                f"{what} {value!r} is not a size: use a number with an optional unit "
                "(B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB), e.g. 512MiB"
            )
        number = float(m.group(1)) * _SIZE_UNITS[unit]
    if number < 1:
        raise InvalidRequest(f"{what} must be positive, got {value!r}")
    return int(number)


def parse_duration(value: int | float | str, what: str = "duration") -> float:
    """Seconds in ``value``; plain numbers are seconds."""
    if isinstance(value, bool):
        raise InvalidRequest(f"{what} must be a duration like 30s, not a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif not isinstance(value, str):  # JSON and YAML can hold anything here
        raise InvalidRequest(f"{what} must be a duration like 30s, not {type(value).__name__}")
    else:
        m = _NUMBER_UNIT.match(value)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _DURATION_UNITS:
            raise InvalidRequest(
                f"{what} {value!r} is not a duration: use a number with s, m, h or d, e.g. 15m"
            )
        seconds = float(m.group(1)) * _DURATION_UNITS[unit]
    if seconds <= 0:
        raise InvalidRequest(f"{what} must be positive, got {value!r}")
    return seconds


def format_size(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


def human_size(n: int) -> str:
    """``n`` bytes for people: 256MiB, 1.5GiB, 900B (one decimal at most)."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor:
            return f"{n / factor:.1f}".removesuffix(".0") + unit
    return f"{n}B"

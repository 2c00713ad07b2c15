"""SHA-256 of the small inputs agentbox names things by (a spec, a C source, a seccomp
profile), without ``hashlib``: hashlib loads OpenSSL (``_hashlib``), a few milliseconds of
a one-shot script's start-up (tests/unit/test_import_weight.py). CPython's own built-in
SHA-256 gives the same digest; bulk hashing (snapshots) keeps hashlib's faster one."""

from __future__ import annotations

import os

try:
    from _sha256 import sha256  # type: ignore[import-not-found]  # CPython 3.11
except ImportError:  # pragma: no cover - 3.12 renamed it; any other build: hashlib's
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]
    except ImportError:
        from hashlib import sha256


def sha256_hex(data: bytes) -> str:
    return str(sha256(data).hexdigest())


def token_hex(nbytes: int) -> str:
    """As ``secrets.token_hex`` (which is os.urandom), without secrets' imports (hmac,
    and with it OpenSSL; random)."""
    return os.urandom(nbytes).hex()

"""State the gateway hands to a client and gets back (MCP's ``requestState``), sealed.

The client is untrusted: it may return any bytes. Sealed state is ``payload.mac`` (both
base64url), with an HMAC-SHA256 under a key kept in ``$AGENTBOX_HOME/gateway-state.key``
(0600, made once, so state survives a gateway restart). Anything that does not verify is
treated as no state at all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

KEY_FILE = "gateway-state.key"


def load_key(home: Path) -> bytes:
    path = home / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return path.read_bytes()
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def seal(key: bytes, state: dict[str, Any]) -> str:
    payload = json.dumps(state, sort_keys=True, separators=(",", ":")).encode()
    mac = hmac.new(key, payload, hashlib.sha256).digest()
    return f"{_b64(payload)}.{_b64(mac)}"


def unseal(key: bytes, sealed: str | None) -> dict[str, Any] | None:
    """The state, or None when ``sealed`` is missing, malformed or was not made here."""
    if not sealed or sealed.count(".") != 1:
        return None
    try:
        payload_b64, mac_b64 = sealed.split(".")
        payload, mac = _unb64(payload_b64), _unb64(mac_b64)
    except ValueError:
        return None
    if not hmac.compare_digest(mac, hmac.new(key, payload, hashlib.sha256).digest()):
        return None
    try:
        state = json.loads(payload)
    except ValueError:
        return None
    return state if isinstance(state, dict) else None

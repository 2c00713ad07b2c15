"""Who is calling: the operator, or a session token bound to one sandbox and a tool set.

* The operator token is injected at start (environment variable or file), never read from
  the configuration file, and compared in constant time.
* Session tokens are random 256-bit strings shown once; only their SHA-256 is stored
  (``gateway_tokens`` in the state database, so tokens survive a restart and work on
  every gateway replica sharing a PostgreSQL state). They expire
  after their TTL, are revoked with their sandbox, and carry a tool scope.
* A per-token token bucket bounds the call rate.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agentbox.client import unixhttp
from agentbox.errors import (
    AgentboxError,
    HostUnsupported,
    InsufficientScope,
    InvalidRequest,
    RateLimited,
    Unauthenticated,
)
from agentbox.policy.principal import Principal
from agentbox.state.db import Connection, Database
from agentbox.state.sqlite import database
from agentbox.state.tables import GATEWAY_TOKENS

if TYPE_CHECKING:
    from agentbox.config.settings import AuthSettings

TOKEN_PREFIX = "abx_"  # noqa: S105 - a prefix, not a secret
# Beside the home's socket, where the SDK's socket client reads it too (one spelling).
OPERATOR_TOKEN_FILE = unixhttp.TOKEN_FILE


@dataclass(frozen=True)
class TokenInfo:
    id: str
    sandbox: str
    tools: list[str] | None
    created_at: float
    expires_at: float
    revoked_at: float | None

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "sandbox": self.sandbox,
            "tools": self.tools,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked": self.revoked_at is not None,
        }


def challenge(
    e: AgentboxError, resource_metadata: str | None = None, token_presented: bool = True
) -> str | None:
    """The ``WWW-Authenticate`` value for an auth failure (RFC 6750 section 3, with RFC
    9728's ``resource_metadata``), or None when ``e`` is not one."""
    params = ['realm="agentbox"']
    if resource_metadata:
        params.append(f'resource_metadata="{resource_metadata}"')
    if isinstance(e, InsufficientScope):
        params.append('error="insufficient_scope"')
        if e.details.get("scope"):
            params.append(f'scope="{_quotable(str(e.details["scope"]))}"')
    elif isinstance(e, Unauthenticated):
        if not token_presented:  # RFC 6750: no error code when no credentials were sent
            return "Bearer " + ", ".join(params)
        params.append('error="invalid_token"')
    else:
        return None
    params.append(f'error_description="{_quotable(e.message)}"')
    return "Bearer " + ", ".join(params)


def _quotable(text: str) -> str:
    """RFC 6750's error_description alphabet: printable ASCII without '"' and '\\'."""
    return "".join(c if " " <= c <= "~" and c not in '"\\' else "'" for c in text)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_operator_token(env_name: str | None, file: Path | None) -> str:
    """The operator token from the environment or a file; refuses weak or missing ones."""
    token = None
    if file is not None:
        try:
            token = file.read_text().strip()
        except OSError as e:
            raise HostUnsupported(
                f"cannot read the operator token file {file}: {e.strerror}"
            ) from e
    elif env_name:
        token = os.environ.get(env_name, "").strip() or None
    if not token:
        where = f"the file {file}" if file else f"${env_name}"
        raise HostUnsupported(
            f"no operator token: set {where} to a random secret (e.g. "
            "`export AGENTBOX_OPERATOR_TOKEN=$(openssl rand -hex 32)`), or use "
            "`agentbox serve --generate-operator-token` for a local run"
        )
    if len(token) < 16:
        raise HostUnsupported("the operator token is too short: use at least 16 random characters")
    return token


def injected_operator_token(auth: AuthSettings) -> str | None:
    """The operator token from the configured file or variable; None if neither is set."""
    injected = auth.operator_token_file is not None or bool(
        auth.operator_token_env and os.environ.get(auth.operator_token_env)
    )
    return (
        load_operator_token(auth.operator_token_env, auth.operator_token_file) if injected else None
    )


def find_operator_token(auth: AuthSettings, home: Path) -> str | None:
    """The operator token as ``agentbox serve`` finds it: injected, else the one it
    generated into ``HOME/operator.token``; None when there is none."""
    path = home / OPERATOR_TOKEN_FILE
    found = injected_operator_token(auth)
    return found if found is not None or not path.exists() else load_operator_token(None, path)


class TokenStore:
    """``where``: the SQLite file (``HOME/gateway.db``), or the shared database."""

    def __init__(self, where: Path | Database, operator_token: str, default_ttl: int) -> None:
        self._operator_hash = _hash(operator_token)
        self.default_ttl = default_ttl
        self.db = database(where, (GATEWAY_TOKENS,), synchronous="FULL")

    def _db(self) -> Connection:
        return self.db.conn()

    def issue(
        self, sandbox_id: str, ttl: int | None = None, tools: list[str] | None = None
    ) -> tuple[str, TokenInfo]:
        ttl = self.default_ttl if ttl is None else ttl
        if ttl <= 0 or ttl > 30 * 86400:
            raise InvalidRequest("ttl must be between 1 second and 30 days")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        info = TokenInfo(
            "tok-" + secrets.token_hex(6),
            sandbox_id,
            sorted(tools) if tools else None,
            now,
            now + ttl,
            None,
        )
        self._db().execute(
            "INSERT INTO gateway_tokens (id, hash, sandbox, tools, created_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (info.id, _hash(token), sandbox_id, json.dumps(info.tools), now, info.expires_at),
        )
        return token, info

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise Unauthenticated("missing bearer token: send `Authorization: Bearer <token>`")
        digest = _hash(token)
        if hmac.compare_digest(digest, self._operator_hash):
            return Principal("operator")
        row = (
            self._db()
            .execute(
                "SELECT id, hash, sandbox, tools, expires_at, revoked_at FROM gateway_tokens"
                " WHERE hash = ?",
                (digest,),
            )
            .fetchone()
        )
        # The lookup is by hash; the comparison below keeps the check constant-time anyway.
        if row is None or not hmac.compare_digest(row[1], digest):
            raise Unauthenticated("unknown token: ask the operator for a new session token")
        token_id, _, sandbox, tools, expires_at, revoked_at = row
        if revoked_at is not None:
            raise Unauthenticated(f"token {token_id} was revoked (its sandbox was destroyed?)")
        if expires_at <= time.time():
            raise Unauthenticated(f"token {token_id} expired; ask the operator for a new one")
        scope = frozenset(json.loads(tools)) if tools and tools != "null" else None
        return Principal("session", token_id, sandbox, scope)

    def revoke(self, token_id: str) -> bool:
        cur = self._db().execute(
            "UPDATE gateway_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
            (time.time(), token_id),
        )
        return cur.rowcount > 0

    def revoke_sandbox(self, sandbox_id: str) -> int:
        cur = self._db().execute(
            "UPDATE gateway_tokens SET revoked_at = ? WHERE sandbox = ? AND revoked_at IS NULL",
            (time.time(), sandbox_id),
        )
        return cur.rowcount

    def list(self, sandbox_id: str | None = None) -> list[TokenInfo]:
        query = "SELECT id, sandbox, tools, created_at, expires_at, revoked_at FROM gateway_tokens"
        args: tuple[str, ...] = ()
        if sandbox_id:
            query += " WHERE sandbox = ?"
            args = (sandbox_id,)
        rows = self._db().execute(query + " ORDER BY created_at", args).fetchall()
        return [
            TokenInfo(r[0], r[1], json.loads(r[2]) if r[2] else None, r[3], r[4], r[5])
            for r in rows
        ]


class RateLimiter:
    """A token bucket per key: ``per_minute`` calls, bursting up to a minute's worth."""

    def __init__(self, per_minute: int) -> None:
        self.rate = per_minute / 60.0
        self.capacity = float(per_minute)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def check(self, key: str) -> None:
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.rate)
            if tokens < 1:
                retry = (1 - tokens) / self.rate
                self._buckets[key] = (tokens, now)
                raise RateLimited(
                    f"too many calls for this token; retry in {retry:.1f}s", retry_after=retry
                )
            self._buckets[key] = (tokens - 1, now)

"""Who an E2B request is, and which sandboxes it may reach.

* ``X-API-KEY`` (control plane) is the operator token (every project) or one of the
  project keys of ``e2b.api_keys`` (read from the environment at start): a project key
  reaches only its project's sandboxes; another project's look like no sandbox at all.
* ``X-Access-Token`` (envd) is the sandbox's envd token: an HMAC of its id under the
  gateway's sealing key, so it needs no storage, dies with the sandbox and cannot be
  made for another one. The calls it makes are audited as the key that created it.
* ``e2b_sandboxes`` (state database) keeps what E2B has and agentbox does not: the key
  that made the sandbox, its template alias and its metadata; ``e2b_pauses`` the
  timeout of a sandbox made with ``on_timeout: pause`` (``timeouts.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox.config.settings import E2BSettings
from agentbox.errors import HostUnsupported, NotFound, SandboxNotRunning, Unauthenticated
from agentbox.gateway.auth import TokenStore
from agentbox.policy.principal import OPERATOR, Principal
from agentbox.state.db import Database
from agentbox.state.sqlite import SqliteDB
from agentbox.state.tables import E2B_PAUSES, E2B_SANDBOXES


@dataclass(frozen=True)
class Caller:
    key: str  # "operator" or the project key's name
    project: str | None  # None: every project (the operator)

    def principal(self, sandbox_id: str | None = None) -> Principal:
        """The agentbox principal the pipeline sees: the operator, or a session principal
        named after the key and bound to the one sandbox it acts on."""
        if self.key == OPERATOR:
            return Principal("operator")
        return Principal("session", token_id=f"e2b-key:{self.key}", sandbox_id=sandbox_id)


@dataclass(frozen=True)
class Owned:
    id: str
    caller: Caller
    alias: str
    metadata: dict[str, str]


@dataclass(frozen=True)
class Pausing:
    """E2B's ``on_timeout: pause``: paused (or, without ``keep_memory``, stopped) at
    ``pause_at`` (None: not running, no deadline); ``auto_resume``: a call wakes it."""

    id: str
    pause_at: float | None
    timeout_s: float
    keep_memory: bool
    auto_resume: bool


class E2BAccess:
    """Its table lives beside the session tokens: ``HOME/gateway.db``, or the shared
    database ``tokens`` uses."""

    def __init__(self, settings: E2BSettings, tokens: TokenStore, home: Path, key: bytes) -> None:
        self.tokens = tokens
        self._key = key
        self._keys: list[tuple[str, Caller]] = []
        for entry in settings.api_keys:
            value = os.environ.get(entry.key_env, "").strip()
            if len(value) < 16:
                raise HostUnsupported(
                    f"e2b.api_keys {entry.name}: set ${entry.key_env} to a random secret of "
                    "16 characters or more"
                )
            self._keys.append((value, Caller(entry.name, entry.project)))
        shared = tokens.db if not isinstance(tokens.db, SqliteDB) else None
        self.db: Database = shared or SqliteDB(home / "gateway.db", (E2B_SANDBOXES, E2B_PAUSES))

    # control plane -----------------------------------------------------------------------
    def caller(self, api_key: str | None) -> Caller:
        if not api_key:
            raise Unauthenticated("missing X-API-KEY: set E2B_API_KEY to an agentbox key")
        found = None
        for value, caller in self._keys:  # every key compared: constant time in the match
            if hmac.compare_digest(value.encode(), api_key.encode()):
                found = caller
        if found is not None:
            return found
        if self.tokens.authenticate(api_key).is_operator:  # raises for anything else
            return Caller(OPERATOR, None)
        raise Unauthenticated("a session token is not an E2B API key; use a project key")

    def record(self, sandbox_id: str, caller: Caller, alias: str, metadata: dict[str, str]) -> None:
        self.db.conn().execute(
            "INSERT INTO e2b_sandboxes (id, key, alias, metadata) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET key = excluded.key, alias = excluded.alias,"
            " metadata = excluded.metadata",
            (sandbox_id, caller.key, alias, json.dumps(metadata)),
        )

    def forget(self, sandbox_id: str) -> None:
        self.db.conn().execute("DELETE FROM e2b_sandboxes WHERE id = ?", (sandbox_id,))
        self.db.conn().execute("DELETE FROM e2b_pauses WHERE id = ?", (sandbox_id,))

    def set_pausing(self, p: Pausing) -> None:
        self.db.conn().execute(
            "INSERT INTO e2b_pauses (id, pause_at, timeout_s, keep_memory, auto_resume)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET pause_at = excluded.pause_at,"
            " timeout_s = excluded.timeout_s, keep_memory = excluded.keep_memory,"
            " auto_resume = excluded.auto_resume",
            (p.id, p.pause_at, p.timeout_s, int(p.keep_memory), int(p.auto_resume)),
        )

    def pausing(self, sandbox_id: str) -> Pausing | None:
        query = "SELECT id, pause_at, timeout_s, keep_memory, auto_resume FROM e2b_pauses"
        row = self.db.conn().execute(query + " WHERE id = ?", (sandbox_id,)).fetchone()
        return None if row is None else _pausing(row)

    def pausings(self) -> list[Pausing]:
        query = "SELECT id, pause_at, timeout_s, keep_memory, auto_resume FROM e2b_pauses"
        rows = self.db.conn().execute(query + " WHERE pause_at IS NOT NULL")
        return [_pausing(row) for row in rows.fetchall()]

    def owned(self, sandbox_id: str) -> Owned | None:
        query = "SELECT id, key, alias, metadata FROM e2b_sandboxes WHERE id = ?"
        row = self.db.conn().execute(query, (sandbox_id,)).fetchone()
        return None if row is None else self._owned(row)

    def all_owned(self) -> dict[str, Owned]:
        rows = self.db.conn().execute("SELECT id, key, alias, metadata FROM e2b_sandboxes")
        return {row[0]: self._owned(row) for row in rows.fetchall()}

    def _owned(self, row: Any) -> Owned:
        sandbox_id, key, alias, metadata = row
        project = next((c.project for _, c in self._keys if c.key == key), None)
        return Owned(sandbox_id, Caller(key, project), alias, json.loads(metadata))

    @staticmethod
    def may_reach(caller: Caller, project: str) -> bool:
        return caller.project is None or project == caller.project

    # envd -------------------------------------------------------------------------------
    def envd_token(self, sandbox_id: str) -> str:
        return hmac.new(self._key, f"e2b-envd:{sandbox_id}".encode(), hashlib.sha256).hexdigest()

    def envd_caller(self, sandbox_id: str | None, token: str | None) -> Caller:
        """The key behind an envd request, from its sandbox id and access token."""
        if not sandbox_id:
            raise NotFound("no E2b-Sandbox-Id header: set E2B_SANDBOX_URL to this gateway")
        if not token or not hmac.compare_digest(token, self.envd_token(sandbox_id)):
            raise Unauthenticated(f"missing or wrong X-Access-Token for sandbox {sandbox_id}")
        owned = self.owned(sandbox_id)
        if owned is None:  # the token was valid: the sandbox existed and is gone
            raise gone(sandbox_id)
        return owned.caller


def _pausing(row: Any) -> Pausing:
    sandbox_id, pause_at, timeout_s, keep_memory, auto_resume = row
    return Pausing(sandbox_id, pause_at, timeout_s, bool(keep_memory), bool(auto_resume))


def gone(sandbox_id: str) -> SandboxNotRunning:
    # "was not found" is what the SDKs look for to report a killed or timed-out sandbox.
    return SandboxNotRunning(f"The sandbox {sandbox_id} was not found (killed or timed out)")

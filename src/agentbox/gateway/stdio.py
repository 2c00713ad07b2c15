"""``agentbox mcp``: the gateway's MCP tools over stdio, for one sandbox.

A client that spawns its servers (Claude Code, Codex, VS Code with a ``command``) runs
this; it acts as a session bound to one sandbox: the one given, or a fresh one destroyed
when the client leaves. Two ways, one policy and audit path each time:

* A gateway serves this home (:mod:`agentbox.gateway.presence`): it owns the audit chain
  (one writer) and its configuration is the policy, so this process is a relay. With the
  operator token (found as ``agentbox serve`` finds it) it creates the sandbox and issues
  a session token bound to it over REST, then forwards each JSON-RPC message from stdin
  to the gateway's ``/mcp`` with that token and writes the answers to stdout. The token
  lives only in this process's memory and is revoked when it leaves.
* No gateway: the tools run in-process (this process opens the audit chain), with the
  configuration given by ``--config``. Approvals wait, like handshake-era clients.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import anyio
import httpx2
from anyio.abc import TaskGroup
from mcp.shared.inbound import NAME_BEARING_METHODS, encode_header_value
from mcp_types import PROTOCOL_VERSION_META_KEY

from agentbox.client.remote import GatewayClient, gateway_errors
from agentbox.config.host import agentbox_home
from agentbox.config.settings import GatewaySettings
from agentbox.errors import AgentboxError, HostUnsupported, Unauthenticated
from agentbox.gateway.app import open_audit
from agentbox.gateway.auth import TokenStore, find_operator_token
from agentbox.gateway.mcp_server import build_mcp_server, jsonrpc_error
from agentbox.gateway.presence import Served, listening, serving
from agentbox.gateway.service import Gateway
from agentbox.policy.approvals import ApprovalStore
from agentbox.policy.principal import Principal
from agentbox.policy.redaction import Redactor
from agentbox.runtime.runtime import Runtime

_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
_READY_S = 30.0


def serve_stdio(settings: GatewaySettings, sandbox_id: str | None, template: str) -> None:
    # The client stops a server with SIGTERM after closing stdin: clean up then too.
    signal.signal(signal.SIGTERM, _exit)
    home = agentbox_home()
    served = serving(home)
    if served is None:
        _serve_in_process(settings, sandbox_id, template)
        return
    token = find_operator_token(settings.gateway.auth, home)
    if token is None:
        raise Unauthenticated(
            f"a gateway serves {home} at {served.url}, and agentbox mcp talks to it with the "
            f"operator token: none in ${settings.gateway.auth.operator_token_env} or "
            f"{home}/operator.token"
        )
    _wait_listening(served)
    _relay_to(served.url, token, sandbox_id, template)


def _exit(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def _relay_to(url: str, operator_token: str, sandbox_id: str | None, template: str) -> None:
    operator = GatewayClient(url, operator_token)
    try:
        created = sandbox_id is None
        if sandbox_id is None:
            sandbox_id = str(
                operator.request("POST", "/v1/sandboxes", json={"template": template})["id"]
            )
        else:
            operator.request("GET", f"/v1/sandboxes/{sandbox_id}")
        relay = _Relay(url, lambda: _issue(operator, str(sandbox_id)))
        try:
            anyio.run(relay.run)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the cleanup finish
            with contextlib.suppress(AgentboxError):
                if created:  # its tokens go with it
                    operator.request("DELETE", f"/v1/sandboxes/{sandbox_id}")
                elif relay.token_id is not None:
                    operator.request("DELETE", f"/v1/tokens/{relay.token_id}")
    finally:
        operator.close()


def _wait_listening(served: Served) -> None:
    """The gateway advertises itself before it binds its socket: wait until it has (and
    send nothing to a port some other process holds)."""
    deadline = time.monotonic() + _READY_S
    while not listening(served):
        if time.monotonic() > deadline:
            raise HostUnsupported(
                f"the gateway serving this home (pid {served.pid}) does not listen on "
                f"{served.url} after {_READY_S:.0f} s (is the port another process's?); "
                "see the gateway's log"
            )
        time.sleep(0.1)


def _issue(operator: GatewayClient, sandbox_id: str) -> tuple[str, str]:
    issued = operator.request("POST", "/v1/tokens", json={"sandbox": sandbox_id})
    return str(issued["token"]), str(issued["id"])


class _Relay:
    """stdin JSON-RPC lines -> POST /mcp (session token) -> stdout, one task per request."""

    def __init__(self, url: str, issue: Callable[[], tuple[str, str]]) -> None:
        self.url = url.rstrip("/") + "/mcp"
        self.issue = issue
        self.token, self.token_id = issue()
        self.protocol: str | None = None  # negotiated by a handshake-era initialize
        self.in_flight: dict[Any, anyio.CancelScope] = {}
        self.out_lock = anyio.Lock()
        self.renew_lock = anyio.Lock()

    async def run(self) -> None:
        stdin = anyio.wrap_file(sys.stdin.buffer)
        async with httpx2.AsyncClient(timeout=None) as http, anyio.create_task_group() as tg:
            async for line in stdin:
                if line.strip():
                    await self._dispatch(http, tg, line)
            # stdin closed: what is in flight is still answered (a client that will not
            # wait stops this process with SIGTERM).

    async def _dispatch(self, http: httpx2.AsyncClient, tg: TaskGroup, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            await self._write(_failure(None, {"code": -32700, "message": "parse error"}))
            return
        if isinstance(message, dict) and "method" not in message:
            return  # a response to the server: a stateless gateway sends no requests
        if not isinstance(message, dict) or not _valid_id(message.get("id")):
            # Batches too: MCP 2025-06-18 dropped them, and the gateway answers one message.
            invalid = {"code": -32600, "message": "invalid request: one JSON-RPC object per line"}
            await self._write(_failure(None, invalid))
            return
        if message["method"] == "notifications/cancelled":
            cancelled = _object(message.get("params")).get("requestId")
            scope = self.in_flight.get(cancelled) if _valid_id(cancelled) else None
            if scope is not None:
                scope.cancel()  # aborting the POST is how HTTP cancels it
            return
        tg.start_soon(self._forward, http, message)

    async def _forward(self, http: httpx2.AsyncClient, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        is_request = request_id is not None
        with anyio.CancelScope() as scope:
            if is_request:
                self.in_flight[request_id] = scope
            try:
                answer = await self._post(http, message)
            finally:
                self.in_flight.pop(request_id, None)
            if is_request:
                await self._write(answer)

    async def _post(self, http: httpx2.AsyncClient, message: dict[str, Any]) -> dict[str, Any]:
        request_id = message.get("id")
        try:
            with gateway_errors(self.url, lost=True):
                used = self.token
                response = await http.post(self.url, json=message, headers=self._headers(message))
                if response.status_code == 401:  # the session token expired: a new one, once
                    async with self.renew_lock:
                        if self.token == used:  # not renewed meanwhile by a concurrent request
                            self.token, self.token_id = await anyio.to_thread.run_sync(self.issue)
                    response = await http.post(
                        self.url, json=message, headers=self._headers(message)
                    )
        except AgentboxError as e:  # a lost gateway too: GatewayUnreachable
            return _failure(request_id, jsonrpc_error(e))
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            error = AgentboxError(f"the gateway answered HTTP {response.status_code}, not JSON-RPC")
            return _failure(request_id, jsonrpc_error(error))
        if message.get("method") == "initialize" and isinstance(answer.get("result"), dict):
            self.protocol = answer["result"].get("protocolVersion")
        return {**answer, "id": request_id}

    def _headers(self, message: dict[str, Any]) -> dict[str, str]:
        headers = {**_HEADERS, "Authorization": f"Bearer {self.token}"}
        params = _object(message.get("params"))
        meta = _object(params.get("_meta"))
        method = str(message["method"])
        if PROTOCOL_VERSION_META_KEY in meta:  # 2026-07-28: HTTP headers mirror the body
            headers["MCP-Protocol-Version"] = str(meta[PROTOCOL_VERSION_META_KEY])
            headers["Mcp-Method"] = method
            name = params.get(NAME_BEARING_METHODS.get(method, ""))
            if isinstance(name, str):
                headers["Mcp-Name"] = encode_header_value(name)
        elif self.protocol and method != "initialize":
            headers["MCP-Protocol-Version"] = self.protocol
        return headers

    async def _write(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        async with self.out_lock:
            await anyio.to_thread.run_sync(_write_stdout, data)


def _failure(request_id: Any, error: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _valid_id(value: Any) -> bool:
    """A JSON-RPC id (a notification has none)."""
    return value is None or (isinstance(value, (str, int)) and not isinstance(value, bool))


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _write_stdout(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _serve_in_process(settings: GatewaySettings, sandbox_id: str | None, template: str) -> None:
    from mcp.server.stdio import stdio_server

    runtime = Runtime()
    created = sandbox_id is None
    if sandbox_id is None:
        # The config's network for a new sandbox, as the gateway's REST create applies it.
        network = settings.sandbox.network.model_dump()
        sandbox_id = runtime.create({"template": template, "network": network}).id
    else:
        runtime.get(sandbox_id)
    redactor = Redactor.from_env(
        settings.redaction.literals_from_env, detectors=settings.redaction.detectors != "none"
    )
    audit = open_audit(settings, runtime.home, redactor)
    # Tokens are not used over stdio, but the store keeps revocation consistent.
    tokens = TokenStore(runtime.home / "gateway.db", operator_token="stdio-" + "x" * 32,
                        default_ttl=settings.gateway.auth.ttl_seconds)  # fmt: skip
    gateway = Gateway(settings, runtime, tokens, ApprovalStore(runtime.home / "gateway.db"),
                      audit, redactor)  # fmt: skip
    principal = Principal("session", token_id="stdio", sandbox_id=sandbox_id)  # noqa: S106
    server = build_mcp_server(gateway, lambda ctx: principal)

    async def main() -> None:
        async with stdio_server() as (read, write):
            options: Any = server.create_initialization_options()
            await server.run(read, write, options)

    try:
        anyio.run(main)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the cleanup finish
        with contextlib.suppress(Exception):
            gateway.browsers.close_all()
        with contextlib.suppress(Exception):
            gateway.desktops.close_all()
        audit.close()
        if created:
            with contextlib.suppress(Exception):
                runtime.destroy(sandbox_id)

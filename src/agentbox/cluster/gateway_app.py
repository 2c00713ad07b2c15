"""A gateway replica in cluster mode: no sandbox of its own, every request sent on to the
node that runs its sandbox, bodies and answers streamed both ways (command output, SSE
events, file up- and downloads pass through as they come).

Where a request goes:

    POST /v1/sandboxes, POST /v1/snapshots/ID/restore   placement (cluster/placement.py;
                                                        a node's warm pool first)
    /v1/sandboxes/ID/...                                ID's node (the registry)
    POST /v1/tools/NAME, POST /mcp                      arguments.sandbox_id, else the
                                                        session token's sandbox
    POST /v1/tokens                                     its sandbox's node
    GET /v1/sandboxes                                   every ready node, lists joined
    GET /v1/audit, GET /v1/events (no sandbox)          every ready node, merged (fanout.py)
    /e2b/..., Host PORT-ID.DOMAIN, /files?signature=    by sandbox, as above (e2b_routes.py)
    anything else (tokens, approvals, tasks, ...)       any ready node: that state is shared

The replica authenticates the bearer token against the shared table before routing (a
session token only reaches its own sandbox) and the node checks it again. Replicas share
nothing but PostgreSQL: any number run side by side, and each sweeps for silent nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentbox import hints
from agentbox.audit.log import AuditLog
from agentbox.cluster import e2b_routes, fanout, pki, placement, ws_relay
from agentbox.cluster.audit_chain import ChainShipper, replica_chain_id
from agentbox.cluster.node_client import NodeClient
from agentbox.cluster.registry import Node, Placement, Registry
from agentbox.config.settings import GatewaySettings
from agentbox.errors import (
    AgentboxError,
    InvalidRequest,
    NodeUnreachable,
    SandboxLost,
    SandboxNotFound,
    StateUnavailable,
)
from agentbox.gateway.auth import TokenStore
from agentbox.gateway.e2b.ports import host_pattern
from agentbox.gateway.rest_errors import error_response
from agentbox.policy.principal import Principal
from agentbox.state.db import Database

log = logging.getLogger(__name__)
_SANDBOX_PATH = re.compile(r"^/v1/sandboxes/([A-Za-z0-9_.-]+)(?:/|$)")
_RESTORE_PATH = re.compile(r"^/v1/snapshots/[^/]+/restore$")
_DOT_SEGMENT = re.compile(r"(^|/)\.{1,2}(/|$)")
_SANDBOX_URI = re.compile(r"^sandbox://([A-Za-z0-9_.-]+)/")
_CREATE_ATTEMPTS = 3
_TOKENS = "/v1/tokens"
_CACHE_MAX = 100_000


def _bearer(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _stream_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        yield message.get("body", b"")
        if not message.get("more_body"):
            return


def _json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _mcp_tool_error(request: dict[str, Any], e: AgentboxError) -> dict[str, Any]:
    """What the sandbox's node would have answered an MCP call it could not reach: a
    tool result with ``isError`` whose text says what to do (the model reads it)."""
    text = f"error[{e.code}]: {hints.render(e, 'mcp')}"
    return {
        "jsonrpc": "2.0",
        "id": request.get("id"),
        "result": {"content": [{"type": "text", "text": text}], "isError": True},
    }


class ClusterGateway:
    """The replica's ASGI app (wrapped in the single-host gateway's Host/size guard)."""

    def __init__(
        self,
        db: Database,
        tokens: TokenStore,
        nodes: NodeClient,
        heartbeat_seconds: float,
        lost_after_seconds: float,
        audit: AuditLog | None = None,
        chain: ChainShipper | None = None,
        ws: ws_relay.WebSocketRelay | None = None,
        e2b_domain: str = "e2b.localhost",
    ) -> None:
        self.ws = ws
        self.port_hosts = host_pattern(e2b_domain)  # sandbox.get_host(port)
        self._recording: set[asyncio.Task[None]] = set()
        self.db = db
        self.audit = audit  # this replica's own chain: one record per routed request
        self.chain = chain
        self.registry = Registry(db)
        self.tokens = tokens
        self.nodes = nodes
        self.heartbeat_seconds = heartbeat_seconds
        self.lost_after = lost_after_seconds
        # Creates this replica placed per node since the heartbeats it ranks by.
        self._placed: dict[str, list[float]] = {}
        # Creates this replica sent to claim a node's warm sandbox, likewise.
        self._claimed: dict[str, list[float]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._where: dict[str, tuple[Placement, float]] = {}
        self._cache_s = min(1.0, heartbeat_seconds)
        # The node list, read at most once per heartbeat interval: reading every node row
        # per create was the first limit at 1,000 nodes (docs/scale.md, the simulation).
        # Nodes change only by heartbeat; creates placed since are in ``_placed``.
        self._nodes_s = heartbeat_seconds
        self._nodes: tuple[list[Node], float] | None = None
        self._nodes_lock = asyncio.Lock()

    # ASGI ------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "websocket":  # the desktop's VNC relay: to its sandbox's node
            await self._websocket(scope, receive, send)
            return
        if self.audit is None or scope["path"] in ("/healthz", "/readyz"):
            await self._answer(scope, receive, send)
            return
        started, status = time.monotonic(), [0]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        error = None
        try:
            error = await self._answer(scope, receive, sending)
        finally:
            # Appended beside the next request, not before it: the answer is complete, and
            # an fsync per request (audit.fsync: always) would hold a keep-alive connection.
            task = asyncio.create_task(self._record(scope, status[0], error, started))
            self._recording.add(task)
            task.add_done_callback(self._recording.discard)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        match = _SANDBOX_PATH.match(path)
        if match is None or _DOT_SEGMENT.search(path) or self.ws is None:
            await ws_relay.refuse(receive, send, 1008, "only a sandbox's WebSocket is routed")
            return
        sandbox, started = match.group(1), time.monotonic()
        try:
            principal = await asyncio.to_thread(self.tokens.authenticate, ws_relay.bearer(scope))
            scope["agentbox.actor"], scope["agentbox.sandbox"] = principal.actor, sandbox
            principal.require_sandbox(sandbox)
            where = self._checked(sandbox, await self._lookup(sandbox))
        except AgentboxError as e:
            await ws_relay.refuse(receive, send, 4401, f"{e.code}: {e.message}")
            if self.audit is not None:
                await self._record(scope, e.http_status, e.code, started)
            return
        scope["agentbox.node"] = where.node

        async def ended(why: str) -> None:
            if self.audit is not None:
                await self._record(scope, 101, None, started)

        await self.ws.relay(scope, receive, send, where.address or "", on_end=ended)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> str | None:
        """Route and answer; the code of the error answered, if one was."""
        try:
            await self._http(scope, receive, send)
        except AgentboxError as e:
            await error_response(e)(scope, receive, send)
            return e.code
        return None

    async def _record(self, scope: Scope, status: int, error: str | None, started: float) -> None:
        """This replica's audit record of one request: who, what, which node, the answer.
        Never fails the request (it has been answered): a disk that refuses is logged."""
        assert self.audit is not None
        try:
            await self.audit.append_async(
                decision="denied" if status in (401, 403) else "routed",
                actor=scope.get("agentbox.actor"),
                sandbox=scope.get("agentbox.sandbox"),
                error=error,
                duration_ms=round((time.monotonic() - started) * 1000, 3),
                extra={
                    "method": scope.get("method", "WEBSOCKET"),
                    "path": scope["path"],
                    "status": status,
                    "node": scope.get("agentbox.node"),
                },
            )
        except Exception:
            log.exception("the replica's audit record failed")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.chain is not None:
                    await asyncio.to_thread(self.chain.start)
                self._sweeper = asyncio.create_task(self._sweep_forever())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._sweeper is not None:
                    self._sweeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._sweeper
                await self.nodes.aclose()
                if self.ws is not None:
                    await self.ws.aclose()
                if self._recording:  # records of the last answers, before the log closes
                    await asyncio.gather(*self._recording, return_exceptions=True)
                if self.audit is not None:
                    self.audit.close()
                if self.chain is not None:  # after close: its last records are durable
                    await asyncio.to_thread(self.chain.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _sweep_forever(self) -> None:
        """Declare silent nodes lost, but only after this replica has itself reached the
        database for ``lost_after`` seconds in a row: when PostgreSQL (or this replica)
        was away, every node's last heartbeat is old for a reason that is not the node,
        and they get that long to write a new one."""
        connected_since = time.monotonic()
        while True:
            try:
                if time.monotonic() - connected_since >= self.lost_after:
                    lost = await asyncio.to_thread(self.registry.sweep, self.lost_after)
                    if lost:
                        log.warning("cluster nodes unreachable, their sandboxes lost: %s", lost)
                else:
                    await asyncio.to_thread(self.db.ping)
            except AgentboxError as e:  # state_unavailable: next round reconnects
                log.warning("cluster sweep failed: %s", e)
                connected_since = time.monotonic()
            await asyncio.sleep(self.heartbeat_seconds)

    # routing ---------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if e2b_routes.is_e2b_root(scope, self.port_hosts):  # routed by Host or signature
            await self._e2b(scope, receive, send)
            return
        if path == "/healthz":
            await JSONResponse({"status": "ok"})(scope, receive, send)
            return
        if path == "/readyz":
            await self._readyz(scope, receive, send)
            return
        if _DOT_SEGMENT.search(path):  # routed by one sandbox, normalised to another later
            raise InvalidRequest("a path with . or .. segments: send the normalised path")
        if e2b_routes.is_e2b(path):  # E2B keys: the node checks them (e2b_routes.py)
            await self._e2b(scope, receive, send)
            return
        principal = await asyncio.to_thread(self.tokens.authenticate, _bearer(scope))
        scope["agentbox.actor"] = principal.actor
        if path == "/v1/cluster/nodes" and method == "GET":
            principal.require_operator("listing cluster nodes")
            nodes = await asyncio.to_thread(self.registry.nodes)
            await JSONResponse([n.to_dict() for n in nodes])(scope, receive, send)
            return
        if method == "POST" and (path == "/v1/sandboxes" or _RESTORE_PATH.match(path)):
            principal.require_operator("creating a sandbox")
            await self._create(scope, receive, send, await _read_body(receive))
            return
        if method == "GET" and path == "/v1/sandboxes":
            await self._list(scope, receive, send, principal)
            return
        if match := _SANDBOX_PATH.match(path):
            await self._to_sandbox(match.group(1), principal, scope, receive, send, None)
            return
        if method == "POST" and (path.startswith("/v1/tools/") or path in ("/mcp", _TOKENS)):
            body = await _read_body(receive)
            request = _json(body)
            sandbox = self._named_sandbox(path, request) or principal.sandbox_id
            if sandbox is not None:
                try:
                    await self._to_sandbox(sandbox, principal, scope, receive, send, body)
                except (SandboxLost, SandboxNotFound, NodeUnreachable) as e:
                    if path != "/mcp" or not isinstance(request, dict):
                        raise
                    await JSONResponse(_mcp_tool_error(request, e))(scope, receive, send)
                return
            await self._to_any(scope, receive, send, body)
            return
        if method == "GET" and path == "/v1/events" and principal.sandbox_id is None:
            query = scope.get("query_string", b"").decode()
            if m := re.search(r"(?:^|&)sandbox=([A-Za-z0-9_.-]+)", query):
                await self._to_sandbox(m.group(1), principal, scope, receive, send, None)
                return
            principal.require_operator("following every sandbox's events")
            await fanout.events(self.nodes, await self._ready_nodes(), scope, receive, send)
            return
        if method == "GET" and path == "/v1/audit":
            principal.require_operator("reading the audit trail")
            query = scope.get("query_string", b"").decode()
            if m := re.search(r"(?:^|&)node=([a-z0-9-]+)(?:&|$)", query):  # one chain
                ready = {n.id: n for n in await self._ready_nodes()}
                if (node := ready.get(m.group(1))) is None:
                    raise NodeUnreachable(
                        f"cluster node {m.group(1)} is not ready (GET /v1/cluster/nodes)",
                        node=m.group(1),
                        retry_after=2,
                    )
                await self._proxy(node.id, node.address, scope, send, b"")
                return
            await fanout.audit(self.nodes, await self._ready_nodes(), scope, receive, send)
            return
        if principal.sandbox_id is not None:  # its sandbox's node knows what it may see
            await self._to_sandbox(principal.sandbox_id, principal, scope, receive, send, None)
            return
        await self._to_any(scope, receive, send, None)

    async def _e2b(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._e2b_routed(scope, receive, send)
        except AgentboxError as e:  # the replica's own answer, in E2B's shape for the SDKs
            await e2b_routes.error(e)(scope, receive, send)

    async def _e2b_routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind, sandbox = e2b_routes.route(scope, self.port_hosts)
        if kind == "port":  # the node's own port-host layer reads the Host: keep it
            scope["agentbox.keep_host"] = True
        if kind == "signed":
            await self._signed_files(scope, send, await _read_body(receive))
        elif kind == "create":
            await self._create(scope, receive, send, await _read_body(receive))
        elif kind == "list":
            nodes = await self._ready_nodes()
            await e2b_routes.merged_list(self.nodes, nodes, scope, receive, send)
        elif sandbox is not None:
            await self._to_sandbox(sandbox, None, scope, receive, send, None)
        else:
            await self._to_any(scope, receive, send, None)

    @staticmethod
    def _named_sandbox(path: str, body: Any) -> str | None:
        """The sandbox a tool call or an MCP request names in its body, if any."""
        if not isinstance(body, dict):
            return None
        if path == _TOKENS:  # a token is minted where its sandbox is known
            return body["sandbox"] if isinstance(body.get("sandbox"), str) else None
        if path == "/mcp":
            params = body.get("params")
            if not isinstance(params, dict):
                return None
            uri = params.get("uri")
            if isinstance(uri, str) and (m := _SANDBOX_URI.match(uri)):
                return m.group(1)
            body = params
        arguments = body.get("arguments")
        if isinstance(arguments, dict) and isinstance(arguments.get("sandbox_id"), str):
            return str(arguments["sandbox_id"])
        return None

    async def _readyz(self, scope: Scope, receive: Receive, send: Send) -> None:
        failing = []
        try:
            await asyncio.to_thread(self.db.ping)
            nodes = await asyncio.to_thread(self.registry.nodes)
            if not any(n.state == "ready" and n.heartbeat_age < self.lost_after for n in nodes):
                failing.append({"name": "cluster nodes", "detail": "no ready node"})
        except StateUnavailable as e:
            failing.append({"name": "state database", "detail": e.message})
        body = {"status": "ready" if not failing else "not ready", "failing": failing}
        await JSONResponse(body, status_code=200 if not failing else 503)(scope, receive, send)

    async def _node_list(self) -> tuple[list[Node], float]:
        """Every node row, and how many seconds old the list is (add that to each
        ``heartbeat_age``): read once per ``_nodes_s`` by one request, the others wait."""
        async with self._nodes_lock:
            now = time.monotonic()
            if self._nodes is None or now - self._nodes[1] >= self._nodes_s:
                self._nodes = (await asyncio.to_thread(self.registry.nodes), time.monotonic())
            nodes, read_at = self._nodes
        return nodes, time.monotonic() - read_at

    async def _ready_nodes(self) -> list[Node]:
        nodes, age = await self._node_list()
        return [n for n in nodes if n.state == "ready" and n.heartbeat_age + age < self.lost_after]

    async def _to_sandbox(
        self,
        sandbox: str,
        principal: Principal | None,
        scope: Scope,
        receive: Receive,
        send: Send,
        body: bytes | None,
    ) -> None:
        scope["agentbox.sandbox"] = sandbox
        if principal is not None:  # None: the node authenticates (E2B keys)
            principal.require_sandbox(sandbox)
        where = self._checked(sandbox, await self._lookup(sandbox))
        content = body if body is not None else _stream_body(receive)
        try:
            await self._proxy(where.node, where.address or "", scope, send, content)
        except NodeUnreachable as e:
            if not e.details.get("delivered"):  # declared lost since we cached it?
                self._checked(sandbox, await self._lookup(sandbox, fresh=True))
            raise
        finally:
            if scope["method"] == "DELETE":
                self._where.pop(sandbox, None)

    async def _lookup(self, sandbox: str, fresh: bool = False) -> Placement | None:
        """The registry's row, from a cache of running sandboxes' rows kept at most
        ``_cache_s`` (a call skips a database round trip; a sandbox declared lost is
        refused at most that long later, and its node destroys it at its next beat)."""
        now = time.monotonic()
        hit = None if fresh else self._where.get(sandbox)
        if hit is not None and hit[1] > now:
            return hit[0]
        where = await asyncio.to_thread(self.registry.lookup, sandbox)
        if where is not None and where.state == "running" and where.address is not None:
            if len(self._where) > _CACHE_MAX:
                self._where.clear()
            self._where[sandbox] = (where, now + self._cache_s)
        else:
            self._where.pop(sandbox, None)
        return where

    @staticmethod
    def _checked(sandbox: str, where: Placement | None) -> Placement:
        if where is None or where.address is None:
            raise SandboxNotFound(f"sandbox {sandbox} does not exist (destroyed or never created)")
        if where.state == "lost":
            raise SandboxLost(
                f"sandbox {sandbox} was lost with its cluster node {where.node}, which stopped "
                "answering: its processes and unsaved files are gone. Restore its last "
                "snapshot (`agentbox snapshot restore SNAPSHOT`, POST "
                "/v1/snapshots/SNAPSHOT/restore, sandboxes.restore(SNAPSHOT)) or create a "
                "new sandbox",
                sandbox=sandbox,
                node=where.node,
                lost_at=where.updated_at,
            )
        return where

    async def _to_any(self, scope: Scope, receive: Receive, send: Send, body: bytes | None) -> None:
        nodes = await self._ready_nodes()
        if not nodes:
            raise NodeUnreachable("no cluster node is ready: retry shortly", retry_after=2)
        random.shuffle(nodes)  # load spreading, not security
        # Shared state: any node answers the same, so one that refuses the connection
        # (it died, not yet declared lost) is passed over; the body is read to send again.
        content = body if body is not None else await _read_body(receive)
        for node in nodes:
            try:
                await self._proxy(node.id, node.address, scope, send, content)
                return
            except NodeUnreachable as e:
                if e.details.get("delivered") or node is nodes[-1]:
                    raise

    async def _create(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        request = _json(body) if body else {}
        if not isinstance(request, dict):
            raise InvalidRequest("the body must be a JSON object")
        nodes, age = await self._node_list()
        template = str(request.get("template") or "default")
        warm = {}
        if not _RESTORE_PATH.match(scope["path"]):  # a restore is never a warm one
            _recent(self._claimed, self.lost_after)  # drops old stamps
            now = time.monotonic()
            # Only claims sent since a node's heartbeat are not in its pool count yet.
            claimed = {
                n.id: sum(1 for t in self._claimed.get(n.id, ()) if t > now - n.heartbeat_age - age)
                for n in nodes
            }
            warm = placement.warm_counts(nodes, template, request, claimed)
        ranked = placement.rank(
            nodes,
            template=template,
            isolation=isolation if isinstance(isolation := request.get("isolation"), str) else None,
            labels={},
            lost_after=self.lost_after - age,  # the list's heartbeat ages are ``age`` old
            placed=_recent(self._placed, 2 * self.heartbeat_seconds),
            warm=warm,
        )
        error: NodeUnreachable | None = None
        for node in ranked[:_CREATE_ATTEMPTS]:
            self._placed.setdefault(node.id, []).append(time.monotonic())
            if warm.get(node.id):  # counted off its pool until a heartbeat shows the claim
                self._claimed.setdefault(node.id, []).append(time.monotonic())
            try:
                await self._proxy(node.id, node.address, scope, send, body)
                return
            except NodeUnreachable as e:
                if e.details.get("delivered"):  # it may have made one: no second create
                    raise
                error = e  # refused before anything was sent: the next node
        assert error is not None
        raise error

    async def _list(self, scope: Scope, receive: Receive, send: Send, principal: Principal) -> None:
        if principal.sandbox_id is not None:
            await self._to_sandbox(principal.sandbox_id, principal, scope, receive, send, b"")
            return
        nodes = await self._ready_nodes()
        headers = list(scope["headers"])
        answers = await asyncio.gather(
            *(self.nodes.get_json(n.address, "/v1/sandboxes", headers) for n in nodes),
            return_exceptions=True,
        )
        records: list[Any] = []
        for node, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("listing sandboxes on %s failed: %s", node.id, answer)
                continue
            status, data = answer
            if status == 200 and isinstance(data, list):
                records.extend(dict(r, node=node.id) for r in data)
        await JSONResponse(records)(scope, receive, send)

    async def _signed_files(self, scope: Scope, send: Send, body: bytes) -> None:
        """A signed file URL: to each ready node until one knows the signature (the
        others answer 401; e2b_routes.py says why)."""
        nodes = await self._ready_nodes()
        if not nodes:
            raise NodeUnreachable("no cluster node is ready: retry shortly", retry_after=2)
        for node in nodes:
            last = node is nodes[-1]
            try:
                response = await self._open(node.id, node.address, scope, body)
            except NodeUnreachable as e:
                if e.details.get("delivered") or last:
                    raise
                continue
            if response.status_code == 401 and not last:
                await response.aclose()
                continue
            await self._relay(response, send)
            return

    async def _open(
        self, node: str, address: str, scope: Scope, content: bytes | AsyncIterator[bytes]
    ) -> httpx2.Response:
        scope["agentbox.node"] = node
        target = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        path = target.decode("latin-1") + (("?" + query.decode("latin-1")) if query else "")
        host = None
        if scope.get("agentbox.keep_host"):
            host = next((v for k, v in scope["headers"] if k.lower() == b"host"), None)
        return await self.nodes.open(
            address, scope["method"], path, list(scope["headers"]), content, node, host=host
        )

    async def _proxy(
        self,
        node: str,
        address: str,
        scope: Scope,
        send: Send,
        content: bytes | AsyncIterator[bytes],
    ) -> None:
        await self._relay(await self._open(node, address, scope, content), send)

    async def _relay(self, response: httpx2.Response, send: Send) -> None:
        """The node's answer, as it streams, to the client (closed after)."""
        try:
            headers = [
                (k, v)
                for k, v in response.headers.raw
                if k.lower() not in (b"connection", b"transfer-encoding", b"keep-alive")
            ]
            start: Message = {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": headers,
            }
            await send(start)
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()


def _recent(stamps_by_node: dict[str, list[float]], seconds: float) -> dict[str, int]:
    """Per node, how many of its stamps are under ``seconds`` old (older ones dropped)."""
    horizon = time.monotonic() - seconds
    counts = {}
    for node, stamps in stamps_by_node.items():
        stamps[:] = [t for t in stamps if t > horizon]
        counts[node] = len(stamps)
    return counts


def create_cluster_app(settings: GatewaySettings, *, operator_token: str, home: Path) -> ASGIApp:
    """The replica for ``settings`` (which has a ``cluster`` section); its own audit chain
    is ``settings.audit.path``, else ``home/audit/audit.jsonl``."""
    from agentbox.gateway.app import HostAndSizeGuard, allowed_hosts, open_audit
    from agentbox.policy.redaction import Redactor
    from agentbox.state import open_shared

    cluster = settings.cluster
    assert cluster is not None
    db = open_shared(settings.gateway.state)
    assert db is not None  # settings refuse cluster: without postgresql
    tokens = TokenStore(db, operator_token, settings.gateway.auth.ttl_seconds)
    context = pki.client_context(cluster.ca_file, cluster.cert_file, cluster.key_file)
    redactor = Redactor.from_env(
        settings.redaction.literals_from_env, detectors=settings.redaction.detectors != "none"
    )
    audit = open_audit(settings, home, redactor)
    chain = ChainShipper(
        db, audit, replica_chain_id(settings.gateway.listen), "replica", cluster.heartbeat_seconds
    )
    replica = ClusterGateway(
        db,
        tokens,
        NodeClient(context),
        cluster.heartbeat_seconds,
        cluster.lost_after_seconds,
        audit,
        chain,
        ws_relay.WebSocketRelay(context),
        settings.e2b.domain,
    )
    hosts = allowed_hosts(settings.gateway.listen, settings.gateway.allowed_hosts)
    origins = [f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts]
    origins += settings.gateway.allowed_origins
    guard = HostAndSizeGuard(
        replica, hosts=hosts, origins=origins, max_body=settings.gateway.max_body_bytes
    )
    return e2b_routes.PortHostsFirst(guard, replica, replica.port_hosts)

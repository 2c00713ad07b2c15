"""Where a replica sends the E2B front door's requests (``/e2b``, gateway/e2b/):

    POST /e2b/sandboxes, POST /e2b/v2/sandboxes         placement, as POST /v1/sandboxes
    GET /e2b/sandboxes, GET /e2b/v2/sandboxes           every ready node, lists merged
    /e2b/sandboxes/ID/..., /e2b/v2/sandboxes/ID/...     ID's node
    envd (/e2b/files, /e2b/SERVICE/METHOD)              the ``E2b-Sandbox-Id`` header's node
    Host PORT-ID.DOMAIN (``sandbox.get_host``)          ID's node, the Host kept (its port)
    /files?signature=... (``download_url``/``upload_url``)  each ready node in turn, until
                                                        one does not answer 401
    anything else (/e2b/snapshots, ...)                 any ready node (shared state)

A signed file URL names no sandbox: its signature is made with the sandbox's envd token,
which only the node that made the sandbox can compute (its own key), so the replica asks
the nodes in turn; every other node answers 401 (the signature matches none of its
sandboxes).

The replica does not authenticate these: E2B keys and envd access tokens are the node's
to check (every node reads the same keys and the shared ``e2b_sandboxes`` table), and a
node only ever acts on its own sandboxes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbox.cluster.node_client import NodeClient
from agentbox.cluster.registry import Node
from agentbox.errors import AgentboxError
from agentbox.gateway.e2b import ports
from agentbox.gateway.e2b.models import e2b_error

PREFIX = "/e2b"
_MAX_PAGE = 1000  # gateway/e2b/control.py's
_CREATE = re.compile(r"^/e2b(?:/v2)?/sandboxes$")
_SANDBOX = re.compile(r"^/e2b(?:/v2)?/sandboxes/([A-Za-z0-9_.-]+)(?:/|$)")
log = logging.getLogger(__name__)


def error(e: AgentboxError) -> JSONResponse:
    """An error the replica answers itself (sandbox_not_found, sandbox_lost,
    node_unreachable) in the shape the E2B SDKs parse."""
    headers = {"Retry-After": str(e.details["retry_after"])} if "retry_after" in e.details else None
    message = f"{e.code}: {e.message}"
    return JSONResponse(e2b_error(e.http_status, message), e.http_status, headers=headers)


def is_e2b(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def is_e2b_root(scope: Scope, hosts: re.Pattern[str]) -> bool:
    """A request of the E2B SDKs outside ``/e2b``: a port host or a signed file URL."""
    return ports.port_host(scope, hosts) is not None or ports.signed_files(scope)


def route(scope: Scope, hosts: re.Pattern[str]) -> tuple[str, str | None]:
    """("create" | "list" | "sandbox" | "port" | "signed" | "any", the sandbox id for
    "sandbox" and "port")."""
    if match := ports.port_host(scope, hosts):
        return "port", match.group(2)
    if ports.signed_files(scope):
        return "signed", None
    path, method = scope["path"], scope["method"]
    if _CREATE.match(path):
        return ("create" if method == "POST" else "list"), None
    if match := _SANDBOX.match(path):
        return "sandbox", match.group(1)
    for key, value in scope["headers"]:
        if key.lower() == b"e2b-sandbox-id":  # envd: one port for every sandbox
            return "sandbox", value.decode("latin-1")
    return "any", None


async def merged_list(
    client: NodeClient, nodes: list[Node], scope: Scope, receive: Receive, send: Send
) -> None:
    """Every node's page of the same filters, merged and paged here as one node would."""
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    limit = min(int(query.get("limit", "100")) if query.get("limit", "").isdigit() else 100,
                _MAX_PAGE)  # fmt: skip
    token = query.pop("nextToken", None)
    asked = urlencode({**query, "limit": str(_MAX_PAGE), "order": "asc"})
    headers = list(scope["headers"])
    answers = await asyncio.gather(
        *(client.get_json(n.address, f"{scope['path']}?{asked}", headers) for n in nodes),
        return_exceptions=True,
    )
    rows: list[dict[str, Any]] = []
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, BaseException):
            log.warning("e2b list on %s failed: %s", node.id, answer)
            continue
        status, data = answer
        if status != 200 or not isinstance(data, list):  # the key was refused: say so
            await JSONResponse(data, status_code=status)(scope, receive, send)
            return
        rows.extend(data)
    rows.sort(key=lambda r: (str(r.get("startedAt", "")), str(r.get("sandboxID", ""))))
    if query.get("order", "desc") == "desc":  # E2B lists the newest first
        rows.reverse()
    start = 0
    if token:
        start = next((i for i, r in enumerate(rows) if r.get("sandboxID") == token), len(rows))
    page = rows[start : start + limit]
    out = (
        {"x-next-token": str(rows[start + limit]["sandboxID"])}
        if start + limit < len(rows)
        else None
    )
    await JSONResponse(page, headers=out)(scope, receive, send)


class PortHostsFirst:
    """The replica's outermost layer, as ``ports.PortHosts`` is on one host: a request to
    a port host skips the Host check (its Host names the sandbox, not the replica) and
    goes to ``replica``; the rest go through ``guarded``. The body is capped by the
    node's own port-host layer, which reads it."""

    def __init__(self, guarded: ASGIApp, replica: ASGIApp, hosts: re.Pattern[str]) -> None:
        self.guarded, self.replica, self.hosts = guarded, replica, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.replica if ports.port_host(scope, self.hosts) else self.guarded
        await app(scope, receive, send)

"""A replica's cluster-wide reads: ``GET /v1/audit`` and ``GET /v1/events`` without a
sandbox ask every ready node and merge the answers.

* Audit: each node's records are its own chain (its own seqs), so each merged record
  names its ``chain`` (``node:ID``); the newest ``limit`` by time, oldest first.
  ``since_seq`` counts one chain's records: it needs ``node=ID`` (the replica then asks
  that node only).
* Events: the nodes' SSE streams merged as they come, each event's data naming its
  ``node``. Event ids are per node, so the merged stream's ``id:`` is a cursor over all
  of them (``node-1=5,node-2=9``); reconnecting with it as ``Last-Event-ID`` (or
  ``after=``) resumes every node after its own id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from agentbox.cluster.node_client import NodeClient
from agentbox.cluster.registry import Node
from agentbox.errors import AgentboxError, InvalidRequest

log = logging.getLogger(__name__)
_CURSOR = re.compile(r"^[a-z0-9][a-z0-9-]*=[0-9]{1,19}(,[a-z0-9][a-z0-9-]*=[0-9]{1,19})*$")


def _query(scope: Scope) -> dict[str, str]:
    return dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


async def audit(
    client: NodeClient, nodes: list[Node], scope: Scope, receive: Receive, send: Send
) -> None:
    query = _query(scope)
    if "since_seq" in query:
        raise InvalidRequest(
            "since_seq counts one chain's records and every node keeps its own: add "
            "node=ID (GET /v1/audit?node=ID&since_seq=N; ids in GET /v1/cluster/nodes)"
        )
    try:
        limit = int(query.get("limit", "100"))
    except ValueError:
        raise InvalidRequest("limit must be an integer from 1 to 1000") from None
    path = "/v1/audit?" + urlencode(query) if query else "/v1/audit"
    headers = list(scope["headers"])
    answers = await asyncio.gather(
        *(client.get_json(n.address, path, headers) for n in nodes), return_exceptions=True
    )
    records: list[dict[str, Any]] = []
    missing = []
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, BaseException):
            log.warning("audit query on %s failed: %s", node.id, answer)
            missing.append(node.id)
            continue
        status, data = answer
        if status != 200 or not isinstance(data, list):  # the node's own refusal: pass it on
            await JSONResponse(data, status_code=status)(scope, receive, send)
            return
        records.extend(dict(r, chain=f"node:{node.id}") for r in data)
    records.sort(key=lambda r: (str(r.get("ts", "")), r["chain"], int(r.get("seq", 0))))
    headers_out = {"X-Agentbox-Nodes-Missing": ",".join(missing)} if missing else None
    await JSONResponse(records[-limit:], headers=headers_out)(scope, receive, send)


def _cursor(scope: Scope) -> dict[str, int]:
    """Each node's last event id from ``after=`` or ``Last-Event-ID`` (a merged cursor)."""
    raw = _query(scope).get("after") or _header(scope, b"last-event-id")
    if not raw:
        return {}
    if not _CURSOR.match(raw):
        raise InvalidRequest(
            "a replica's event ids are per node: resume with the id of the last event it "
            "sent (NODE=ID,NODE=ID) as Last-Event-ID or after=, or name one sandbox "
            "(?sandbox=ID), whose node's plain ids work"
        )
    return {k: int(v) for k, v in (part.split("=") for part in raw.split(","))}


async def events(
    client: NodeClient, nodes: list[Node], scope: Scope, receive: Receive, send: Send
) -> None:
    cursor = _cursor(scope)
    query = {k: v for k, v in _query(scope).items() if k != "after"}
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"last-event-id"]
    frames: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()

    async def read(node: Node) -> None:
        params = dict(query, after=str(cursor[node.id])) if node.id in cursor else query
        target = "/v1/events" + ("?" + urlencode(params) if params else "")
        try:
            response = await client.open(node.address, "GET", target, headers, b"", node.id)
            try:
                if response.status_code != 200:
                    log.warning("events of %s: HTTP %s", node.id, response.status_code)
                    return
                buffer = b""
                async for chunk in response.aiter_raw():
                    buffer += chunk
                    while b"\n\n" in buffer:
                        frame, buffer = buffer.split(b"\n\n", 1)
                        await frames.put((node.id, frame))
            finally:
                await response.aclose()
        except AgentboxError as e:  # node_unreachable: the others carry on
            log.warning("events of %s: %s", node.id, e)
        finally:
            await frames.put(None)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        await frames.put(("", b""))  # the client left: stop

    readers = [asyncio.create_task(read(n)) for n in nodes]
    watcher = asyncio.create_task(disconnected())
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-store"),
    ]})  # fmt: skip
    try:
        running = len(readers)
        while running:
            item = await frames.get()
            if item is None:
                running -= 1
                continue
            if not item[0]:
                return
            out = _relabel(*item, cursor)
            if out is not None:
                await send({"type": "http.response.body", "body": out, "more_body": True})
    finally:
        for task in [*readers, watcher]:
            task.cancel()
        for task in [*readers, watcher]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _relabel(node: str, frame: bytes, cursor: dict[str, int]) -> bytes | None:
    """One node's SSE frame as the merged stream's: the cursor as its id, ``node`` in
    its data; a keep-alive comment passes as it is."""
    fields: dict[str, str] = {}
    for line in frame.decode("utf-8", "replace").split("\n"):
        name, _, value = line.partition(":")
        fields[name] = value[1:] if value.startswith(" ") else value
    if "data" not in fields:
        return b": keep-alive\n\n" if "" in fields else None
    if fields.get("id", "").isdigit():
        cursor[node] = int(fields["id"])
    try:
        data = json.loads(fields["data"])
    except ValueError:
        return None
    if isinstance(data, dict):
        data["node"] = node
    merged = ",".join(f"{k}={v}" for k, v in sorted(cursor.items()))
    event = fields.get("event", "message")
    return f"id: {merged}\nevent: {event}\ndata: {json.dumps(data)}\n\n".encode()

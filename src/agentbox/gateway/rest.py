# Whole on purpose: every route closes over one gateway app; tool routes take the tools' arg models
"""The REST API: everything the SDK does, over HTTP, with the same typed errors.

Tool-like routes (commands, processes, sessions, files) go through ``Gateway.call_tool``,
so they are checked, bounded, redacted and audited exactly like MCP calls. Sandbox
lifecycle, tokens, approvals and the audit trail are operator routes (a session token
may read its own sandbox).
"""

from __future__ import annotations

import asyncio
import functools
import json
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as FastAPIPath
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from agentbox.config.specs import NetworkSpec
from agentbox.errors import (
    AgentboxError,
    InsufficientScope,
    InvalidRequest,
    NotFound,
    PolicyDenied,
    SecretsFound,
)
from agentbox.gateway import jsonbody
from agentbox.gateway import port_forward as port_forward_http
from agentbox.gateway.service import Gateway
from agentbox.gateway.tool_routes import add_tool_routes, body, tool_body
from agentbox.network.modes import EGRESS_MODES
from agentbox.observability.lifecycle_events import public_event
from agentbox.policy.principal import OPERATOR, Principal
from agentbox.runtime.snapshots import Snapshots
from agentbox.runtime.store import SandboxRecord
from agentbox.volumes.spec import NAME_PATTERN, VolumeMount


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSandbox(Body):
    template: str = "default"
    isolation: Literal["namespaces", "gvisor"] | None = Field(
        default=None,
        description="isolation tier: namespaces (the default) or gvisor (runsc); what "
        "each tier supports is in docs/design.md (Isolation tiers)",
    )
    memory: int | str | None = None
    cpus: float | None = None
    pids: int | None = None
    disk: int | str | None = None
    lifetime: float | str | None = None
    idle_timeout: float | str | None = Field(
        default=None, description="e.g. 15m; 0: never (default: sandbox.limits of the config)"
    )
    on_idle: Literal["pause", "stop", "destroy"] | None = None
    env: dict[str, str] | None = None
    project: str | None = None
    # The one network spec (validated and normalised as the egress proxy applies it); a
    # mode string alone is accepted too. Its JSON Schema describes every field.
    network: NetworkSpec | None = Field(
        default=None,
        description='The network spec, or a mode alone ("none", "allowlist", "open", "ask"); '
        "default: the sandbox.network section of the gateway config",
        json_schema_extra=lambda schema: _with_mode_alone(schema),
    )
    desktop: bool | None = Field(
        default=None, description="true: start its desktop (as desktop_start) once it runs"
    )
    volumes: list[VolumeMount] | None = Field(
        default=None,
        description="named volumes to mount (POST /v1/volumes makes one); default: the "
        "sandbox.volumes of the config for the project",
    )


class CreateVolume(Body):
    name: str = Field(pattern=NAME_PATTERN, description="lower-case letters, digits, _.-")
    size: int | str = Field(description="its quota: bytes or a size like 10GiB")


def _with_mode_alone(schema: dict[str, Any]) -> None:
    """The network field's schema also says that a mode string alone is accepted."""
    alone = {"type": "string", "enum": list(EGRESS_MODES), "description": "a mode alone"}
    schema["anyOf"].insert(1, alone)


class TakeSnapshot(Body):
    redact: bool = Field(
        default=False, description="replace found secrets with [REDACTED:kind] instead of refusing"
    )
    allowlist: str | None = Field(
        default=None,
        description="allow-list text: one entry a line, a path glob, PATH:LINE or kind=KIND",
    )
    memory: bool = Field(
        default=False,
        description="keep the running processes too (isolation gvisor only: runsc "
        "checkpoint; a restore carries on from them)",
    )


# Scopes a token's tool list may name besides the tools: routes that are not tool calls.
ROUTE_SCOPES = ("ports", "desktop_view", "desktop_control")


class IssueToken(Body):
    sandbox: str
    ttl: int | None = Field(default=None, gt=0, description="seconds")
    tools: list[str] | None = None


class ToolInvocation(Body):
    arguments: dict[str, Any] = Field(default_factory=dict)


ToolEndpoint = Callable[[str, str | None, bytes], Awaitable[JSONResponse]]
TOOL_ROUTE_PREFIX = "/v1/tools/"


def tool_endpoint(
    gateway: Gateway, principal_of: Callable[[str | None], Principal]
) -> ToolEndpoint:
    """``POST /v1/tools/{name}`` as a plain coroutine of (name, Authorization, body).

    The app serves it from its ASGI front door (``app.ToolFastPath``) without FastAPI's
    routing, middleware and DI, which were a third of a small ``fs_read``'s HTTP cost;
    the FastAPI route below runs the same coroutine and publishes the schema.
    """

    async def respond(name: str, authorization: str | None, body: bytes) -> JSONResponse:
        principal = principal_of(authorization)
        arguments = _tool_arguments(body)
        return JSONResponse((await gateway.call_tool(principal, name, arguments)).result)

    return respond


def build_router(
    gateway: Gateway, authenticate: Any, call_tool_endpoint: ToolEndpoint
) -> APIRouter:
    api = APIRouter(prefix="/v1", route_class=jsonbody.JsonRoute)
    auth = Depends(authenticate)

    async def tool(p: Principal, name: str, sandbox: str, args: dict[str, Any]) -> dict[str, Any]:
        args = {k: v for k, v in args.items() if v is not None}
        outcome = await gateway.call_tool(p, name, {**args, "sandbox_id": sandbox})
        return outcome.result

    # generic tool invocation (what MCP clients call, for HTTP-only agents); registered
    # first because routes are matched in order and this is the hottest one --------------
    @api.get("/tools", tags=["tools"])
    async def list_tools(p: Principal = auth) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "title": t.title,
                "description": t.description,
                "input_schema": t.input_schema,
                "output_schema": t.output_schema,
                "annotations": t.annotations(),
            }
            for t in gateway.visible_tools(p)
        ]

    # The hottest route; served by the app's front door (see tool_endpoint), registered
    # here too so that the schema is published and the same coroutine answers.
    @api.post(
        "/tools/{name}",
        tags=["tools"],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ToolInvocation.model_json_schema()}},
            }
        },
    )
    async def call_tool(name: str, request: Request) -> JSONResponse:
        return await call_tool_endpoint(
            name, request.headers.get("authorization"), await request.body()
        )

    # sandboxes ----------------------------------------------------------------------------
    @api.post("/sandboxes", status_code=201, tags=["sandboxes"])
    async def create_sandbox(body: CreateSandbox, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("creating a sandbox")
        requested = {k: v for k, v in body.model_dump().items() if v is not None}
        desktop = bool(requested.pop("desktop", False))
        spec = gateway.sandbox_spec(requested)
        started, started_wall = time.monotonic(), time.time()
        record = await asyncio.to_thread(gateway.runtime.create, spec, actor=p.actor)
        claimed = record.created_at < started_wall  # a warm one, made before this request
        gateway.metrics.sandbox_created("pool" if claimed else "cold", time.monotonic() - started)
        await gateway.audit_event(p, "sandbox_created", sandbox=record.id, template=record.template)
        gateway.lifecycle_changed()
        if desktop:
            try:
                await gateway.call_tool(p, "desktop_start", {"sandbox_id": record.id})
            except BaseException:  # a sandbox nobody asked for without its desktop
                await asyncio.to_thread(gateway.runtime.destroy, record.id, actor=p.actor)
                raise
        return record.to_dict()

    def with_usage(record: SandboxRecord) -> dict[str, Any]:
        """The record, plus what its processes use now (memory, CPU time) if it runs."""
        data = record.to_dict()
        if record.state in ("running", "paused"):
            cgroup = gateway.runtime.layout.sandbox(record.id)
            data["usage"] = {
                "memory_bytes": cgroup.memory_current(),
                "cpu_seconds": round(cgroup.cpu_usage_us() / 1e6, 3),
            }
        return data

    @api.get("/sandboxes", tags=["sandboxes"])
    async def list_sandboxes(p: Principal = auth) -> list[dict[str, Any]]:
        records = await asyncio.to_thread(gateway.runtime.list)
        mine = [r for r in records if p.is_operator or r.id == p.sandbox_id]
        return await asyncio.to_thread(lambda: [with_usage(r) for r in mine])

    @api.get("/sandboxes/{sandbox_id}", tags=["sandboxes"])
    async def get_sandbox(sandbox_id: str, p: Principal = auth) -> dict[str, Any]:
        p.require_sandbox(sandbox_id)
        record = await asyncio.to_thread(gateway.runtime.get, sandbox_id)
        return await asyncio.to_thread(with_usage, record)

    @api.delete("/sandboxes/{sandbox_id}", tags=["sandboxes"])
    async def destroy_sandbox(sandbox_id: str, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("destroying a sandbox")
        await asyncio.to_thread(gateway.browsers.close_sandbox, sandbox_id)
        await asyncio.to_thread(gateway.desktops.close_sandbox, sandbox_id)
        await asyncio.to_thread(gateway.runtime.destroy, sandbox_id, actor=p.actor)
        revoked = gateway.tokens.revoke_sandbox(sandbox_id)
        await gateway.audit_event(
            p, "sandbox_destroyed", sandbox=sandbox_id, tokens_revoked=revoked
        )
        gateway.lifecycle_changed()
        return {"id": sandbox_id, "destroyed": True, "tokens_revoked": revoked}

    async def transition(
        p: Principal, sandbox_id: str, what: str, change: Any, decision: str
    ) -> dict[str, Any]:
        """An operator's pause / resume / stop: made, audited, its event copied now."""
        p.require_operator(what)
        record = await asyncio.to_thread(change, sandbox_id, actor=p.actor)
        await gateway.audit_event(p, decision, sandbox=sandbox_id, reason="operator")
        gateway.lifecycle_changed()
        return dict(record.to_dict())

    @api.post("/sandboxes/{sandbox_id}/pause", tags=["sandboxes"])
    async def pause_sandbox(sandbox_id: str, p: Principal = auth) -> dict[str, Any]:
        """Freeze every process; any later call on the sandbox resumes it."""
        return await transition(
            p, sandbox_id, "pausing a sandbox", gateway.runtime.pause, "sandbox_paused"
        )

    @api.post("/sandboxes/{sandbox_id}/resume", tags=["sandboxes"])
    async def resume_sandbox(sandbox_id: str, p: Principal = auth) -> dict[str, Any]:
        """Continue a paused sandbox, or start a stopped one again on its kept disk."""
        return await transition(
            p, sandbox_id, "resuming a sandbox", gateway.runtime.resume, "sandbox_resumed"
        )

    @api.post("/sandboxes/{sandbox_id}/stop", tags=["sandboxes"])
    async def stop_sandbox(sandbox_id: str, p: Principal = auth) -> dict[str, Any]:
        """End every process but keep the disk; resume starts it again."""
        p.require_operator("stopping a sandbox")
        await asyncio.to_thread(gateway.browsers.close_sandbox, sandbox_id)
        await asyncio.to_thread(gateway.desktops.close_sandbox, sandbox_id)
        return await transition(
            p, sandbox_id, "stopping a sandbox", gateway.runtime.stop, "sandbox_stopped"
        )

    @api.post("/sandboxes/{sandbox_id}/fork", status_code=201, tags=["sandboxes"])
    async def fork_sandbox(sandbox_id: str, p: Principal = auth) -> dict[str, Any]:
        """A new sandbox with a copy-on-write copy of this one's files at this instant
        (its own id, identity and tokens; no processes)."""
        p.require_operator("forking a sandbox")
        started = time.monotonic()
        record = await asyncio.to_thread(gateway.runtime.fork, sandbox_id, actor=p.actor)
        gateway.metrics.sandbox_created("fork", time.monotonic() - started)
        await gateway.audit_event(
            p, "sandbox_created", sandbox=record.id, template=record.template,
            forked_from=sandbox_id,
        )  # fmt: skip
        gateway.lifecycle_changed()
        return record.to_dict()

    # volumes ------------------------------------------------------------------------------
    @api.post("/volumes", status_code=201, tags=["volumes"])
    async def create_volume(body: CreateVolume, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("creating a volume")
        info = await asyncio.to_thread(gateway.runtime.volumes.create, body.name, body.size)
        await gateway.audit_event(p, "volume_created", volume=body.name, size=info["size"])
        return info

    @api.get("/volumes", tags=["volumes"])
    async def list_volumes(p: Principal = auth) -> list[dict[str, Any]]:
        p.require_operator("listing volumes")
        return await asyncio.to_thread(gateway.runtime.volumes.list)

    @api.get("/volumes/{name}", tags=["volumes"])
    async def get_volume(name: str, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("reading a volume")
        return await asyncio.to_thread(gateway.runtime.volumes.get, name)

    @api.delete("/volumes/{name}", tags=["volumes"])
    async def remove_volume(name: str, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("removing a volume")
        await asyncio.to_thread(gateway.runtime.volumes.remove, name)
        await gateway.audit_event(p, "volume_removed", volume=name)
        return {"removed": name}

    # snapshots ----------------------------------------------------------------------------
    def snapshots() -> Snapshots:
        store = gateway.runtime.snapshots(gateway.settings.gateway.store)
        store.scan_budget = gateway.settings.snapshots.scan_budget
        return store

    @api.post("/sandboxes/{sandbox_id}/snapshots", status_code=201, tags=["snapshots"])
    async def take_snapshot(
        sandbox_id: str, body: TakeSnapshot, p: Principal = auth
    ) -> dict[str, Any]:
        """Scan for secrets (refused with 422 secrets_found and a path/line/kind report
        unless redact or allow-listed), then store the writable layer and /workspace;
        with ``memory``, the running processes too (gvisor tier; else 400
        tier_unsupported)."""
        p.require_operator("taking a snapshot")
        from agentbox.storage.secretscan import AllowList

        allowed = AllowList.parse(body.allowlist, "allowlist") if body.allowlist else None
        store = snapshots()
        try:
            if body.memory:
                from agentbox.runtime import memory_snapshots

                info = await asyncio.to_thread(
                    memory_snapshots.take, gateway.runtime, store, sandbox_id, body.redact,
                    allowed,
                )  # fmt: skip
            else:
                info = await asyncio.to_thread(
                    store.create, sandbox_id, redact=body.redact, allowlist=allowed
                )
        except SecretsFound as e:
            await gateway.audit_event(p, "snapshot_refused", sandbox=sandbox_id,
                                      findings=len(e.details.get("findings", [])))  # fmt: skip
            raise
        await gateway.audit_event(p, "snapshot_created", sandbox=sandbox_id, snapshot=info.id,
                                  redacted=len(info.redacted), memory=body.memory,
                                  **info.scan_audit())  # fmt: skip
        retention = gateway.settings.snapshots
        if retention.max_count is not None or retention.max_age is not None:
            gone = await asyncio.to_thread(
                store.apply_retention, retention.max_count, retention.max_age
            )
            for snapshot_id in gone:
                await gateway.audit_event(p, "snapshot_deleted", snapshot=snapshot_id,
                                          reason="retention")  # fmt: skip
        return dict(info.to_dict())

    @api.get("/snapshots", tags=["snapshots"])
    async def list_snapshots(p: Principal = auth) -> list[dict[str, Any]]:
        p.require_operator("listing snapshots")
        return [s.to_dict() for s in await asyncio.to_thread(snapshots().list)]

    @api.get("/snapshots/{snapshot_id}", tags=["snapshots"])
    async def get_snapshot(snapshot_id: str, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("reading a snapshot")
        return dict((await asyncio.to_thread(snapshots().get, snapshot_id)).to_dict())

    @api.delete("/snapshots/{snapshot_id}", tags=["snapshots"])
    async def delete_snapshot(snapshot_id: str, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("deleting a snapshot")
        await asyncio.to_thread(snapshots().delete, snapshot_id)
        await gateway.audit_event(p, "snapshot_deleted", snapshot=snapshot_id, reason="operator")
        return {"id": snapshot_id, "deleted": True}

    @api.post("/snapshots/{snapshot_id}/restore", status_code=201, tags=["snapshots"])
    async def restore_snapshot(snapshot_id: str, p: Principal = auth) -> dict[str, Any]:
        """A new sandbox with the snapshot's files (same template, by digest)."""
        p.require_operator("restoring a snapshot")
        started = time.monotonic()
        record = await asyncio.to_thread(snapshots().restore, snapshot_id, actor=p.actor)
        gateway.metrics.sandbox_created("restore", time.monotonic() - started)
        await gateway.audit_event(p, "sandbox_created", sandbox=record.id,
                                  template=record.template, snapshot=snapshot_id)  # fmt: skip
        gateway.lifecycle_changed()
        return record.to_dict()

    @api.get("/events", tags=["sandboxes"])
    async def lifecycle_events(
        request: Request,
        p: Principal = auth,
        sandbox: str | None = None,
        after: int | None = Query(
            None, ge=0, le=jsonbody.MAX_INT, description="replay events after this id"
        ),
        follow: bool = True,
    ) -> StreamingResponse:
        """Lifecycle events as SSE (``event: lifecycle``, ``id:`` = event id), oldest
        first; reconnecting with ``Last-Event-ID`` resumes. A session token sees its own
        sandbox's events only. Without ``after``: events from now on."""
        if not p.is_operator:
            sandbox = sandbox or p.sandbox_id or ""
            p.require_sandbox(sandbox)
        last = request.headers.get("last-event-id")
        start = after
        if start is None and last:
            start = jsonbody.parse_int(last, "the Last-Event-ID header")
        if start is None:
            start = await asyncio.to_thread(gateway.runtime.store.last_event_id)
        return StreamingResponse(
            _stream_events(gateway, request, sandbox, start, follow),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
        )

    # commands -----------------------------------------------------------------------------
    @api.post(
        "/sandboxes/{sandbox_id}/commands", tags=["commands"], openapi_extra=body("terminal_run")
    )
    async def run_command(
        sandbox_id: str,
        request: Request,
        p: Principal = auth,
        stream: bool = Query(False, description="Server-sent events: stdout, stderr, result"),
    ) -> Any:
        args = await tool_body(request, {})
        if not stream:
            return await tool(p, "terminal_run", sandbox_id, args)
        return StreamingResponse(
            _stream_command(gateway, p, sandbox_id, args), media_type="text/event-stream"
        )

    # files: the tool calls are in TOOL_ROUTES (tool_routes.py); tar transfers here ---------
    @api.get("/sandboxes/{sandbox_id}/files/download", tags=["files"])
    async def download_tar(
        sandbox_id: str,
        path: str,
        p: Principal = auth,
        include_unsafe: bool = Query(
            False,
            description="Also include what the host would run or trust (git hooks and "
            "config, editor/agent/tool settings, rc files, setuid bits, symlinks that may "
            "leave the tree)",
        ),
    ) -> StreamingResponse:
        """A tar of ``path`` (file or directory); symlinks stored, never followed. What was
        withheld is listed in the ``X-Agentbox-Withheld`` header (JSON: [path, reason],
        cut below 32 KiB) and counted in ``X-Agentbox-Withheld-Count``."""
        await gateway.check_transfer(p, sandbox_id, path, write=False)
        spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the stream below
        withheld: list[tuple[str, str]] = []
        try:
            files = gateway.runtime.files(sandbox_id)
            entries = await asyncio.to_thread(
                functools.partial(
                    files.download_tar, path, spool, include_unsafe=include_unsafe,
                    withheld=withheld, guard=gateway.path_guard("fs_read", "fs_read"),
                )
            )  # fmt: skip
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        await gateway.audit_event(p, "allowed", sandbox=sandbox_id, tool="fs_download",
                                  args={"path": path}, entries=entries,
                                  withheld=len(withheld))  # fmt: skip

        def chunks() -> Iterator[bytes]:
            with spool:
                while chunk := spool.read(1 << 20):
                    yield chunk

        return StreamingResponse(
            chunks(),
            media_type="application/x-tar",
            headers={"X-Agentbox-Entries": str(entries),
                     "X-Agentbox-Withheld": _withheld_header(withheld),
                     "X-Agentbox-Withheld-Count": str(len(withheld))},
        )  # fmt: skip

    @api.post("/sandboxes/{sandbox_id}/files/upload", tags=["files"])
    async def upload_tar(
        sandbox_id: str, dest: str, request: Request, p: Principal = auth
    ) -> dict[str, Any]:
        """Extract a tar body into ``dest``, entry by entry inside the sandbox."""
        await gateway.check_transfer(p, sandbox_id, dest, write=True)
        with tempfile.SpooledTemporaryFile(max_size=1 << 20) as spool:
            async for chunk in request.stream():
                spool.write(chunk)
            spool.seek(0)
            files = gateway.runtime.files(sandbox_id)
            guard = gateway.path_guard("fs_write", "fs_write")
            try:
                entries = await asyncio.to_thread(
                    functools.partial(files.upload_tar, dest, spool, guard=guard)
                )
            except PolicyDenied as e:  # an entry, judged where it resolves
                await gateway.audit_event(p, "denied", sandbox=sandbox_id, tool="fs_upload",
                                          args={"dest": dest}, rule=e.details.get("rule"),
                                          path=e.details.get("path"))  # fmt: skip
                raise
        await gateway.audit_event(p, "allowed", sandbox=sandbox_id, tool="fs_upload",
                                  args={"dest": dest}, entries=entries)  # fmt: skip
        return {"dest": dest, "entries": entries}

    # tokens -------------------------------------------------------------------------------
    @api.post("/tokens", status_code=201, tags=["tokens"])
    async def issue_token(body: IssueToken, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("issuing tokens")
        await asyncio.to_thread(gateway.runtime.get, body.sandbox)  # must exist
        known = {t.name for t in gateway.visible_tools(p)} | set(ROUTE_SCOPES)
        unknown = sorted(set(body.tools or []) - known)
        if unknown:
            raise InvalidRequest(
                f"unknown tools {unknown}; see GET /v1/tools (plus {', '.join(ROUTE_SCOPES)})"
            )
        token, info = gateway.tokens.issue(body.sandbox, body.ttl, body.tools)
        await gateway.audit_event(
            p,
            "token_issued",
            sandbox=body.sandbox,
            token_id=info.id,
            tools=info.tools,
            expires_at=info.expires_at,
        )
        return {"token": token, **info.to_dict()}

    @api.get("/tokens", tags=["tokens"])
    async def list_tokens(p: Principal = auth, sandbox: str | None = None) -> Any:
        p.require_operator("listing tokens")
        return [t.to_dict() for t in gateway.tokens.list(sandbox)]

    @api.delete("/tokens/{token_id}", tags=["tokens"])
    async def revoke_token(token_id: str, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("revoking tokens")
        revoked = gateway.tokens.revoke(token_id)
        await gateway.audit_event(p, "token_revoked", token_id=token_id)
        return {"id": token_id, "revoked": revoked}

    # approvals ----------------------------------------------------------------------------
    @api.get("/approvals", tags=["approvals"])
    async def list_approvals(
        p: Principal = auth,
        status: Literal["pending", "approved", "denied", "expired"] | None = None,
    ) -> Any:
        p.require_operator("listing approvals")
        return [a.to_dict() for a in gateway.approvals.list(status)]

    @api.post("/approvals/{approval_id}/{verdict}", tags=["approvals"])
    async def decide(
        approval_id: str,
        verdict: Literal["approve", "deny"],
        p: Principal = auth,
        scope: Literal["once", "sandbox", "always"] = Query(
            "once",
            description="Egress approvals: once (the connections held now), sandbox (this "
            "name for the sandbox's life) or always (the project's allowlist)",
        ),
    ) -> Any:
        if not p.is_operator:  # a sandbox's own token must never approve its own commands
            raise InsufficientScope(
                "only the operator can approve or deny; a session token cannot", scope=OPERATOR
            )
        approval = gateway.approvals.decide(approval_id, verdict == "approve", p.actor, scope)
        await gateway.audit_event(
            p,
            f"approval_{'granted' if verdict == 'approve' else 'denied'}",
            sandbox=approval.sandbox,
            tool=approval.tool,
            approval=approval_id,
            by_operator=True,
            scope=approval.scope,
            summary=approval.summary,
        )
        return approval.to_dict()

    @api.get("/egress/allowlist", tags=["approvals"])
    async def egress_allowlist(p: Principal = auth, project: str | None = None) -> Any:
        """The names approved with scope ``always``, per project (mode ask)."""
        p.require_operator("listing the egress allowlist")
        return [g.to_dict() for g in gateway.approvals.egress_allowlist(project)]

    @api.delete("/egress/allowlist/{project}/{host}", tags=["approvals"])
    async def egress_forget(project: str, host: str, p: Principal = auth) -> Any:
        p.require_operator("changing the egress allowlist")
        removed = gateway.approvals.egress_revoke(project, host)
        if not removed:
            raise NotFound(f"{host} is not on project {project}'s egress allowlist")
        await gateway.audit_event(p, "egress_allowlist_removed", project=project, host=host)
        return {"project": project, "host": host, "removed": True}

    # audit --------------------------------------------------------------------------------
    @api.get("/audit", tags=["audit"])
    async def query_audit(
        p: Principal = auth,
        since_seq: int | None = Query(None, ge=0, le=jsonbody.MAX_INT),
        sandbox: str | None = None,
        tool: str | None = None,
        decision: str | None = None,
        limit: int = Query(100, ge=1, le=1000),
    ) -> Any:
        p.require_operator("reading the audit trail")
        return gateway.audit.query(
            since_seq=since_seq, sandbox=sandbox, tool=tool, decision=decision, limit=limit
        )

    add_tool_routes(api, tool, auth)  # processes, sessions, files: one tool call each
    _port_routes(api, gateway, auth)
    return api


async def _stream_command(
    gateway: Gateway, principal: Principal, sandbox_id: str, args: dict[str, Any]
) -> AsyncIterator[bytes]:
    """SSE: ``stdout``/``stderr`` events as output arrives, then one ``result`` event.

    The output is streamed raw (redacted chunk by chunk) and the final result is the same
    checked, redacted, audited result a non-streaming call returns.
    """
    queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def on_output(stream: str, chunk: bytes) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (stream, chunk))

    async def run() -> dict[str, Any]:
        try:
            clean = {k: v for k, v in args.items() if v is not None}
            outcome = await gateway.call_tool(
                principal,
                "terminal_run",
                {**clean, "sandbox_id": sandbox_id},
                output_listener=on_output,
            )
            return outcome.result
        finally:
            await queue.put(None)

    task = asyncio.create_task(run())
    while (item := await queue.get()) is not None:
        stream, chunk = item
        text = gateway.redactor.redact(chunk.decode("utf-8", "replace"))
        yield _sse(stream, {"data": text})
    try:
        yield _sse("result", await task)
    except AgentboxError as e:
        yield _sse("error", e.to_dict("rest"))


async def _stream_events(
    gateway: Gateway, request: Request, sandbox: str | None, after: int, follow: bool
) -> AsyncIterator[bytes]:
    store = gateway.runtime.store
    quiet = 0.0
    while True:
        events = await asyncio.to_thread(store.events_after, after, 500, sandbox)
        for event in events:
            after = event["id"]
            yield f"id: {after}\n".encode() + _sse("lifecycle", public_event(event))
        if not follow and len(events) < 500:
            return
        if events:
            continue
        if await request.is_disconnected():
            return
        await asyncio.sleep(_EVENTS_POLL_S)
        quiet += _EVENTS_POLL_S
        if quiet >= _EVENTS_KEEPALIVE_S:  # a comment keeps proxies from closing the stream
            quiet = 0.0
            yield b": keep-alive\n\n"


_EVENTS_POLL_S = 0.25
_EVENTS_KEEPALIVE_S = 15.0


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


MAX_WITHHELD_HEADER = 32 << 10


def _withheld_header(withheld: list[tuple[str, str]]) -> str:
    """The withheld list as JSON (ASCII, escaped: a valid header value), cut to whole
    entries below 32 KiB so that any client reads it (an agent can make it long);
    X-Agentbox-Withheld-Count says how many there were."""
    shown: list[tuple[str, str]] = []
    size = 2
    for entry in withheld:
        size += len(json.dumps(entry)) + 2
        if size > MAX_WITHHELD_HEADER:
            break
        shown.append(entry)
    return json.dumps(shown)


def _port_routes(api: APIRouter, gateway: Gateway, auth: Any) -> None:
    async def port_forward(
        sandbox_id: str,
        path: str,
        request: Request,
        port: int = FastAPIPath(ge=1, le=65535),
        p: Principal = auth,
    ) -> StreamingResponse:
        """HTTP to a service the sandbox runs on ``port`` (its loopback): nothing listens
        on the host. The gateway token is not forwarded."""
        if not p.may_use("ports"):
            raise InsufficientScope(
                "this token may not reach sandbox ports (tool: ports)", scope="ports"
            )
        p.require_sandbox(sandbox_id)
        gateway.rate.check(p.actor)
        target = "/" + path + (f"?{request.url.query}" if request.url.query else "")
        return await port_forward_http.forward(
            gateway, p, sandbox_id, port, request.method, target,
            list(request.headers.items()), await request.body(),
        )  # fmt: skip

    for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"):
        api.add_api_route(
            "/sandboxes/{sandbox_id}/ports/{port}/{path:path}",
            port_forward,
            methods=[method],
            tags=["ports"],
            operation_id=f"port_forward_{method.lower()}",
        )


def _tool_arguments(body: bytes) -> dict[str, Any]:
    """``{"arguments": {...}}`` (the ToolInvocation shape), or a clear InvalidRequest."""
    invocation = jsonbody.loads(body) if body else None
    if not isinstance(invocation, dict):
        raise InvalidRequest('the body must be a JSON object: {"arguments": {...}}')
    unknown = sorted(set(invocation) - {"arguments"})
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: Extra inputs are not permitted")
    arguments = invocation.get("arguments", {})
    if not isinstance(arguments, dict):
        raise InvalidRequest("arguments: Input should be a valid dictionary (a JSON object)")
    return arguments

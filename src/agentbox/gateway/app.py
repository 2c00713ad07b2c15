"""``create_app(settings, ...)``: the gateway as an ASGI app (no module globals).

Routes: ``/healthz``, ``/readyz``, ``/openapi.json``, ``/docs``, the REST API under
``/v1``, MCP (Streamable HTTP) at ``/mcp`` and the web console at ``/`` (static files; its
data comes from the API). Every route but the health checks and the console's files needs
a bearer token. Requests whose Host or Origin is not this gateway are refused (DNS
rebinding), and request bodies are capped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import PARSE_ERROR
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentbox import __version__
from agentbox.audit.log import AuditLog
from agentbox.config.host import Admission
from agentbox.config.settings import GatewaySettings
from agentbox.config.specs import invalid_request
from agentbox.egressd.daemon import audit_path as egress_audit_path
from agentbox.egressd.daemon import publish_state as publish_egress_state
from agentbox.errors import (
    AgentboxError,
    InvalidRequest,
    LimitExceeded,
    PermissionDenied,
    StateUnavailable,
    Unauthenticated,
)
from agentbox.gateway import desktop_relay, jsonbody
from agentbox.gateway.auth import TokenStore
from agentbox.gateway.console import mount_console
from agentbox.gateway.e2b import PREFIX as E2B_PREFIX
from agentbox.gateway.e2b import E2BFrontDoor
from agentbox.gateway.mcp_http import (
    DECODED_BODY,
    MCP_PATH,
    METADATA_PATH,
    NO_AUTHORIZATION_SERVER,
    REGISTER_PATH,
    McpAuth,
    base_url,
    principal_from,
    resource_metadata,
)
from agentbox.gateway.mcp_server import InFlight, LogLevels, build_mcp_server, wants_stream
from agentbox.gateway.model_routes import build_model_router
from agentbox.gateway.presence import advertise
from agentbox.gateway.rest import (
    TOOL_ROUTE_PREFIX,
    ToolEndpoint,
    build_router,
    tool_endpoint,
)
from agentbox.gateway.rest_errors import (
    answer,
    error_response,
    http_error_response,
    internal_error_response,
)
from agentbox.gateway.service import Gateway
from agentbox.gateway.task_routes import build_task_router
from agentbox.models.providers.types import ChatRequest, ChatResponse
from agentbox.models.service import Attribution, ModelService
from agentbox.observability.egress_ingest import EgressIngest
from agentbox.observability.lifecycle_events import LifecycleIngest
from agentbox.observability.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from agentbox.policy.approvals import ApprovalStore
from agentbox.policy.principal import Principal
from agentbox.policy.redaction import Redactor
from agentbox.runtime.lifecycle import IdleWatcher
from agentbox.runtime.recovery import recover
from agentbox.runtime.runtime import Runtime
from agentbox.runtime.spec_input import spec_from
from agentbox.runtime.warmpool import Pool, PoolKeeper
from agentbox.state import open_shared
from agentbox.tasks.store import Task, TaskStore
from agentbox.tasks.worker import TaskWorkers

log = logging.getLogger(__name__)
# Threads of the loop's default executor (asyncio.to_thread): a terminal_run holds one while
# its command runs, mostly waiting on the sandbox. Python's default, min(32, cpus + 4), is 6
# on a 2-core host: past 6 concurrent callers, commands queued behind sleeping threads and
# throughput fell as clients were added.
TOOL_THREADS = 64


@dataclass
class GatewayParts:
    """Everything ``create_app`` built, for callers that need a handle (tests, the CLI)."""

    gateway: Gateway
    audit: AuditLog


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def allowed_hosts(listen: str, extra: list[str]) -> list[str]:
    host, _, port = listen.rpartition(":")
    names = {host.strip("[]"), "127.0.0.1", "localhost", "::1"}
    hosts = [f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in sorted(names)]
    return hosts + extra


def local_url(settings: GatewaySettings) -> str:
    """Where a process on this host reaches the gateway (a wildcard bind: via loopback)."""
    host, _, port = settings.gateway.listen.rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}.get(host, host)  # noqa: S104
    return f"{'https' if settings.gateway.tls else 'http'}://{host}:{port}"


class HostAndSizeGuard:
    """ASGI middleware: Host/Origin allow-lists (DNS rebinding) and a request body cap."""

    def __init__(self, app: ASGIApp, hosts: list[str], origins: list[str], max_body: int) -> None:
        self.app = app
        self.hosts = {h.lower() for h in hosts}
        self.origins = {o.lower() for o in origins}
        self.max_body = max_body

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket (the desktop's VNC relay) meets the same Host and Origin lists: a
        page on another site must not open one with a person's browser (CSWSH)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        if headers.get("host", "").lower() not in self.hosts or (
            origin is not None and origin.lower() not in self.origins
        ):
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 4403, "reason": "Host or Origin"})
            return
        await self.app(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "").lower()
        # The home's unix socket (server: its path, no port; gateway/home_socket.py) is no
        # address a browser can be rebound to: any Host. Origin and size still apply.
        server = scope.get("server")
        over_socket = server is not None and server[1] is None
        if host not in self.hosts and not over_socket:
            await _reject(
                send,
                421,
                InvalidRequest(f"Host {host!r} is not this gateway (DNS rebinding protection)"),
            )
            return
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in self.origins:
            await _reject(send, 403, PermissionDenied(f"Origin {origin!r} is not allowed"))
            return
        length = headers.get("content-length")
        if length is not None and _declared_over(length, self.max_body):
            await _reject(
                send,
                413,
                LimitExceeded(f"request body over {self.max_body} bytes; send less per call"),
            )
            return
        received = 0
        refused = started = False

        async def capped_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    refused = True
                    raise _BodyTooLarge
            return message

        async def send_once(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the app's own reaction to the refused read: the 413 is ours
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped_receive, send_once)
        except Exception:
            if not refused:
                raise
            # Whatever the app raised (or made of _BodyTooLarge) came from the refused read.
        if refused and not started:
            await _reject(send, 413, LimitExceeded(f"request body over {self.max_body} bytes"))


def _declared_over(length: str, cap: int) -> bool:
    # isascii: "²" is a digit to isdigit; a 20-digit length is over any cap, unconverted.
    digits = length.isascii() and length.isdigit()
    return digits and (len(length) > 19 or int(length) > cap)


class ToolFastPath:
    """ASGI: ``POST /v1/tools/{name}`` straight to its endpoint; everything else to ``app``
    (a ``POST /mcp`` body checked by the gateway's JSON decoder first).

    Sits inside HostAndSizeGuard (so Host/Origin checks and the body cap still apply) and
    outside FastAPI: the hottest route skips routing, FastAPI's middleware and DI.
    """

    def __init__(
        self,
        app: ASGIApp,
        endpoint: ToolEndpoint,
        exact: dict[str, Callable[[Request], Awaitable[Response]]] | None = None,
    ) -> None:
        self.app = app
        self.endpoint = endpoint
        # POST routes answered the same way (the model endpoint): path -> handler(request).
        self.exact = exact or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = _tool_name(scope)
        if name is None:
            handler = self.exact.get(scope["path"]) if _is_post(scope) else None
            if handler is not None:
                await self._exact(handler, scope, receive, send)
            elif _is_post(scope) and scope["path"] == MCP_PATH:
                await self._mcp(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return
        authorization = None
        for key, value in scope["headers"]:
            if key.lower() == b"authorization":
                authorization = value.decode("latin-1")
        response = await answer(
            lambda: self.endpoint(name, authorization, body), f"tool call {name}"
        )
        await response(scope, receive, send)

    async def _exact(
        self,
        handler: Callable[[Request], Awaitable[Response]],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        body = await _read_body(receive)  # here: an oversized one is the guard's 413
        if body is None:
            return
        response = await answer(
            lambda: handler(Request(scope, _replay(body, receive))), scope["path"]
        )
        await response(scope, receive, send)

    async def _mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The MCP SDK decodes the body itself, unbounded (huge integers, inf, NaN): the
        gateway's decoder checks it first; a refusal is a JSON-RPC parse error whose
        ``data`` is the typed error."""
        body = await _read_body(receive)
        if body is None:
            return
        try:
            message = jsonbody.loads(body)
        except InvalidRequest as e:
            error = {"code": PARSE_ERROR, "message": e.message, "data": e.to_dict()}
            answer = {"jsonrpc": "2.0", "id": None, "error": error}
            await JSONResponse(answer, status_code=400)(scope, receive, send)
            return
        # McpAuth and its hooks read this instead of decoding the body again.
        scope = {**scope, DECODED_BODY: message}
        await self.app(scope, _replay(body, receive), send)


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client left first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for an app after the body was read: the body, then what comes next
    (the client's disconnect, which a stream watches for)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _is_post(scope: Scope) -> bool:
    return bool(scope["type"] == "http" and scope["method"] == "POST")


def _tool_name(scope: Scope) -> str | None:
    if not _is_post(scope):
        return None
    path: str = scope["path"]
    if not path.startswith(TOOL_ROUTE_PREFIX):
        return None
    name = path[len(TOOL_ROUTE_PREFIX) :]
    return name if name and "/" not in name else None


class GatewayApp(FastAPI):
    """FastAPI behind a front door (the guard and the tool fast path), built by create_app."""

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None:
            await super().__call__(scope, receive, send)
        else:
            await self.front(scope, receive, send)

    async def serve_routes(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


async def _reject(send: Send, status: int, error: AgentboxError) -> None:
    body = error_response(error, status).body
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _end_sandboxes(runtime: Runtime, how: str) -> None:
    """gateway.on_shutdown: stop or destroy every sandbox of the home (pooled ones go)."""
    for record in runtime.store.list():
        with contextlib.suppress(AgentboxError):
            if how == "destroy" or record.state == "pooled":
                runtime.destroy(record.id, actor="gateway-shutdown")
            elif record.state in ("running", "paused"):
                runtime.stop(record.id, actor="gateway-shutdown")


def task_workers(
    gateway: Gateway, models: ModelService, tasks: TaskStore, settings: GatewaySettings
) -> TaskWorkers:
    """Workers that run batch tasks with the gateway's tools and model service."""

    async def model(task: Task, request: ChatRequest) -> ChatResponse:
        request = request.model_copy(update={"model": request.model or settings.tasks.model})
        return await models.complete(
            request, Attribution(task.project, task.sandbox, task.id, f"task:{task.id}")
        )

    tools = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in gateway.tools
    ]
    return TaskWorkers(
        tasks,
        gateway.runtime,
        model,
        gateway.call_tool,
        tools,
        lambda task: gateway.sandbox_spec({"template": task.template, "project": task.project}),
        lambda task, r: models.cost(r.provider, r.model, r.usage),
        workers=settings.tasks.workers,
        lease_s=settings.tasks.lease_seconds,
        on_end=settings.tasks.on_end,
    )


def open_audit(settings: GatewaySettings, home: Path, redactor: Redactor) -> AuditLog:
    """The audit log of ``settings`` (default file: ``HOME/audit/audit.jsonl``)."""
    audit_settings = settings.audit
    if audit_settings.path is None:
        audit_settings = audit_settings.model_copy(update={"path": home / "audit" / "audit.jsonl"})
    return AuditLog.from_settings(audit_settings, redact=redactor.redact)


def create_app(
    settings: GatewaySettings,
    *,
    operator_token: str,
    home: Path | None = None,
    runtime: Runtime | None = None,
) -> GatewayApp:
    runtime = runtime or Runtime(home)
    runtime.defer_teardowns()  # a destroy answers once the processes are dead
    home = runtime.home
    admission = settings.sandbox.admission
    runtime.admission = Admission(
        admission.max_sandboxes, admission.max_per_project, admission.max_memory_bytes()
    )
    if settings.volumes.dir is not None:
        runtime.volumes.dir = Path(settings.volumes.dir)
    runtime.volumes.capacity = settings.volumes.capacity
    auth = settings.gateway.auth
    # gateway.state: PostgreSQL shares tokens, approvals, usage, tasks and E2B keys with the
    # other replicas; the sandbox registry stays the home's until nodes exist (issue 17).
    shared = open_shared(settings.gateway.state)
    tokens = TokenStore(shared or home / "gateway.db", operator_token, auth.ttl_seconds)
    approvals = ApprovalStore(shared or home / "gateway.db")
    # The egress daemon files mode-ask approvals where these routes decide them.
    publish_egress_state(home, settings.gateway.state)
    redactor = Redactor.from_env(
        settings.redaction.literals_from_env, detectors=settings.redaction.detectors != "none"
    )
    audit = open_audit(settings, home, redactor)
    gateway = Gateway(settings, runtime, tokens, approvals, audit, redactor)

    def principal_of(authorization: str | None) -> Principal:
        principal = tokens.authenticate(bearer(authorization))
        # Tokens die with their sandbox, even when it ended without the gateway.
        if principal.sandbox_id is not None and not runtime.exists(principal.sandbox_id):
            if shared is None:  # shared tokens: another replica's home may hold it
                tokens.revoke_sandbox(principal.sandbox_id)
            raise Unauthenticated("this token's sandbox no longer exists")
        return principal

    async def authenticate(request: Request) -> Principal:
        return principal_of(request.headers.get("authorization"))

    hosts = allowed_hosts(settings.gateway.listen, settings.gateway.allowed_hosts)
    origins = [f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts]
    origins += settings.gateway.allowed_origins
    logs, in_flight = LogLevels(), InFlight()
    mcp_server = build_mcp_server(gateway, principal_from, logs, in_flight)
    # One server, two stateless transports: JSON answers (HTTP statuses for auth failures)
    # and SSE for the calls that send notifications while they run (progress, logs).
    session_manager, streaming_manager = (
        StreamableHTTPSessionManager(
            app=mcp_server,
            stateless=True,
            json_response=json_response,
            security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
            ),
            max_request_body_size=settings.gateway.max_body_bytes,
        )
        for json_response in (True, False)
    )

    gateway.metrics.observe_state(
        runtime.store.count_by_state, lambda: len(approvals.list("pending"))
    )
    gateway.metrics.observe_desktops(gateway.desktops.memory_total)
    egress_ingest = EgressIngest(egress_audit_path(home), audit, gateway.metrics)

    def forget_sandbox(sandbox: str) -> None:  # however it was destroyed
        tokens.revoke_sandbox(sandbox)
        approvals.forget_sandbox(sandbox)

    lifecycle_ingest = LifecycleIngest(
        runtime.store, audit, gateway.metrics, settings.lifecycle.webhooks,
        on_destroyed=forget_sandbox,
    )  # fmt: skip
    gateway.lifecycle = lifecycle_ingest
    idle_watcher = IdleWatcher(
        runtime, settings.lifecycle.cpu_floor, settings.lifecycle.check_interval
    )
    warm = settings.sandbox.warm_pool
    sizes = warm if isinstance(warm, dict) else {settings.sandbox.template: warm}
    pools = [
        Pool(spec_from(gateway.sandbox_spec({"template": name})), size)
        for name, size in sizes.items()
    ]
    keeper = PoolKeeper(runtime, pools)
    gateway.pool_keeper = keeper
    models = ModelService(
        settings, home, audit, gateway.metrics, redactor.redact, gateway.telemetry, shared
    )
    tasks = TaskStore(shared or home / "tasks.db")
    workers = task_workers(gateway, models, tasks, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        executor = ThreadPoolExecutor(TOOL_THREADS, thread_name_prefix="agentbox-call")
        asyncio.get_running_loop().set_default_executor(executor)
        # A gateway killed mid-work left half-made or half-removed sandboxes: finish them
        # off before serving; running ones are adopted as they are.
        recovered = await asyncio.to_thread(recover, runtime)
        if recovered.removed or recovered.orphans:
            audit.append(decision="recovery", actor="agentbox", extra=recovered.to_dict())
        advert = advertise(home, local_url(settings))  # `agentbox mcp` proxies to us
        egress_ingest.start()
        lifecycle_ingest.start()
        idle_watcher.start()
        keeper.start()
        workers.start()
        async with session_manager.run(), streaming_manager.run():
            try:
                yield
            finally:
                if advert is not None:
                    advert.close()
                await workers.stop()  # a running task's lease runs out: the next start resumes it
                await models.aclose()
                keeper.stop()
                idle_watcher.stop()
                await asyncio.to_thread(gateway.browsers.close_all)
                await asyncio.to_thread(gateway.desktops.close_all)
                if settings.gateway.on_shutdown != "keep":
                    await asyncio.to_thread(_end_sandboxes, runtime, settings.gateway.on_shutdown)
                await asyncio.to_thread(runtime.finish_teardowns)
                lifecycle_ingest.stop()  # after: the shutdown's events reach the trail
                egress_ingest.stop()
                gateway.telemetry.shutdown()  # buffered spans are exported
                audit.close()

    app = GatewayApp(
        title="agentbox gateway",
        version=__version__,
        description="Sandboxes for AI agents behind one permission-checked, audited gateway.",
        lifespan=lifespan,
    )
    app.state.parts = GatewayParts(gateway, audit)
    app.router.route_class = jsonbody.JsonRoute  # routes added here decode bodies bounded too

    @app.exception_handler(AgentboxError)
    async def agentbox_error(request: Request, exc: AgentboxError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # The first problem, its field and value in details (a network spec's checks name
        # the item: network.allow.1).
        error = invalid_request(exc.errors()[:1], "", skip=("body",))
        error.details["problems"] = len(exc.errors())
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return http_error_response(exc.status_code, exc.detail)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return internal_error_response()

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def metrics(request: Request) -> Response:
        """Prometheus text format; needs the operator token (a bearer header)."""
        principal_of(request.headers.get("authorization")).require_operator("reading metrics")
        return Response(gateway.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    # RFC 9728: the gateway as a whole, and its MCP endpoint (the path-suffixed form).
    @app.get(METADATA_PATH, tags=["auth"])
    @app.get(METADATA_PATH + MCP_PATH, tags=["auth"])
    async def protected_resource(request: Request) -> dict[str, Any]:
        """OAuth 2.0 Protected Resource Metadata (no token needed)."""
        suffix = request.url.path.removeprefix(METADATA_PATH)
        return resource_metadata(base_url(request.scope), suffix)

    @app.post(REGISTER_PATH, tags=["auth"], status_code=400)
    async def no_client_registration() -> dict[str, str]:
        """Not an OAuth server: the RFC 7591 error says how to get a token instead."""
        return NO_AUTHORIZATION_SERVER

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        from agentbox.isolation.hostcheck import Check, run_checks

        failing = [c.to_dict() for c in run_checks() if c.required and not c.ok]
        if shared is not None:  # a replica that cannot reach the shared state is not ready
            try:
                await asyncio.to_thread(shared.ping)
            except StateUnavailable as e:
                fix = "start PostgreSQL or correct gateway.state; calls fail until then"
                failing.append(Check("state database", False, e.message, fix).to_dict())
        body = {"status": "ready" if not failing else "not ready", "failing": failing}
        return JSONResponse(body, status_code=200 if not failing else 503)

    call_tool = tool_endpoint(gateway, principal_of)
    app.include_router(build_router(gateway, authenticate, call_tool))

    # A person's VNC viewer on a sandbox's desktop (gateway/desktop_relay.py).
    async def desktop_vnc(websocket: WebSocket, sandbox_id: str) -> None:
        await desktop_relay.relay(websocket, gateway, principal_of, sandbox_id)

    app.add_api_websocket_route("/v1/sandboxes/{sandbox_id}/desktop/vnc", desktop_vnc)
    model_router, model_handlers = build_model_router(models, runtime, principal_of)
    app.include_router(model_router)
    app.include_router(
        build_task_router(tasks, authenticate, workers.wake, bool(settings.providers))
    )
    e2b = E2BFrontDoor(gateway)  # the E2B SDKs' front door (gateway/e2b)
    app.mount(E2B_PREFIX, e2b.app)
    mount_console(app)  # GET / and /console/*: static, no data, no token
    # An ASGI endpoint (not a Mount, which would redirect POST /mcp to /mcp/).
    mcp_endpoint: Any = McpAuth(
        StreamableHTTPASGIApp(session_manager),
        principal_of,
        StreamableHTTPASGIApp(streaming_manager),
        lambda body, principal: wants_stream(body, principal, logs),
        in_flight.observe,
    )
    app.router.add_route(MCP_PATH, mcp_endpoint, methods=["GET", "POST", "DELETE"])
    app.front = e2b.port_hosts(
        HostAndSizeGuard(
            ToolFastPath(app.serve_routes, call_tool, model_handlers),
            hosts=hosts,
            origins=origins,
            max_body=settings.gateway.max_body_bytes,
        )
    )
    return app

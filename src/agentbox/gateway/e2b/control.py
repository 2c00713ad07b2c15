"""E2B's control plane (``E2B_API_URL``): sandboxes made, listed, timed, paused, killed.

Each route is agentbox's own operation (``Runtime`` create / pause / resume / destroy,
the same audit events and metrics as ``/v1``), answered in E2B's shapes. A project key
acts only on its project's sandboxes and is audited as ``token:e2b-key:NAME``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentbox.errors import AgentboxError, InvalidRequest, NotFound, SandboxNotFound
from agentbox.gateway.e2b.access import Caller, E2BAccess, Pausing
from agentbox.gateway.e2b.models import (
    BASE_TEMPLATE,
    CLIENT_ID,
    ENVD_VERSION,
    ConnectSandbox,
    ForkSandbox,
    NewSandbox,
    PauseSandbox,
    Timeout,
    e2b_error,
    e2b_error_response,
    ended,
    iso,
)
from agentbox.gateway.e2b.network import network_of
from agentbox.gateway.e2b.snapshots import E2BSnapshots, NewSnapshot, is_snapshot
from agentbox.gateway.e2b.timeouts import TimeoutPauses
from agentbox.gateway.service import Gateway
from agentbox.runtime.store import SandboxRecord
from agentbox.state.sqlite import SqliteDB

Handler = Callable[[Request], Awaitable[Response]]
# agentbox state -> E2B state; creating counts as running, pooled ones are nobody's yet.
STATES = {"running": "running", "creating": "running", "paused": "paused", "stopped": "paused"}
MAX_PAGE = 1000


class ControlPlane:
    def __init__(
        self, gateway: Gateway, access: E2BAccess, domain: str, pauses: TimeoutPauses
    ) -> None:
        self.gateway, self.access, self.domain = gateway, access, domain
        self.runtime, self.pauses = gateway.runtime, pauses
        shared = access.db if not isinstance(access.db, SqliteDB) else None
        self.snapshots = E2BSnapshots(gateway, shared)

    def routes(self) -> list[Route]:
        r = self._route
        return [
            r("/v2/sandboxes", "POST", self.create),
            r("/sandboxes", "POST", self.create),
            r("/v2/sandboxes", "GET", self.list),
            r("/sandboxes", "GET", self.list),
            r("/sandboxes/{sandbox_id}", "GET", self.get),
            r("/sandboxes/{sandbox_id}", "DELETE", self.kill),
            r("/sandboxes/{sandbox_id}/timeout", "POST", self.set_timeout),
            r("/sandboxes/{sandbox_id}/pause", "POST", self.pause),
            r("/v2/sandboxes/{sandbox_id}/connect", "POST", self.connect),
            r("/sandboxes/{sandbox_id}/connect", "POST", self.connect),
            r("/sandboxes/{sandbox_id}/resume", "POST", self.connect),
            r("/sandboxes/{sandbox_id}/metrics", "GET", self.metrics),
            r("/sandboxes/{sandbox_id}/snapshots", "POST", self.create_snapshot),
            r("/sandboxes/{sandbox_id}/fork", "POST", self.fork),
            r("/snapshots", "GET", self.list_snapshots),
            r("/templates/{template_id}", "DELETE", self.delete_template),
        ]

    @staticmethod
    def _route(path: str, method: str, handler: Handler) -> Route:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except AgentboxError as e:
                return e2b_error_response(e)

        return Route(path, endpoint, methods=[method])

    # helpers -----------------------------------------------------------------------------
    def _caller(self, request: Request) -> Caller:
        caller = self.access.caller(request.headers.get("x-api-key"))
        self.gateway.rate.check(caller.principal().actor)
        self.pauses.kick()  # deadlines kept over a restart are enforced from here on
        return caller

    def _reachable(self, caller: Caller, sandbox_id: str) -> SandboxRecord:
        """The sandbox, if this key may reach it; another project's is "not found"."""
        try:
            record = self.runtime.get(sandbox_id)
        except NotFound:
            record = None
        if record is None or record.state not in STATES or ended(record.expires_at):
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        if not self.access.may_reach(caller, record.spec.project):
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        return record

    def _created(self, record: SandboxRecord, alias: str) -> dict[str, Any]:
        return {
            "templateID": alias,
            "sandboxID": record.id,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.access.envd_token(record.id),
            "trafficAccessToken": self.access.envd_token(record.id),
            "domain": self.domain,
            "alias": alias,
        }

    def _listed(
        self, record: SandboxRecord, alias: str, metadata: dict[str, str]
    ) -> dict[str, Any]:
        spec = record.spec
        return {
            "templateID": alias,
            "alias": alias,
            "sandboxID": record.id,
            "clientID": CLIENT_ID,
            "startedAt": iso(record.created_at),
            "endAt": iso(record.expires_at or record.created_at + 86400 * 365),
            "cpuCount": max(1, round(spec.cpus)),
            "memoryMB": spec.memory // 2**20,
            "diskSizeMB": spec.disk // 2**20,
            "state": STATES[record.state],
            "envdVersion": ENVD_VERSION,
            "metadata": metadata,
        }

    @staticmethod
    async def _body(request: Request, model: type[BaseModel]) -> Any:
        raw = await request.body()
        try:
            return model.model_validate_json(raw or b"{}")
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise InvalidRequest(f"{where}: {first['msg']}") from None

    # routes ------------------------------------------------------------------------------
    async def create(self, request: Request) -> Response:
        caller = self._caller(request)
        body: NewSandbox = await self._body(request, NewSandbox)
        alias = body.template_id
        template = self.gateway.settings.sandbox.template if alias == BASE_TEMPLATE else alias
        requested: dict[str, Any] = {"template": template, "lifetime": float(body.timeout)}
        if body.auto_pause:  # the E2B timeout pauses; agentbox's lifetime bounds the rest
            limit = self.gateway.settings.sandbox.limits.lifetime
            requested["lifetime"] = max(limit, float(body.timeout))
        if caller.project is not None:
            requested["project"] = caller.project
        if body.env_vars:
            requested["env"] = body.env_vars
        no_egress = network_of(body.network) == "none"  # first: refuses what has no meaning
        if body.allow_internet_access is False or no_egress:
            requested["network"] = "none"
        if is_snapshot(alias):  # Sandbox.create(SNAPSHOT_ID): its files in a new sandbox
            del requested["template"]
            record = await self.snapshots.restore(caller, alias, requested)
        else:
            record = await self._new(caller, requested)
        self.access.record(record.id, caller, alias, body.metadata)
        if body.auto_pause:
            auto_resume = body.auto_resume is not None and body.auto_resume.enabled
            pausing = Pausing(record.id, None, body.timeout, body.auto_pause_memory, auto_resume)
            self.pauses.arm(pausing, body.timeout)
        self.gateway.lifecycle_changed()
        return JSONResponse(self._created(record, alias), status_code=201)

    async def _new(self, caller: Caller, requested: dict[str, Any]) -> SandboxRecord:
        spec = self.gateway.sandbox_spec(requested)
        principal = caller.principal()
        started, started_wall = time.monotonic(), time.time()
        record = await asyncio.to_thread(self.runtime.create, spec, actor=principal.actor)
        claimed = record.created_at < started_wall
        self.gateway.metrics.sandbox_created(
            "pool" if claimed else "cold", time.monotonic() - started
        )
        await self.gateway.audit_event(
            principal, "sandbox_created", sandbox=record.id, template=record.template, api="e2b"
        )
        return record

    async def fork(self, request: Request) -> Response:
        """``count`` new sandboxes, each a copy of this one's disk now (agentbox's fork:
        its processes are not copied), in its project, with its alias and metadata."""
        caller = self._caller(request)
        record = self._reachable(caller, request.path_params["sandbox_id"])
        body: ForkSandbox = await self._body(request, ForkSandbox)
        owned = self.access.owned(record.id)
        alias, metadata = (owned.alias, owned.metadata) if owned else (record.template, {})
        principal = caller.principal(record.id)
        pausing = self.access.pausing(record.id)
        results: list[dict[str, Any]] = []
        for _ in range(body.count):
            started = time.monotonic()
            try:
                made = await asyncio.to_thread(self.runtime.fork, record.id, actor=principal.actor)
            except AgentboxError as e:  # this fork failed; the others are still made
                results.append({"error": e2b_error(e.http_status, e.message)})
                continue
            self.gateway.metrics.sandbox_created("fork", time.monotonic() - started)
            self.access.record(made.id, caller, alias, metadata)
            if pausing is not None:  # made to pause at its timeout, as its source
                forked = dataclasses.replace(pausing, id=made.id)
                self.pauses.arm(forked, body.timeout, timeout_s=body.timeout)
            else:  # the fork's own E2B timeout
                until = time.time() + body.timeout
                if made.expires_at is None or until < made.expires_at:
                    self.runtime.store.set_expiry(made.id, until)
            await self.gateway.audit_event(
                principal, "sandbox_created", sandbox=made.id, template=made.template,
                forked_from=record.id, api="e2b",
            )  # fmt: skip
            results.append({"sandbox": self._created(made, alias)})
        self.gateway.lifecycle_changed()
        return JSONResponse(results, status_code=201)

    # snapshots ---------------------------------------------------------------------------
    async def create_snapshot(self, request: Request) -> Response:
        caller = self._caller(request)
        record = self._reachable(caller, request.path_params["sandbox_id"])
        body: NewSnapshot = await self._body(request, NewSnapshot)
        return await self.snapshots.create(caller, record, body)

    async def list_snapshots(self, request: Request) -> Response:
        return await self.snapshots.list(self._caller(request), request)

    async def delete_template(self, request: Request) -> Response:
        caller = self._caller(request)
        template_id = request.path_params["template_id"]
        if not is_snapshot(template_id):
            raise NotFound(f"template {template_id}: templates are agentbox's, not deleted here")
        return await self.snapshots.delete(caller, template_id)

    async def list(self, request: Request) -> Response:
        caller = self._caller(request)
        query = request.query_params
        states = {s for s in query.get("state", "running,paused").split(",") if s}
        wanted = dict(urllib.parse.parse_qsl(query.get("metadata", "")))
        template = query.get("template")
        try:
            limit = min(int(query.get("limit", "100")), MAX_PAGE)
            after = query.get("startedAfter")
            started_after = datetime.datetime.fromisoformat(after).timestamp() if after else None
        except ValueError as e:
            raise InvalidRequest(f"limit or startedAfter: {e}") from None
        records = await asyncio.to_thread(self.runtime.list)
        owned = await asyncio.to_thread(self.access.all_owned)
        rows = []
        for record in sorted(records, key=lambda r: (r.created_at, r.id)):
            mine = owned.get(record.id)
            if record.state not in STATES or ended(record.expires_at):
                continue
            if not self.access.may_reach(caller, record.spec.project):
                continue
            # startedAt is shown to the microsecond: a time read back from it is "at" it.
            if started_after is not None and record.created_at < started_after - 1e-3:
                continue
            alias, metadata = (mine.alias, mine.metadata) if mine else (record.template, {})
            if STATES[record.state] not in states:
                continue
            if any(metadata.get(k) != v for k, v in wanted.items()):
                continue
            if template is not None and template not in (alias, record.template):
                continue
            rows.append(self._listed(record, alias, metadata))
        if query.get("order", "desc") == "desc":  # E2B lists the newest first
            rows.reverse()
        start = 0
        token = query.get("nextToken")
        if token:
            start = next((i for i, r in enumerate(rows) if r["sandboxID"] == token), len(rows))
        page = rows[start : start + limit]
        headers = {}
        if start + limit < len(rows):
            headers["x-next-token"] = rows[start + limit]["sandboxID"]
        return JSONResponse(page, headers=headers)

    async def get(self, request: Request) -> Response:
        caller = self._caller(request)
        record = self._reachable(caller, request.path_params["sandbox_id"])
        owned = self.access.owned(record.id)
        alias, metadata = (owned.alias, owned.metadata) if owned else (record.template, {})
        detail = self._listed(record, alias, metadata)
        detail.update(envdAccessToken=self.access.envd_token(record.id), domain=self.domain)
        return JSONResponse(detail)

    async def kill(self, request: Request) -> Response:
        caller = self._caller(request)
        sandbox_id = request.path_params["sandbox_id"]
        self._reachable(caller, sandbox_id)
        principal = caller.principal(sandbox_id)
        await asyncio.to_thread(self.gateway.browsers.close_sandbox, sandbox_id)
        await asyncio.to_thread(self.runtime.destroy, sandbox_id, actor=principal.actor)
        revoked = self.gateway.tokens.revoke_sandbox(sandbox_id)
        self.access.forget(sandbox_id)
        await self.gateway.audit_event(
            principal, "sandbox_destroyed", sandbox=sandbox_id, tokens_revoked=revoked, api="e2b"
        )
        self.gateway.lifecycle_changed()
        return Response(status_code=204)

    async def set_timeout(self, request: Request) -> Response:
        caller = self._caller(request)
        record = self._reachable(caller, request.path_params["sandbox_id"])
        body: Timeout = await self._body(request, Timeout)
        pausing = self.access.pausing(record.id)
        if pausing is not None:  # on_timeout "pause": the time left until the pause
            self.pauses.arm(pausing, body.timeout)
        else:  # E2B's timeout is the time left from now; agentbox's lifecycle sweep enforces it
            self.runtime.store.set_expiry(record.id, time.time() + body.timeout)
        await self.gateway.audit_event(
            caller.principal(record.id), "sandbox_timeout", sandbox=record.id,
            timeout_s=body.timeout, api="e2b",
        )  # fmt: skip
        return Response(status_code=204)

    async def pause(self, request: Request) -> Response:
        caller = self._caller(request)
        record = self._reachable(caller, request.path_params["sandbox_id"])
        if record.state != "running":
            return JSONResponse(
                e2b_error(409, f"sandbox {record.id} is {record.state}, not running"),
                status_code=409,
            )
        body: PauseSandbox = await self._body(request, PauseSandbox)
        principal = caller.principal(record.id)
        # Without memory: processes end, the disk stays (agentbox's stop); connect starts it.
        act = self.runtime.pause if body.memory else self.runtime.stop
        await asyncio.to_thread(act, record.id, actor=principal.actor)
        pausing = self.access.pausing(record.id)
        if pausing is not None:  # no deadline while paused
            self.access.set_pausing(dataclasses.replace(pausing, pause_at=None))
        await self.gateway.audit_event(
            principal, "sandbox_paused", sandbox=record.id, reason="operator", api="e2b",
            keep_memory=body.memory,
        )  # fmt: skip
        self.gateway.lifecycle_changed()
        return Response(status_code=204)

    async def connect(self, request: Request) -> Response:
        """Connect to a running sandbox (200) or resume a paused one (201)."""
        caller = self._caller(request)
        record = self._reachable(caller, request.path_params["sandbox_id"])
        body: ConnectSandbox = await self._body(request, ConnectSandbox)
        status = 200
        if record.state in ("paused", "stopped"):
            principal = caller.principal(record.id)
            record = await asyncio.to_thread(self.runtime.resume, record.id, actor=principal.actor)
            await self.gateway.audit_event(
                principal, "sandbox_resumed", sandbox=record.id, reason="operator", api="e2b"
            )
            self.gateway.lifecycle_changed()
            status = 201
        pausing = self.access.pausing(record.id)
        if pausing is not None:  # running again: its pause deadline from now
            if status == 201 or body.timeout is not None:
                timeout = float(body.timeout or pausing.timeout_s)
                self.pauses.arm(pausing, timeout, timeout_s=timeout)
        elif body.timeout is not None:
            # A connect only ever extends the sandbox's life, as E2B does.
            until = time.time() + body.timeout
            if record.expires_at is not None and record.expires_at < until:
                self.runtime.store.set_expiry(record.id, until)
        owned = self.access.owned(record.id)
        return JSONResponse(
            self._created(record, owned.alias if owned else record.template), status_code=status
        )

    async def metrics(self, request: Request) -> Response:
        caller = self._caller(request)
        record = self._reachable(caller, request.path_params["sandbox_id"])
        try:
            start = float(request.query_params.get("start", 0))
            end = float(request.query_params.get("end", "inf"))
        except ValueError:
            raise InvalidRequest("start and end are Unix times in seconds") from None
        # One sample, now: a range that leaves now out has none.
        if record.state != "running" or not start <= time.time() <= end + 1:
            return JSONResponse([])
        cgroup = self.runtime.layout.sandbox(record.id)
        spec = record.spec
        cpus = spec.cpus
        now = time.time()
        elapsed = max(now - record.created_at, 1e-3)
        with contextlib.suppress(OSError):
            cpu_s = cgroup.cpu_usage_us() / 1e6
            memory = cgroup.memory_current()
            # Memory as it is, CPU averaged over the sandbox's life.
            return JSONResponse(
                [
                    {
                        "timestamp": iso(now),
                        "timestampUnix": int(now),
                        "cpuCount": max(1, round(cpus)),
                        "cpuUsedPct": round(min(100.0, 100 * cpu_s / (elapsed * cpus)), 2),
                        "memUsed": memory,
                        "memTotal": spec.memory,
                        "memCache": 0,
                        "diskUsed": 0,
                        "diskTotal": spec.disk,
                    }
                ]
            )
        return JSONResponse([])

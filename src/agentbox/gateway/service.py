"""The one path every tool call takes, whether it came over MCP or REST.

    authenticate (app) -> scope -> rate limit -> sandbox binding -> argument schema
    -> policy (deny names its rule) -> human approval when a pattern matches
    -> run on the runtime (in a worker thread) -> redact the output -> audit

Nothing here knows about HTTP or MCP framing; ``rest.py`` and ``mcp_server.py`` adapt.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import shlex
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import jsonschema
import jsonschema_rs

from agentbox.audit.log import AuditLog, args_hash
from agentbox.browser.manager import BrowserConfig, BrowserManager, check_url
from agentbox.config.settings import BrowserOpenTool, GatewaySettings, TerminalRunTool
from agentbox.desktop.manager import DesktopConfig, DesktopManager
from agentbox.errors import (
    AgentboxError,
    ApprovalDenied,
    ApprovalPending,
    FileNotFound,
    InsufficientScope,
    InvalidRequest,
    PolicyDenied,
    RateLimited,
    ToolNotFound,
    VolumeExists,
)
from agentbox.fsutil import Access
from agentbox.gateway import jsonbody, sealed
from agentbox.gateway.auth import RateLimiter, TokenStore
from agentbox.gateway.tools import (
    TOOLS,
    TOOLS_BY_NAME,
    CommandOutput,
    ToolCall,
    ToolLimits,
    ToolSpec,
    payload,
    render_tools,
)
from agentbox.network.names import domain_matches, normalize_host
from agentbox.observability.metrics import Metrics
from agentbox.observability.telemetry import Telemetry
from agentbox.policy.approvals import ApprovalStore
from agentbox.policy.command_rules import resolve_to_system
from agentbox.policy.principal import Principal
from agentbox.policy.redaction import Redactor
from agentbox.policy.tool_policy import WORKSPACE, CommandPolicy, Decision, FilePolicy, diff_summary
from agentbox.runtime.commands import Cancellation
from agentbox.runtime.files import Guard
from agentbox.runtime.output import OutputCallback
from agentbox.runtime.runtime import Runtime

if TYPE_CHECKING:
    from agentbox.observability.lifecycle_events import LifecycleIngest
    from agentbox.runtime.warmpool import PoolKeeper

ApprovalMode = Literal["wait", "handle"]
# Compiled once: checking the schema itself on every call costs ~10 ms.
_VALIDATORS = {t.name: jsonschema.Draft202012Validator(t.input_schema) for t in TOOLS}
# The same schemas compiled in Rust: ~0.2 µs per valid call instead of ~20 µs. Only its
# "valid" is taken; anything else (invalid, or a value it cannot convert) is judged again by
# the Python validator above, which stays the authority and writes the message.
_FAST_VALIDATORS = {t.name: jsonschema_rs.Draft202012Validator(t.input_schema) for t in TOOLS}
# Page text, titles and urls are tool output too; a screenshot (png_base64) is not text.
_REDACTED_FIELDS = (
    "stdout", "stderr", "prompt", "content", "data", "text", "snapshot", "title", "url",
)  # fmt: skip
# Reads up to this size run on the event loop thread (page-cache reads of a few µs; a
# worker-thread hop costs ~180 µs of CPU). Larger ones and everything else use a thread.
INLINE_MAX_BYTES = 262_144


@dataclass
class Outcome:
    result: dict[str, Any]
    duration_ms: float


class Gateway:
    def __init__(
        self,
        settings: GatewaySettings,
        runtime: Runtime,
        tokens: TokenStore,
        approvals: ApprovalStore,
        audit: AuditLog,
        redactor: Redactor,
    ) -> None:
        self.settings = settings
        self.runtime = runtime
        self.tokens = tokens
        self.approvals = approvals
        self.audit = audit
        self.redactor = redactor
        self.metrics = Metrics()
        self.telemetry = Telemetry(settings)  # traces, only when configured
        self.lifecycle: LifecycleIngest | None = None  # set by create_app
        self.pool_keeper: PoolKeeper | None = None  # set by create_app
        self.state_key = sealed.load_key(runtime.home)  # seals MCP requestState
        self.rate = RateLimiter(settings.gateway.auth.rate_limit_per_minute)
        run = settings.tool("terminal.run") or TerminalRunTool(name="terminal.run")
        self.terminal: TerminalRunTool = run
        self.commands = CommandPolicy(run.allow, run.deny, run.approval)
        # The tools as this gateway lists them and calls them: its limits in the argument
        # descriptions and defaults (rendered once, here).
        self.limits = ToolLimits.from_settings(settings)
        self.tools = render_tools(self.limits)
        self.tools_by_name = {t.name: t for t in self.tools}
        read, write = settings.tool("fs.read"), settings.tool("fs.write")
        self.read_policy = FilePolicy(
            root=read.root if read else "/", max_bytes=read.max_bytes if read else None
        )
        self.write_policy = FilePolicy(
            root=write.root if write else "/",
            max_bytes=write.max_bytes if write else None,
            protected=list(write.protected) if write else [],
            require_diff_summary=bool(write and write.require_diff_summary),
        )
        browser = settings.tool("browser.open") or BrowserOpenTool(name="browser.open")
        self.browser: BrowserOpenTool = browser
        width, _, height = browser.viewport.partition("x")
        self.browsers = BrowserManager(
            runtime,
            BrowserConfig(
                headless=browser.headless,
                width=int(width),
                height=int(height),
                block_domains=tuple(browser.block_domains),
            ),
        )
        desktop = settings.sandbox.desktop
        self.desktops = DesktopManager(
            runtime,
            DesktopConfig(
                max_running=desktop.max_running,
                size=desktop.size,
                idle_timeout=desktop.idle_timeout,
                block_domains=tuple(browser.block_domains),
            ),
        )

    def sandbox_spec(self, requested: dict[str, Any]) -> dict[str, Any]:
        """What a create asks for, completed from the config: its ``sandbox.limits`` and
        ``sandbox.network`` are the defaults, the browser's blocked domains are denied on
        the egress path, and only credentials the config grants may be named."""
        spec = dict(requested)
        spec.setdefault("template", self.settings.sandbox.template)
        limits = self.settings.sandbox.limits.model_dump()
        for key in ("memory", "pids", "cpus", "disk", "lifetime", "idle_timeout", "on_idle"):
            spec.setdefault(key, limits[key])
        if "network" not in spec:
            # Credentials go as names only (domain, header, secret_env, format): the values
            # stay in this process's environment, which the egress daemon inherits.
            spec["network"] = self.settings.sandbox.network.model_dump()
        _check_credentials(spec["network"], self.settings.sandbox.network.credentials)
        if "volumes" not in spec:
            spec["volumes"] = self._default_volumes(str(spec.get("project") or "default"))
        if self.browser.block_domains:  # the egress path refuses them for every request
            network = spec["network"]
            network = dict(network) if isinstance(network, dict) else {"mode": network}
            deny = [*network.get("deny", ()), *self.browser.block_domains]
            network["deny"] = list(dict.fromkeys(deny))
            spec["network"] = network
        return spec

    def _default_volumes(self, project: str) -> list[dict[str, Any]]:
        """The config's cache volumes for ``project`` (sandbox.volumes), each made the
        first time it is missing when the config gives its size."""
        defaults = self.settings.sandbox.volumes
        entries = defaults.get(project, defaults.get("*", []))
        for entry in entries:
            if entry.size is not None and not self.runtime.volumes.exists(entry.name):
                with contextlib.suppress(VolumeExists):  # another create made it first
                    self.runtime.volumes.create(entry.name, entry.size)
        return [entry.model_dump(exclude={"size"}) for entry in entries]

    def lifecycle_changed(self) -> None:
        """A transition was made here: copy its event to the trail and webhooks now."""
        if self.lifecycle is not None:
            self.lifecycle.wake()
        if self.pool_keeper is not None:  # a create may have claimed a warm one
            self.pool_keeper.wake()

    # discovery --------------------------------------------------------------------------
    def visible_tools(self, principal: Principal) -> list[ToolSpec]:
        return [t for t in self.tools if principal.may_use(t.name)]

    # the call path ----------------------------------------------------------------------
    async def call_tool(
        self,
        principal: Principal,
        name: str,
        arguments: dict[str, Any] | None,
        approval_mode: ApprovalMode = "wait",
        approval_id: str | None = None,
        output_listener: OutputCallback | None = None,
        cancel: Cancellation | None = None,
    ) -> Outcome:
        """``cancel``: the caller's handle to kill the call's command (MCP cancellation)."""
        sandbox_id = str((arguments or {}).get("sandbox_id") or principal.sandbox_id or "")
        with self.telemetry.tool_span(name, sandbox_id or None):
            return await self._call_tool(
                principal, name, arguments, approval_mode, approval_id, output_listener,
                cancel or Cancellation(),
            )  # fmt: skip

    async def _call_tool(
        self,
        principal: Principal,
        name: str,
        arguments: dict[str, Any] | None,
        approval_mode: ApprovalMode,
        approval_id: str | None,
        output_listener: OutputCallback | None,
        cancel: Cancellation,
    ) -> Outcome:
        started = time.monotonic()
        args = dict(arguments or {})
        sandbox = str(args.pop("sandbox_id", "") or principal.sandbox_id or "")
        record: dict[str, Any] = {
            "actor": principal.actor,
            "session": principal.token_id,
            "sandbox": sandbox or None,
            "tool": name,
            "args_hash": args_hash(args),
        }
        try:
            spec = self._authorize(principal, name, sandbox)
            self._validate(spec, args)
            args = spec.with_defaults(args)
            decision = self._check_policy(spec, args, sandbox)
            if decision is not None and decision.needs_approval:
                await self._approve(
                    principal, spec, sandbox, args, decision, record, approval_mode, approval_id
                )
            timeout_s, max_bytes, output, applied = self._limits(spec, args)
            call = ToolCall(
                self.runtime,
                sandbox,
                args,
                timeout_s,
                max_bytes,
                output_listener,
                browsers=self.browsers,
                desktops=self.desktops,
                guard=self.path_guard(spec.policy, spec.name),
                output=output,
                limits_applied=applied,
                cancel=cancel,
            )
            before = await self._diff_base(spec, call)
            if spec.inline and _read_bound(call) <= INLINE_MAX_BYTES:
                result = spec.handler(call)
            else:
                try:
                    result = await asyncio.to_thread(spec.handler, call)
                except asyncio.CancelledError:
                    # The caller gave up (MCP cancellation, a closed connection): the thread
                    # would run the command on unseen, so it is killed (its cgroup).
                    cancel.cancel()
                    raise
            if before is not None:
                result["diff"] = self._diff(spec, call, before, result)
            result = jsonbody.encodable(self._redact(result))
        except AgentboxError as e:
            duration = (time.monotonic() - started) * 1000
            if isinstance(e, ApprovalPending):
                decision_name = "approval_pending"
            elif isinstance(e, (PolicyDenied, InsufficientScope, ApprovalDenied, RateLimited)):
                decision_name = "denied"
            else:
                decision_name = "error"
            await self._audit(
                record, decision=decision_name, duration_ms=duration, error=f"{e.code}: {e.message}"
            )
            raise
        duration = (time.monotonic() - started) * 1000
        await self._audit(
            record,
            decision="allowed",
            duration_ms=duration,
            exit_code=result.get("exit_code"),
            bytes_out=_bytes_out(result),
            extra={"diff": result["diff"]} if "diff" in result else None,
        )
        return Outcome(result, duration)

    def _authorize(self, principal: Principal, name: str, sandbox: str) -> ToolSpec:
        spec = self.tools_by_name.get(name)
        if spec is None or not principal.may_use(name):
            if spec is not None and principal.may_use(name) is False:
                raise InsufficientScope(
                    f"this token may not use {name}; ask for a token with it", scope=name
                )
            raise ToolNotFound(f"unknown tool {name!r}; list tools to see what is available")
        self.rate.check(principal.actor)
        if not sandbox:
            raise InvalidRequest(f"{name} needs sandbox_id (the operator token has no sandbox)")
        principal.require_sandbox(sandbox)
        return spec

    @staticmethod
    def _validate(spec: ToolSpec, args: dict[str, Any]) -> None:
        try:
            if _FAST_VALIDATORS[spec.name].is_valid(args):
                return
        except (ValueError, TypeError, OverflowError):
            pass  # e.g. an integer beyond 64 bits or a lone surrogate: the slow path decides
        error = jsonschema.exceptions.best_match(_VALIDATORS[spec.name].iter_errors(args))
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "arguments"
            raise InvalidRequest(
                f"invalid arguments for {spec.name}: {where}: {error.message}", tool=spec.name
            )

    def _check_policy(self, spec: ToolSpec, args: dict[str, Any], sandbox: str) -> Decision | None:
        if spec.policy == "none":
            return None
        if spec.policy == "browser" or (spec.policy == "desktop" and "url" in args):
            if "url" in args:
                self._check_url(spec, str(args["url"]))
            return None
        if spec.policy == "desktop" and "command" not in args:
            return None  # pointer and keyboard actions: the sandbox is the boundary
        if spec.policy in ("command", "desktop"):
            command = args["command"]
            # process_start's terminal (a size) is typed into later. terminal_run's flag is
            # not: all its input comes with the call (stdin), as on pipes.
            if isinstance(args.get("pty"), dict):
                command = self._terminal_command(spec, command)
            decision = self.commands.check(
                command,
                # a shell session's cwd is wherever earlier calls left it: relative program
                # paths are resolved only for a fresh command (cwd from the call, or the default)
                resolve=self._program_resolver(
                    sandbox, None if "session_id" in args else args.get("cwd") or WORKSPACE
                ),
                env=args.get("env") or (),
            )
        elif spec.policy == "fs_read":
            decision = self.read_policy.check_read(args.get("path", "/workspace"))
        else:
            size = _content_bytes(args) if "content" in args else None
            decision = self.write_policy.check_write(args["path"], size)
            if decision.allowed and "destination" in args:
                decision = self.write_policy.check_write(args["destination"])
        if not decision.allowed:
            raise PolicyDenied(decision.reason, rule=decision.rule, tool=spec.name)
        return decision

    def _terminal_command(self, spec: ToolSpec, command: str) -> str:
        """What the policy judges for a program started on a terminal. It reads its code
        from the terminal (``bash -i``): allowed only with terminal.run's ``terminals``,
        and then judged as if its stdin were given; the rest of the rules stand."""
        if not self.terminal.terminals:
            raise PolicyDenied(
                "interactive terminals are off on this gateway: what is typed into one runs "
                "as code the command policy cannot see. Run each command with terminal_run "
                "or process_start, or ask the operator to set `terminals: true` on the "
                "terminal.run tool",
                rule="tools.terminal.run.terminals",
                tool=spec.name,
            )
        # The newline ends a trailing comment; an unbalanced quote or heredoc in the
        # command swallows the closing brace and the whole is unparseable (denied).
        return "{ " + command + "\n} </dev/null"

    def _program_resolver(self, sandbox: str, cwd: str | None) -> Callable[[str], str | None]:
        """Where a program path in a command leads in the sandbox (see resolve_to_system);
        with ``cwd`` None only absolute paths are resolved."""

        def readlink(path: str) -> str | None:
            try:  # only asked for a program path; a sandbox that is not running knows none
                info = self.runtime.files(sandbox).stat(path)
            except AgentboxError:  # missing, not a directory, ...: not a system program
                return None
            return info.symlink_target if info.type == "symlink" else None

        if cwd is not None and not cwd.startswith("/"):
            cwd = None  # the launcher refuses it anyway

        def resolve(word: str) -> str | None:
            if cwd is None and not word.startswith("/"):
                return None
            return resolve_to_system(posixpath.join(cwd or "/", word), readlink)

        return resolve

    def path_guard(self, policy: str, tool: str) -> Guard | None:
        """The file policy as the file layer applies it, to the path it resolves and acts on
        (the check above saw only the requested text). None when it could refuse nothing."""
        if policy == "fs_read":
            read = self.read_policy
            if read.root == "/":  # every path resolved inside the sandbox is under it
                return None
            return _guard(tool, lambda path, _access: read.check_read(path))
        if policy == "fs_write":
            write = self.write_policy
            if write.root == "/" and not write.protected:
                return None
            return _guard(tool, write.check_resolved)
        return None

    def _check_url(self, spec: ToolSpec, url: str) -> None:
        """An early, clear denial for a top-level URL on ``block_domains``. Not the control:
        the sandbox's egress path refuses those names for every request and redirect."""
        check_url(url)
        try:
            parts = urllib.parse.urlsplit(url)
            name = normalize_host(parts.hostname or "")
        except (ValueError, AgentboxError):
            return  # an IP literal or odd name: the egress proxy refuses or decides
        for pattern in self.browser.block_domains:
            if _matches(name, pattern):
                raise PolicyDenied(
                    f"{name} is blocked for the browser (block_domains: {pattern})",
                    rule=f"browser.open.block_domains:{pattern}",
                    tool=spec.name,
                )

    async def _approve(
        self,
        principal: Principal,
        spec: ToolSpec,
        sandbox: str,
        args: dict[str, Any],
        decision: Decision,
        record: dict[str, Any],
        mode: ApprovalMode,
        approval_id: str | None,
    ) -> None:
        command = args.get("command", "")  # a shell string, or an argv (shown quoted)
        text = command if isinstance(command, str) else shlex.join(map(str, command))
        summary = self.redactor.redact(text)
        if approval_id:
            approval = self.approvals.get(approval_id)
            if approval.args_hash != record["args_hash"] or approval.sandbox != sandbox:
                raise InvalidRequest(f"approval {approval_id} was for a different call")
        else:
            approval = self.approvals.request(
                sandbox,
                spec.name,
                summary,
                record["args_hash"],
                principal.actor,
                decision.rule,
                self.terminal.approval_timeout,
            )
            await self._audit(
                record,
                decision="approval_requested",
                extra={"approval": approval.id, "rule": decision.rule, "command": summary},
            )
        if mode == "wait":
            approval = await self.approvals.wait(approval.id)
        elif approval.status == "pending":
            raise ApprovalPending(
                f"`{summary}` waits for an operator's approval ({approval.id}); "
                "call again with the same arguments to see the decision",
                approval_id=approval.id,
            )
        if approval.status != "approved":
            await self._audit(
                record,
                decision="approval_denied",
                extra={"approval": approval.id, "status": approval.status},
            )
            why = "timed out" if approval.status == "expired" else "was denied by the operator"
            raise ApprovalDenied(
                f"`{summary}` {why} ({approval.id}); do not retry it unchanged",
                approval_id=approval.id,
            )
        if not self.approvals.consume(approval.id):
            await self._audit(record, decision="approval_reused", extra={"approval": approval.id})
            raise ApprovalDenied(
                f"approval {approval.id} was used already: it lets `{summary}` run once; "
                "call again without its state to ask for a new one",
                approval_id=approval.id,
            )
        await self._audit(
            record,
            decision="approval_granted",
            extra={"approval": approval.id, "by": approval.decided_by},
        )

    def _limits(
        self, spec: ToolSpec, args: dict[str, Any]
    ) -> tuple[float, int, CommandOutput, tuple[str, ...]]:
        """Timeout, byte cap and command output of a call, each within the configured
        maximum; a request above one is cut to it and noted (the result says which)."""
        applied: list[str] = []
        run, lim = self.terminal, self.limits
        timeout_ms = _within(args, "timeout_ms", lim.timeout_ms, lim.timeout_ms, applied)
        if spec.policy == "fs_read":
            return timeout_ms / 1000, lim.read_max_bytes, CommandOutput(), ()
        cap = _within(args, "max_output_bytes", lim.output_bytes, lim.max_output_bytes, applied)
        output = CommandOutput(cap, run.output_dir, run.max_saved_output_bytes)
        return timeout_ms / 1000, lim.max_output_bytes, output, tuple(applied)

    async def _diff_base(self, spec: ToolSpec, call: ToolCall) -> bytes | None:
        if spec.name not in ("fs_write", "fs_edit") or not self.write_policy.require_diff_summary:
            return None
        files = self.runtime.files(call.sandbox_id)
        try:
            return await asyncio.to_thread(files.read, call.args["path"])
        except FileNotFound:  # a new file (or a dangling symlink to one)
            return b""

    def _diff(self, spec: ToolSpec, call: ToolCall, before: bytes, result: dict[str, Any]) -> str:
        # The content after, from the content before and what the call did: reading the path
        # again would be a second lookup, which a symlink changed meanwhile could redirect.
        args = call.args
        if spec.name == "fs_write":
            data = payload(args)
            after = before + data if args.get("mode") == "append" else data
        elif result["replacements"]:
            after = before.decode().replace(args["old"], args["new"]).encode()
        else:
            after = before
        return self.redactor.redact(diff_summary(args["path"], before or None, after))

    def _redact(self, result: dict[str, Any]) -> dict[str, Any]:
        for key in _REDACTED_FIELDS:
            if isinstance(result.get(key), str):
                result[key] = self.redactor.redact(result[key])
        return result

    async def _audit(
        self,
        record: dict[str, Any],
        *,
        decision: str,
        duration_ms: float | None = None,
        exit_code: int | None = None,
        bytes_out: int | None = None,
        error: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        # Label values must stay few: a tool name a caller made up is counted as "unknown".
        tool = record["tool"] if record["tool"] in TOOLS_BY_NAME else "unknown"
        self.metrics.tool_call(tool, decision, duration_ms)
        await self._append(
            **record,
            decision=decision,
            exit_code=exit_code,
            duration_ms=None if duration_ms is None else round(duration_ms, 3),
            bytes_out=bytes_out,
            error=error,
            extra=extra,
        )

    async def _append(self, **fields: Any) -> None:
        # Batch mode only writes (no fsync): cheaper inline than a hop to a worker thread.
        if self.audit.fsync == "batch":
            self.audit.append(**fields)
        else:
            await self.audit.append_async(**fields)

    async def check_transfer(
        self, principal: Principal, sandbox: str, path: str, write: bool
    ) -> None:
        """Tar upload/download: the scope, rate and file policy of fs_write / fs_read."""
        tool = "fs_write" if write else "fs_read"
        if not principal.may_use(tool):
            raise InsufficientScope(
                f"this token may not use {tool}, which tar transfers need", scope=tool
            )
        self.rate.check(principal.actor)
        principal.require_sandbox(sandbox)
        policy = self.write_policy if write else self.read_policy
        # An upload's destination is only the directory extracted into (by its name): each
        # entry is judged where it resolves, by the guard the route passes to the file layer.
        decision = policy.check_write(path, whole=False) if write else policy.check_read(path)
        if not decision.allowed:
            await self.audit_event(principal, "denied", sandbox=sandbox, tool=tool,
                                   args={"path": path}, rule=decision.rule)  # fmt: skip
            raise PolicyDenied(decision.reason, rule=decision.rule, tool=tool)

    # operator actions, audited like tool calls -------------------------------------------
    async def audit_event(
        self, principal: Principal, decision: str, args: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:  # fmt: skip
        extra = {k: v for k, v in fields.items() if k not in ("sandbox", "tool")}
        await self._append(
            actor=principal.actor,
            session=principal.token_id,
            sandbox=fields.get("sandbox"),
            tool=fields.get("tool"),
            args_hash=args_hash(args) if args is not None else None,
            decision=decision,
            exit_code=None,
            duration_ms=None,
            bytes_out=None,
            error=None,
            extra=extra or None,
        )


def _guard(tool: str, check: Callable[[str, Access], Decision]) -> Guard:
    def guard(path: str, access: Access) -> None:
        decision = check(path, access)
        if not decision.allowed:
            raise PolicyDenied(
                f"resolved inside the sandbox (through its symlinks): {decision.reason}",
                rule=decision.rule,
                tool=tool,
                path=path,
            )

    return guard


def _matches(name: str, pattern: str) -> bool:
    try:
        return domain_matches(name, pattern)
    except AgentboxError:
        return False  # a pattern the egress path would refuse too


def _within(args: dict[str, Any], key: str, default: int, maximum: int,
            applied: list[str]) -> int:  # fmt: skip
    asked = int(args.get(key, default))
    if asked <= maximum:
        return asked
    applied.append(
        f"{key} {asked} was cut to the maximum {maximum} "
        f"(gateway config: tools[terminal.run].{key})"
    )
    return maximum


def _read_bound(call: ToolCall) -> int:
    length = call.args.get("length")
    return call.max_output_bytes if length is None else min(int(length), call.max_output_bytes)


def _content_bytes(args: dict[str, Any]) -> int:
    """The size the write will have on disk (base64 decoded, UTF-8 encoded)."""
    content = str(args["content"])
    if args.get("encoding") == "base64":
        return len(content) * 3 // 4
    return len(content.encode())


def _bytes_out(result: dict[str, Any]) -> int:
    return sum(len(str(result[k]).encode()) for k in _REDACTED_FIELDS if k in result)


def _check_credentials(network: object, configured: Sequence[Any]) -> None:
    """A create may only use the credentials the gateway config grants (else an API caller
    could point any variable of the gateway's environment at a host of its choosing)."""
    asked = network.get("credentials", []) if isinstance(network, dict) else []
    allowed = {(normalize_host(c.domain), c.secret_env) for c in configured}
    for credential in asked:
        if not isinstance(credential, dict):
            raise InvalidRequest("network.credentials entries must be objects")
        key = (normalize_host(str(credential.get("domain"))), credential.get("secret_env"))
        if key not in allowed:
            raise InvalidRequest(
                f"credential {key[1]!r} for {key[0]!r} is not granted by the gateway config "
                "(sandbox.network.credentials); only those may be used"
            )

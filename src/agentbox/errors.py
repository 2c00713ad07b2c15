"""The one error tree of agentbox. Every error has a stable ``code`` that survives the wire.

    AgentboxError                      agentbox_error        the base; an unknown wire code
    ├── InvalidRequest                 invalid_request       bad argument, size, path syntax
    │   ├── InvalidConfig              invalid_config        unknown key / bad value in config
    │   ├── UnparseableCommand         unparseable_command   the command policy cannot analyse it
    │   └── RfbViolation               rfb_violation         a VNC viewer sent what is not relayed
    ├── NotFound                       not_found
    │   ├── SandboxNotFound            sandbox_not_found     no such sandbox (or already destroyed)
    │   ├── ToolNotFound               tool_not_found        no such gateway tool
    │   ├── TemplateNotFound           template_not_found
    │   ├── ProcessNotFound            process_not_found
    │   ├── SessionNotFound            session_not_found
    │   ├── FileNotFound               file_not_found
    │   ├── SnapshotNotFound           snapshot_not_found    no such object in the snapshot store
    │   ├── BrowserHandleNotFound      browser_handle_not_found  no such page (closed, idle)
    │   ├── BrowserRefNotFound         browser_ref_not_found  an element ref of an old snapshot
    │   └── VolumeNotFound             volume_not_found      no such named volume
    ├── Conflict                       conflict
    │   ├── SandboxNotRunning          sandbox_not_running   exec in a stopped/destroyed sandbox
    │   ├── DesktopNotRunning          desktop_not_running   a desktop tool before desktop_start
    │   ├── FileExists                 file_exists
    │   ├── EditMismatch               edit_mismatch         fs edit found a different count
    │   ├── VolumeExists               volume_exists         a volume of that name exists already
    │   ├── VolumeInUse                volume_in_use         writer in the way / rm while mounted
    │   ├── TierUnsupported            tier_unsupported      not on this sandbox's isolation tier
    │   ├── TasksNotConfigured         tasks_not_configured  a task sent where no provider runs it
    │   └── SandboxLost                sandbox_lost          node lost: restore a snapshot (410)
    ├── Unauthenticated                unauthenticated       no/expired/revoked/unknown token (401)
    ├── PermissionDenied               permission_denied     the sandbox user may not do it
    │   ├── PathEscape                 path_escape           a path tried to leave the sandbox
    │   ├── InsufficientScope          insufficient_scope    the token lacks ``details.scope`` (403)
    │   ├── PolicyDenied               policy_denied         a gateway policy rule refused it
    │   ├── SecretsFound               secrets_found         a snapshot holds secrets (report only)
    │   └── ApprovalDenied             approval_denied       a person denied it, or nobody answered
    ├── ApprovalPending                approval_pending      waiting for a person (202)
    ├── LimitExceeded                  limit_exceeded        quota, size cap, too many sandboxes
    │   ├── RateLimited                rate_limited          too many calls for this token (429)
    │   ├── QuotaExceeded              quota_exceeded        a project's sandbox quota is used (429)
    │   ├── CapacityExceeded           capacity_exceeded     no room on the host (503)
    │   │   └── DesktopCapacityExceeded desktop_capacity_exceeded  the host runs its max of desktops
    │   └── BudgetExceeded             budget_exceeded       a daily model budget is spent (429)
    ├── CommandTimeout                 command_timeout       (raised only by wait(); run() reports)
    ├── HostUnsupported                host_unsupported      the host lacks a kernel feature/tool
    │   └── SchemaMismatch             schema_mismatch       state schema of another release
    ├── StateUnavailable               state_unavailable     state database unreachable (503, retry)
    ├── GatewayUnreachable             gateway_unreachable   the SDK/CLI cannot reach the gateway
    ├── NavigationFailed               navigation_failed     a browser page did not load (502)
    ├── NodeUnreachable                node_unreachable      cluster node silent (503, retry)
    ├── ProviderError                  provider_error        a model provider call failed (502)
    │   ├── ProviderRejected           provider_rejected     the request itself was refused (400)
    │   ├── ProviderStreamBroken       provider_stream_broken  stream cut after its first token
    │   └── AllProvidersFailed         all_providers_failed  no provider could answer (503)
    └── SandboxError                   sandbox_error         isolation failed (bug or host fault)

Every message says what happened *and* what to do next. A next step that is a call
(list a directory, pass another count) travels as a structured hint (``details["hint"]``,
see :mod:`agentbox.hints`) and each surface spells it its own way: ``message`` (and
``str()``) is the SDK's spelling, ``hints.render(e, surface)`` any other.

Every class a caller can see is defined here (``tests/unit/test_errors.py`` checks it).
Exceptions defined elsewhere are internal signals that never cross a boundary: the
provider pool's ``ProviderFailure`` (becomes ``ProviderError``), the egress proxy's
``Denied`` / ``MissingCredential`` / ``IdleTimeout`` (become an HTTP answer and an audit
record), the task loop's ``TaskEnd``, the E2B front end's ``ConnectError`` (the Connect
protocol's own codes, mapped from these by ``gateway/e2b/connect.py``), and a few private
``_Xxx`` exceptions inside one module.

Each boundary maps errors in one place: REST in ``gateway/rest_errors.py``, MCP in
``gateway/mcp_server.py`` (``jsonrpc_error``, ``tool_error``), the CLI in ``cli/errors.py``
(``error[code]: message`` and an exit status), the SDK over a gateway in
``client/remote.py`` (``gateway_errors``: HTTP and transport failures back to these
classes).

Provider failures are classified (``agentbox.models.providers.types.Category``) as
``rate_limited | server_error | timeout | connection | auth | bad_request | malformed``;
the category travels in ``details`` (``AllProvidersFailed.details["providers"]`` holds one
``{provider, status, category, message}`` per provider tried or skipped).
"""

from __future__ import annotations

from typing import Any, ClassVar

from agentbox import hints
from agentbox.hints import Hint


class AgentboxError(Exception):
    """Base of every agentbox error. ``reason``: what happened and what to do, but for a
    ``hint`` (a call to make next, spelled per surface)."""

    code: ClassVar[str] = "agentbox_error"
    http_status: ClassVar[int] = 500

    def __init_subclass__(
        cls, *, code: str | None = None, http_status: int | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        # A class without its own ``code`` or ``http_status`` keeps its parent's.
        if code is not None:
            cls.code = code
        if http_status is not None:
            cls.http_status = http_status

    def __init__(self, message: str, *, hint: Hint | None = None, **details: Any) -> None:
        self.reason = message
        self.details = details
        if hint is not None:
            details["hint"] = hint.to_dict()
        self.message = hints.render(self, "sdk")  # raised in-process: the SDK's spelling
        super().__init__(self.message)

    def to_dict(self, surface: hints.Surface = "sdk") -> dict[str, Any]:
        data = {"code": self.code, "message": hints.render(self, surface), "details": self.details}
        if "hint" in self.details:  # what from_dict re-renders the hint onto
            data["reason"] = self.reason
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> AgentboxError:
        """Rebuild the same error class on the other side of the wire."""
        # Looked up at call time, so subclasses defined in other modules are found too.
        by_code = {c.code: c for c in _all_subclasses(AgentboxError)}
        cls = by_code.get(str(data.get("code")), AgentboxError)
        details = dict(data.get("details") or {})
        hint = Hint.from_dict(details.pop("hint", None))
        # The reason without the sender's spelling of the hint: ours is added again.
        reason = data.get("reason")
        message = str(reason if isinstance(reason, str) else data.get("message", ""))
        return cls(message, hint=hint, **details)


# The tree: one declaration a class, its ``code`` (and ``http_status`` where it differs
# from the parent's) given as class keywords that ``__init_subclass__`` sets. The classes
# stay real ``class`` statements, not generated, so callers and type checkers see the
# names they catch.


class InvalidRequest(AgentboxError, code="invalid_request", http_status=400): ...


class InvalidConfig(InvalidRequest, code="invalid_config"): ...


class UnparseableCommand(InvalidRequest, code="unparseable_command"):
    """The command cannot be analysed statically, so the policy refuses it.

    ``rule`` (also in ``details``) says why: one of the ``RULE_*`` constants of
    ``policy/shell_analysis.py``.
    """

    def __init__(self, message: str, *, rule: str | None = None, **details: Any) -> None:
        if rule is not None:  # every raise names it; absent, the generic one is meant
            details["rule"] = rule
        super().__init__(message, **details)
        self.rule = rule or "unparseable"
        self.programs: list[str] = list(details.get("programs", []))
        """Programs found before the analysis had to stop (for "deny wins" reporting)."""


class RfbViolation(InvalidRequest, code="rfb_violation"):
    """A VNC viewer sent something the gateway does not relay."""


class NotFound(AgentboxError, code="not_found", http_status=404): ...


class SandboxNotFound(NotFound, code="sandbox_not_found"): ...


class ToolNotFound(NotFound, code="tool_not_found"): ...


class TemplateNotFound(NotFound, code="template_not_found"): ...


class ProcessNotFound(NotFound, code="process_not_found"): ...


class SessionNotFound(NotFound, code="session_not_found"): ...


class FileNotFound(NotFound, code="file_not_found"): ...


class SnapshotNotFound(NotFound, code="snapshot_not_found"): ...


class BrowserHandleNotFound(NotFound, code="browser_handle_not_found"): ...


class BrowserRefNotFound(NotFound, code="browser_ref_not_found"): ...


class VolumeNotFound(NotFound, code="volume_not_found"): ...


class Conflict(AgentboxError, code="conflict", http_status=409): ...


class SandboxNotRunning(Conflict, code="sandbox_not_running"): ...


class DesktopNotRunning(Conflict, code="desktop_not_running"): ...


class FileExists(Conflict, code="file_exists"): ...


class EditMismatch(Conflict, code="edit_mismatch"): ...


class VolumeExists(Conflict, code="volume_exists"): ...


class VolumeInUse(Conflict, code="volume_in_use"):
    """A volume is mounted where the request needs it free: a second read-write mount,
    a read-only mount beside a writer, or ``volume rm`` while a sandbox holds it
    (``details["sandboxes"]``: who holds it)."""


class TierUnsupported(Conflict, code="tier_unsupported"):
    """The feature does not hold on the sandbox's isolation tier (yet); the message says
    which tier has it. docs/design.md's tier table lists them."""


class SandboxLost(Conflict, code="sandbox_lost", http_status=410):
    """Cluster mode: the node that ran the sandbox stopped answering and was declared
    lost; the sandbox's processes and unsaved files are gone (``details``: ``node``,
    ``lost_at``). Restore its last snapshot, or create a new sandbox."""


class TasksNotConfigured(Conflict, code="tasks_not_configured"):
    """A task was submitted to a gateway that could not run it."""


class PermissionDenied(AgentboxError, code="permission_denied", http_status=403): ...


class PathEscape(PermissionDenied, code="path_escape"): ...


class Unauthenticated(AgentboxError, code="unauthenticated", http_status=401): ...


class InsufficientScope(PermissionDenied, code="insufficient_scope"): ...


class PolicyDenied(PermissionDenied, code="policy_denied"): ...


class SecretsFound(PermissionDenied, code="secrets_found", http_status=422):
    """A snapshot was refused because the secret scan found something; ``details``
    carries the findings (path, line, kind), never a value."""


class ApprovalDenied(PermissionDenied, code="approval_denied"): ...


class ApprovalPending(AgentboxError, code="approval_pending", http_status=202): ...


class LimitExceeded(AgentboxError, code="limit_exceeded", http_status=429): ...


class RateLimited(LimitExceeded, code="rate_limited"): ...


class QuotaExceeded(LimitExceeded, code="quota_exceeded", http_status=429):
    """A project already has its maximum of sandboxes; ``retry_after`` seconds."""


class CapacityExceeded(LimitExceeded, code="capacity_exceeded", http_status=503):
    """The host has no room (sandbox count or committed memory); ``retry_after``."""


class DesktopCapacityExceeded(CapacityExceeded, code="desktop_capacity_exceeded"):
    """The host already runs its configured maximum of desktops (``sandbox.desktop``)."""


class BudgetExceeded(LimitExceeded, code="budget_exceeded", http_status=429):
    """A project spent its daily token or USD budget; ``retry_after`` seconds until the
    next UTC day, when it starts afresh."""


class CommandTimeout(AgentboxError, code="command_timeout", http_status=408): ...


class HostUnsupported(AgentboxError, code="host_unsupported", http_status=503): ...


class StateUnavailable(AgentboxError, code="state_unavailable", http_status=503):
    """The shared state database (PostgreSQL) could not be reached or lost the connection
    mid-call: retry (``details["retry_after"]``); whatever the call wrote was rolled back,
    unless it failed while committing."""


class GatewayUnreachable(AgentboxError, code="gateway_unreachable", http_status=503):
    """The SDK or CLI could not reach the gateway (``AGENTBOX_URL``), or lost it during a
    call: is ``agentbox serve`` running there? Whatever the call was doing may have
    happened."""


class NavigationFailed(AgentboxError, code="navigation_failed", http_status=502):
    """A browser page did not load (the site, the network, or the egress policy)."""


class NodeUnreachable(AgentboxError, code="node_unreachable", http_status=503):
    """Cluster mode: the node running the sandbox did not answer the gateway. Retry
    (``details["retry_after"]``): a node that stays silent is declared lost, and calls on
    its sandboxes then answer ``sandbox_lost``."""


class SchemaMismatch(HostUnsupported, code="schema_mismatch"):
    """The state database's schema is older (run ``agentbox db migrate``) or newer
    (upgrade agentbox) than this release: no retry helps until that is done (so it is no
    ``StateUnavailable``, which callers retry)."""


class ProviderError(AgentboxError, code="provider_error", http_status=502):
    """A model provider call failed; ``details`` name the provider and the category."""


class ProviderRejected(ProviderError, code="provider_rejected", http_status=400):
    """The provider refused the request as wrong (400/404/422): another provider or a
    retry would refuse it too, so it is not retried."""


class ProviderStreamBroken(ProviderError, code="provider_stream_broken", http_status=502):
    """A stream was cut after tokens had reached the caller: failing over would repeat
    them, so the caller decides (retry the whole request, or keep the partial answer)."""


class AllProvidersFailed(ProviderError, code="all_providers_failed", http_status=503):
    """Every eligible provider failed or was skipped (circuit open); ``details["providers"]``
    lists what each one answered."""


class SandboxError(AgentboxError, code="sandbox_error", http_status=500): ...


def _all_subclasses(cls: type[AgentboxError]) -> list[type[AgentboxError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


__all__ = [c.__name__ for c in _all_subclasses(AgentboxError)]

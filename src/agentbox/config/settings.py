"""The gateway's configuration: the YAML shape of ``shared/gateway.example.yaml``.

Validated strictly: an unknown key, a duplicate key or a bad value is refused at start
with the file, the line, the key path and what was expected. Secrets never appear here:
keys ending in ``_env`` / ``_file`` name where a secret is injected at start.
Without a file, ``GatewaySettings()`` is the embedded default.
"""

from __future__ import annotations

import os
import re
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentbox.config.specs import CredentialSpec, NetworkSpec, problem_of
from agentbox.errors import InvalidConfig, InvalidRequest
from agentbox.state.db import state_url_error
from agentbox.units import parse_duration, parse_size
from agentbox.volumes.spec import VolumeMount


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _size(value: int | str) -> int:
    try:
        return parse_size(value)
    except InvalidRequest as e:  # pydantic reports ValueErrors with their location
        raise ValueError(e.message) from None


def _seconds(value: float | str) -> float:
    try:
        return parse_duration(value)
    except InvalidRequest as e:
        raise ValueError(e.message) from None


class AuthSettings(Strict):
    mode: Literal["bearer"] = "bearer"
    operator_token_env: str | None = "AGENTBOX_OPERATOR_TOKEN"  # noqa: S105 - a variable name
    operator_token_file: Path | None = None
    ttl_seconds: int = Field(default=3600, gt=0, le=30 * 86400)
    rate_limit_per_minute: int = Field(default=600, gt=0)


class TLSSettings(Strict):
    cert_file: Path
    key_file: Path


class GatewaySection(Strict):
    listen: str = "127.0.0.1:8848"
    auth: AuthSettings = AuthSettings()
    # Shared state (sandbox registry, tokens, approvals, usage, tasks, E2B keys): "sqlite",
    # files in $AGENTBOX_HOME where the CLI and egress daemon find them (a sqlite:/// URL
    # means the same: the path is not used), or postgresql://USER@HOST:PORT/DB for many
    # gateways (no password here: $PGPASSWORD or ~/.pgpass; `agentbox db migrate` first).
    state: str = "sqlite"
    # Where snapshots go: file:///path or s3://bucket/prefix; default $AGENTBOX_HOME/snapshots.
    store: str | None = None
    tls: TLSSettings | None = None
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # Host headers besides the listen address and loopback names (a public bind's DNS
    # names, e.g. "agentbox.example.com:8848"); anything else is refused (DNS rebinding).
    allowed_hosts: list[str] = Field(default_factory=list)
    allowed_origins: list[str] = Field(default_factory=list)
    # What a graceful shutdown does to the home's sandboxes: they outlive the gateway
    # (keep, the default; a restart adopts them), or are stopped or destroyed with it.
    on_shutdown: Literal["keep", "stop", "destroy"] = "keep"

    @field_validator("state")
    @classmethod
    def _state(cls, value: str) -> str:
        if value.startswith("sqlite:"):
            return "sqlite"
        problem = state_url_error(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:8848")
        return value


class LimitsSettings(Strict):
    memory: int = 2 * 1024**3
    pids: int = Field(default=512, ge=8)
    cpus: float = Field(default=2.0, gt=0)
    disk: int = 10 * 1024**3
    lifetime: float = 24 * 3600.0
    idle_timeout: float = 15 * 60.0
    on_idle: Literal["pause", "stop", "destroy"] = "pause"

    _sizes = field_validator("memory", "disk", mode="before")(classmethod(lambda c, v: _size(v)))
    _durations = field_validator("lifetime", mode="before")(classmethod(lambda c, v: _seconds(v)))
    _idle = field_validator("idle_timeout", mode="before")(  # 0: never
        classmethod(lambda c, v: 0.0 if v in (0, "0", "never") else _seconds(v))
    )


# sandbox.network is the network spec a create takes (one shape, one checker): names in
# the config are normalised, and a bad one refused, when the gateway starts.
NetworkSettings = NetworkSpec
CredentialSettings = CredentialSpec


class AdmissionSettings(Strict):
    """Checked atomically with each create: over a limit it gets 503 capacity_exceeded
    (host) or 429 quota_exceeded (project), with Retry-After."""

    max_sandboxes: int | None = Field(default=None, gt=0)
    max_per_project: int | None = Field(default=None, gt=0)
    # Memory limits committed by live sandboxes: a size, or a multiple of the host's RAM
    # ("2x": limits are caps, and most sandboxes use a fraction of theirs).
    max_memory: str | None = "2x"

    @field_validator("max_memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is not None and not value.endswith("x"):
            _size(value)
        elif value is not None:
            try:
                if float(value[:-1]) <= 0:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    "expected a size like 64GiB or a multiple of RAM like 2x"
                ) from None
        return value

    def max_memory_bytes(self) -> int | None:
        if self.max_memory is None:
            return None
        if self.max_memory.endswith("x"):
            return int(
                float(self.max_memory[:-1])
                * os.sysconf("SC_PHYS_PAGES")
                * os.sysconf("SC_PAGE_SIZE")
            )
        return _size(self.max_memory)


class DesktopSettings(Strict):
    """Desktop mode (Xvnc + openbox inside a sandbox): heavy, so capped per host."""

    max_running: int = Field(default=4, ge=0)
    size: str = Field(default="1024x768", pattern=r"^[0-9]{2,4}x[0-9]{2,4}$")
    idle_timeout: float = Field(default=900.0, ge=0)  # seconds without calls or viewers; 0: never


class DefaultVolume(VolumeMount):
    """A cache volume every sandbox of a project gets unless its create names volumes;
    made with ``size`` the first time it is missing. Busy (another sandbox writes it):
    skipped by default, so concurrent sandboxes of a project still start."""

    if_busy: Literal["fail", "skip"] = "skip"
    size: int | None = None

    _size = field_validator("size", mode="before")(
        classmethod(lambda c, v: None if v is None else _size(v))
    )


class VolumeSettings(Strict):
    """Where named volumes' images go (another disk: ``dir``) and how much all their
    sizes may add up to (``capacity``; default: that filesystem's size)."""

    dir: str | None = None
    capacity: int | None = None

    _capacity = field_validator("capacity", mode="before")(
        classmethod(lambda c, v: None if v is None else _size(v))
    )


class SandboxSection(Strict):
    template: str = "default"
    runtime: Literal["bwrap", "crun", "runc", "runsc", "kata"] = "bwrap"
    limits: LimitsSettings = LimitsSettings()
    network: NetworkSpec = NetworkSpec()
    # Warm sandboxes of `template` with these limits and network, or {template: count}.
    warm_pool: (
        Annotated[int, Field(ge=0, le=1000)] | dict[str, Annotated[int, Field(ge=0, le=1000)]]
    ) = 0
    admission: AdmissionSettings = AdmissionSettings()
    desktop: DesktopSettings = DesktopSettings()
    # Default cache volumes per project ("*": projects without a list of their own).
    volumes: dict[str, list[DefaultVolume]] = Field(default_factory=dict)


class TerminalRunTool(Strict):
    name: Literal["terminal.run"]
    cwd: str = "/workspace"
    # The longest a terminal_run / shell_run may ask for, and what it gets when it asks
    # for nothing; a longer request is cut to it and the result says so.
    timeout_ms: int = Field(default=120_000, gt=0)
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    # Output kept in a result, per stream (head + tail): output_bytes unless the call asks
    # for more (max_output_bytes at most). A longer stream is saved whole (its first
    # max_saved_output_bytes) in output_dir in the sandbox, charged to its disk.
    output_bytes: int = Field(default=16_384, gt=0)
    max_output_bytes: int = Field(default=262_144, gt=0)
    max_saved_output_bytes: int = Field(default=64 * 1024**2, ge=0)
    output_dir: str = "/tmp/agentbox-output"
    approval: list[str] = Field(default_factory=list)
    approval_timeout: float = 300.0
    # Interactive terminals (process_start with a pty; E2B's sandbox.pty): what is typed
    # into one runs as code the command policy cannot see (like a shell reading its
    # stdin), so they are refused unless turned on. Their program is still judged, and
    # every input is an audited process_write.
    terminals: bool = False

    _timeout = field_validator("approval_timeout", mode="before")(
        classmethod(lambda c, v: _seconds(v))
    )
    _sizes = field_validator("output_bytes", "max_output_bytes", mode="before")(
        classmethod(lambda c, v: _size(v))
    )
    _saved = field_validator("max_saved_output_bytes", mode="before")(  # 0: never saved
        classmethod(lambda c, v: 0 if v in (0, "0") else _size(v))
    )

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, value: str) -> str:
        if not value.startswith("/") or "\0" in value:
            raise ValueError("expected an absolute path in the sandbox, e.g. /tmp/agentbox-output")
        return value


class BrowserOpenTool(Strict):
    name: Literal["browser.open"]
    headless: bool = True
    viewport: str = "1280x800"
    block_domains: list[str] = Field(default_factory=list)

    @field_validator("viewport")
    @classmethod
    def _viewport(cls, value: str) -> str:
        width, sep, height = value.partition("x")
        if not sep or not width.isdigit() or not height.isdigit():
            raise ValueError("expected WIDTHxHEIGHT, e.g. 1280x800")
        return value


class FsReadTool(Strict):
    name: Literal["fs.read"]
    root: str = "/workspace"
    max_bytes: int = Field(default=2 * 1024 * 1024, gt=0)


class FsWriteTool(Strict):
    name: Literal["fs.write"]
    root: str = "/workspace"
    max_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    require_diff_summary: bool = False
    protected: list[str] = Field(default_factory=list)


ToolSettings = Annotated[
    TerminalRunTool | BrowserOpenTool | FsReadTool | FsWriteTool, Field(discriminator="name")
]


class RedactionSettings(Strict):
    detectors: Literal["default", "none"] = "default"
    literals_from_env: list[str] = Field(default_factory=list)


AuditSinkKind = Literal["local_jsonl", "remote_log_service"]


def _local_sink_only() -> list[AuditSinkKind]:
    return ["local_jsonl"]


class RemoteAuditSettings(Strict):
    url: str
    token_env: str | None = None


class AuditSettings(Strict):
    sink: list[AuditSinkKind] = Field(default_factory=_local_sink_only)
    path: Path | None = None  # default: $AGENTBOX_HOME/audit/audit.jsonl
    fsync: Literal["always", "batch"] = "always"
    rotate_bytes: int = 64 * 1024 * 1024
    remote: RemoteAuditSettings | None = None
    # What the remote sink ships (the local file keeps whole records); empty: everything.
    fields: list[str] = Field(default_factory=list)

    @field_validator("fields")
    @classmethod
    def _known_fields(cls, value: list[str]) -> list[str]:
        from agentbox.config.audit_fields import RESERVED

        unknown = sorted(set(value) - RESERVED)
        if unknown:
            raise ValueError(f"unknown audit fields {unknown}; choose from {sorted(RESERVED)}")
        return value

    _rotate = field_validator("rotate_bytes", mode="before")(classmethod(lambda c, v: _size(v)))


class ModelPrice(Strict):
    """What a model costs, in USD per million tokens (the unit of providers' price pages).

    Input read from the provider's prompt cache and input written to it have their own
    prices (Anthropic: reads 0.1x the input price, 5-minute writes 1.25x; OpenAI: cached
    input 0.25x-0.5x, no write charge); unset, they cost the input price. ``source`` (the
    page the prices were read from) and ``checked`` (when) keep the table honest."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    cache_read_per_mtok: float | None = Field(default=None, ge=0)
    cache_write_per_mtok: float | None = Field(default=None, ge=0)
    source: str | None = None
    checked: date | None = None


class ProviderSettings(Strict):
    """One model service of the pool (see ``agentbox.models.providers``).

    ``base_url`` defaults to the vendor's API (https://api.openai.com/v1,
    https://api.anthropic.com); a local model is an ``openai`` provider with a loopback
    ``base_url``. ``models`` are the models it serves (a request naming another model goes
    elsewhere; empty: any); the first is used when a request names none.
    ``timeout_seconds`` bounds each network step (connect, each read of a stream).
    ``prices`` are per provider, because the same model costs differently (or nothing)
    depending on who serves it::

        prices:
          claude-sonnet-4: {input_per_mtok: 3, output_per_mtok: 15, cache_read_per_mtok: 0.3,
                            cache_write_per_mtok: 3.75, checked: 2026-12-01,
                            source: "https://docs.anthropic.com/en/docs/about-claude/pricing"}

    A model missing from ``prices`` costs 0 USD (its tokens still count against token
    budgets, and the usage summary reports them as unpriced). A dated name such as
    ``claude-sonnet-4-20250514`` takes the price of ``claude-sonnet-4``.

    ``aliases`` map a model name clients ask for to the model this provider is asked for
    instead (``{gpt-5.5: claude-sonnet-4-5}``: Codex keeps the GPT name it has tuned
    settings for, and an Anthropic provider serves it); an alias is served even when
    ``models`` does not list it.
    """

    name: str
    kind: Literal["anthropic", "openai"]
    base_url: str | None = None
    api_key_env: str | None = None
    models: list[str] = Field(default_factory=list)
    aliases: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float = Field(default=60.0, gt=0)
    prices: dict[str, ModelPrice] = Field(default_factory=dict)


class RetrySettings(Strict):
    max_attempts: int = Field(default=3, ge=1, le=20)
    base_seconds: float = Field(default=1.0, ge=0)
    max_seconds: float = Field(default=30.0, ge=0)
    jitter: Literal["full", "none"] = "full"


class BudgetSettings(Strict):
    project: str
    tokens_per_day: int | None = Field(default=None, gt=0)
    usd_per_day: float | None = Field(default=None, gt=0)
    alert_at: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=list)
    alert_webhook_env: str | None = None


class WebhookSettings(Strict):
    url: str = Field(pattern=r"^https?://")
    # HMAC-SHA256 key for the X-Agentbox-Signature-256 header, read from this variable.
    secret_env: str | None = None
    events: list[str] = Field(default_factory=list)  # empty: every event type


class LifecycleSettings(Strict):
    """Idle enforcement and where lifecycle events go (see runtime/lifecycle.py)."""

    check_interval: float = 10.0
    cpu_floor: float = Field(default=0.05, ge=0, le=64)  # of one core; more is activity
    webhooks: list[WebhookSettings] = Field(default_factory=list)

    _interval = field_validator("check_interval", mode="before")(
        classmethod(lambda c, v: _seconds(v))
    )


class SnapshotSettings(Strict):
    """Retention, applied after each snapshot the gateway takes; the secret scan's budget."""

    max_count: int | None = Field(default=None, gt=0)
    max_age: float | None = None
    # Bytes the secret scan reads per snapshot at most (holes are free; "64GiB"); what is
    # past it is listed as unscanned in the snapshot and its audit record. None: no limit.
    scan_budget: int | None = Field(default=64 * 1024**3, ge=0)

    _budget = field_validator("scan_budget", mode="before")(
        classmethod(lambda c, v: None if v is None else _size(v))
    )

    _age = field_validator("max_age", mode="before")(
        classmethod(lambda c, v: None if v is None else _seconds(v))
    )


class TaskSettings(Strict):
    """Batch-task workers of the gateway (see agentbox.tasks)."""

    workers: int = Field(default=1, ge=0, le=64)
    model: str | None = None  # the model the reference loop asks for (default: each provider's)
    # A running task's worker renews its lease this often x3; a dead gateway's task is
    # queued again (and resumes after its last step) once the lease has run out.
    lease_seconds: float = Field(default=30.0, gt=0)
    # What happens to a task's sandbox when the task ends (succeeded, failed, cancelled):
    # destroyed, or stopped with its disk kept (to look at, or `agentbox start` again).
    on_end: Literal["destroy", "stop"] = "destroy"


class TelemetrySettings(Strict):
    """OpenTelemetry traces over OTLP/HTTP, off unless an endpoint is given (here or in
    OTEL_EXPORTER_OTLP_ENDPOINT), e.g. http://127.0.0.1:4318."""

    otlp_endpoint: str | None = Field(default=None, pattern=r"^https?://")
    service_name: str = "agentbox"


class E2BKey(Strict):
    """An E2B API key (``X-API-KEY``) for one project: its sandboxes only."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    project: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    key_env: str  # the variable holding the key; never the key itself in the file


class E2BSettings(Strict):
    """The E2B-compatible front door under ``/e2b`` (see gateway/e2b)."""

    # get_host(port) answers PORT-ID.DOMAIN; requests with such a Host reach the port.
    domain: str = "e2b.localhost"
    api_keys: list[E2BKey] = Field(default_factory=list)


class ClusterNodeSettings(Strict):
    """``agentbox node``'s own part of ``cluster`` (docs/cluster.md)."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    listen: str = "0.0.0.0:8849"
    advertise: str = Field(pattern=r"^https://[^/]+$")  # where gateways dial the node API
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected HOST:PORT, e.g. 0.0.0.0:8849")
        return value


class ClusterSettings(Strict):
    """Cluster mode (docs/cluster.md): mutual TLS between gateways and nodes, heartbeats."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    heartbeat_seconds: float = Field(default=2.0, gt=0)
    lost_after_seconds: float = Field(default=10.0, gt=0)
    # How long the audit copies in PostgreSQL are kept (`agentbox audit prune --cluster`
    # deletes older ones behind a checkpoint); None: forever. Each host's own JSONL file
    # keeps gateway.audit's rotation whatever this says.
    audit_retention_days: float | None = Field(default=None, gt=0)
    node: ClusterNodeSettings | None = None


class GatewaySettings(Strict):
    gateway: GatewaySection = GatewaySection()
    sandbox: SandboxSection = SandboxSection()
    lifecycle: LifecycleSettings = LifecycleSettings()
    snapshots: SnapshotSettings = SnapshotSettings()
    tasks: TaskSettings = TaskSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    tools: list[ToolSettings] = Field(default_factory=list)
    redaction: RedactionSettings = RedactionSettings()
    audit: AuditSettings = AuditSettings()
    providers: list[ProviderSettings] = Field(default_factory=list)
    retry: RetrySettings = RetrySettings()
    budgets: list[BudgetSettings] = Field(default_factory=list)
    e2b: E2BSettings = E2BSettings()
    volumes: VolumeSettings = VolumeSettings()
    cluster: ClusterSettings | None = None  # cluster mode (docs/cluster.md)

    @model_validator(mode="after")
    def _cluster_state(self) -> GatewaySettings:
        if self.cluster is not None and self.gateway.state == "sqlite":
            raise ValueError("cluster: needs gateway.state: postgresql://… (shared by every part)")
        return self

    @field_validator("providers")
    @classmethod
    def _unique_providers(cls, value: list[ProviderSettings]) -> list[ProviderSettings]:
        # Health, circuit state and usage are kept per provider name.
        _unique([p.name for p in value], "provider names must be unique")
        return value

    @field_validator("budgets")
    @classmethod
    def _unique_budgets(cls, value: list[BudgetSettings]) -> list[BudgetSettings]:
        _unique([b.project for b in value], "one budget per project")
        return value

    def tool(self, name: str) -> Any:
        """The settings of tool ``name`` ("terminal.run", ...), or None when not configured."""
        return next((t for t in self.tools if t.name == name), None)


# Loading with positions ---------------------------------------------------------------
def _positions(
    node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int], source: str
) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise InvalidConfig(
                    f"{source}:{key_node.start_mark.line + 1}: duplicate key "
                    f"{'.'.join(map(str, (*path, key)))!r}; each key may appear once"
                )
            seen.add(key)
            out[(*path, key)] = key_node.start_mark.line + 1
            _positions(value_node, (*path, key), out, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _positions(item, (*path, index), out, source)


def _line_of(loc: tuple[Any, ...], positions: dict[tuple[Any, ...], int]) -> int | None:
    # pydantic adds the discriminator tag to locations inside a tagged union: skip it.
    clean = tuple(p for p in loc if not (isinstance(p, str) and "." in p and p[0].isalpha()))
    for end in range(len(clean), -1, -1):
        if clean[:end] in positions:
            return positions[clean[:end]]
    return None


def parse_settings(text: str, source: str = "<config>") -> GatewaySettings:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise InvalidConfig(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        return GatewaySettings()
    if not isinstance(data, dict):
        raise InvalidConfig(f"{source}: the top level must be a mapping of sections")
    positions: dict[tuple[Any, ...], int] = {}
    if node is not None:
        _positions(node, (), positions, source)
    try:
        return GatewaySettings.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        line = _line_of(loc, positions)
        key = ".".join(str(p) for p in loc if not (isinstance(p, str) and "." in p))
        where = f"{source}:{line}" if line else source
        if err["type"] == "extra_forbidden":
            problem = "unknown key (check its spelling against gateway.example.yaml)"
        elif key.startswith("sandbox.network"):  # the network checks name the item
            key, value, reason = problem_of(err)
            problem = f"{reason} (got {value!r})"
        else:
            problem = f"{err['msg']} (got {_masked(err.get('input'))!r})"
        more = f" (+{len(e.errors()) - 1} more problems)" if len(e.errors()) > 1 else ""
        raise InvalidConfig(
            f"{where}: {key}: {problem}{more}", file=source, line=line, key=key
        ) from None


def _masked(value: Any) -> Any:
    """A refused value as the error shows it: a URL's password never (logs keep errors)."""
    if isinstance(value, str):
        return re.sub(r"(://[^/@:\s]*:)[^/@\s]*@", r"\1***@", value)
    return value


def load_settings(path: Path | None) -> GatewaySettings:
    """Settings from ``path``, or the embedded defaults when ``path`` is None."""
    if path is None:
        return GatewaySettings()
    try:
        text = path.read_text()
    except OSError as e:
        raise InvalidConfig(f"{path}: cannot read the configuration: {e.strerror}") from None
    return parse_settings(text, str(path))


def _unique(keys: list[str], rule: str) -> None:
    if len(keys) != len(set(keys)):
        raise ValueError(f"{rule}, got {keys}")

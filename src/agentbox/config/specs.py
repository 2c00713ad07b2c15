"""Sandbox specifications (pydantic v2, unknown keys refused): what ``create`` validates.

Apart from ``agentbox.config.host`` so that a process which only uses existing sandboxes
(``agentbox sandbox exec``, the SDK's ``connect``) never imports pydantic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from agentbox.errors import InvalidRequest
from agentbox.fsutil import exec_text
from agentbox.network import credentials as _credentials
from agentbox.network import policy_fields
from agentbox.network.modes import EgressMode
from agentbox.units import parse_duration, parse_size
from agentbox.volumes.spec import VolumeMount, check_mounts

T = TypeVar("T")


def _checked(check: Callable[[str], str], value: str) -> str:
    """Run one of the network checks, turning its error into a validation error."""
    try:
        return check(value)
    except InvalidRequest as e:
        raise ValueError(e.message) from None


# The egress proxy's own check of each credential field (it checks them again on load).
_CREDENTIAL_CHECKS: dict[str, Callable[[str], str]] = {
    "domain": _credentials.check_domain,
    "header": _credentials.check_header,
    "secret_env": _credentials.check_env,
    "format": _credentials.check_format,
}


class CredentialSpec(BaseModel):
    """A secret the egress proxy adds to requests for ``domain`` (one host, no wildcard):
    header ``header`` = ``format`` with ``{secret}`` replaced by the value of the
    environment variable ``secret_env`` *of the egress daemon*. Only the variable's name is
    stored; the value never enters the sandbox."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    domain: str
    header: str = "Authorization"
    secret_env: str
    format: str = "Bearer {secret}"

    @field_validator(*_CREDENTIAL_CHECKS)
    @classmethod
    def _check(cls, value: str, info: ValidationInfo) -> str:
        return _checked(_CREDENTIAL_CHECKS[str(info.field_name)], value)


class NetworkSpec(BaseModel):
    """What a sandbox may reach: the one shape of a network spec (SDK argument, REST body,
    the gateway config's ``sandbox.network``, a record's ``network``; the egress daemon's
    policy is built from it). Every field is normalised here by the checks the egress
    proxy applies (:mod:`agentbox.network.policy_fields`), so a spec that exists is one
    the proxy can apply. A mode string alone (``"none"``) stands for ``{"mode": ...}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: EgressMode = Field(
        default="allowlist",
        description="none: loopback only; allowlist: the names in allow; open: any public "
        "address; ask: like allowlist, but a connection to any other name is held until a "
        "person approves or denies it (at most ask_timeout). In every mode internal ranges, "
        "the cloud metadata address, the host and the names matching deny stay unreachable",
    )
    ask_timeout: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Mode ask: seconds (or a duration like 2m) a held connection waits for "
        "a person's decision; then it is denied (see agentbox.egressd.ask)",
    )
    allow: tuple[str, ...] = Field(
        default=(),
        description="Host names reachable in allowlist mode; *.example.com matches every "
        "name below example.com (not example.com itself). Normalised: lower case, IDNA "
        "A-labels, no trailing dot; IP literals, empty labels, NUL and other control "
        "characters are refused",
    )
    ports: tuple[Annotated[int, Field(ge=1, le=65535)], ...] = Field(
        default=policy_fields.DEFAULT_PORTS, description="TCP ports reachable (1-65535)"
    )
    hosts: Mapping[str, str] = Field(
        default_factory=lambda: MappingProxyType({}),
        description="Host name -> IP address, used by the egress proxy instead of DNS "
        "(private deployments, tests); the address is still checked against the denied "
        "ranges on every connection",
    )
    deny: tuple[str, ...] = Field(
        default=(),
        description="Host names refused in every mode, checked before allow (same syntax)",
    )
    credentials: tuple[CredentialSpec, ...] = Field(
        default=(),
        description="Headers the egress proxy sets on requests to one host each, from a "
        "secret of its own environment; the value never enters the sandbox (a gateway "
        "allows only the ones its config grants)",
    )

    @model_validator(mode="before")
    @classmethod
    def _mode_only(cls, value: object) -> object:
        return {"mode": value} if isinstance(value, str) else value

    @field_validator("ask_timeout", mode="before")
    @classmethod
    def _ask_timeout(cls, value: float | str) -> float:
        return parse_duration(value, "ask_timeout")

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: object) -> str:
        return _field_check(policy_fields.mode, value)

    @field_validator("allow", "deny", mode="before")
    @classmethod
    def _patterns(cls, value: object, info: ValidationInfo) -> tuple[str, ...]:
        return _field_check(policy_fields.patterns, value, info.field_name)

    @field_validator("ports", mode="before")
    @classmethod
    def _ports(cls, value: object) -> tuple[int, ...]:
        return _field_check(policy_fields.ports, value)

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, value: object) -> dict[str, str]:
        return _field_check(policy_fields.host_map, value)

    @field_validator("hosts")
    @classmethod
    def _read_only(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        return MappingProxyType(dict(value))  # frozen all the way down

    @field_serializer("hosts")
    def _hosts_out(self, value: Mapping[str, str]) -> dict[str, str]:
        return dict(value)

    # Immutable all the way down: a copy is the spec itself (pydantic deep-copies model
    # defaults, and a read-only mapping cannot be copied or pickled field by field).
    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> NetworkSpec:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (NetworkSpec.model_validate, (self.model_dump(mode="json"),))

    @field_validator("credentials")
    @classmethod
    def _unique(cls, value: tuple[CredentialSpec, ...]) -> tuple[CredentialSpec, ...]:
        return _field_check(_unique_credentials, value)

    @classmethod
    def parse(cls, value: NetworkSpec | str | Mapping[str, object]) -> NetworkSpec:
        """``value`` as a spec; :class:`InvalidRequest` naming the field and value if it
        is not one."""
        if isinstance(value, NetworkSpec):
            return value
        try:
            return cls.model_validate(value)
        except ValidationError as e:
            raise invalid_request(e.errors(), "invalid network", prefix="network") from None


def _unique_credentials(value: tuple[CredentialSpec, ...]) -> tuple[CredentialSpec, ...]:
    _credentials.check_unique(value)
    return value


class _FieldError(ValueError):
    """A network check's refusal, carried through pydantic to :func:`invalid_request`."""

    def __init__(self, error: InvalidRequest) -> None:
        super().__init__(error.reason)
        self.error = error


def _field_check(check: Callable[..., T], *args: Any) -> T:
    try:
        return check(*args)
    except InvalidRequest as e:
        raise _FieldError(e) from None


def invalid_request(
    errors: Sequence[Mapping[str, Any]], what: str, prefix: str = "", skip: tuple[str, ...] = ()
) -> InvalidRequest:
    """One :class:`InvalidRequest` for pydantic's ``errors``: each problem as ``field:
    reason``, the first one's ``field`` (a dotted path, ``network.allow.0``) and the
    ``value`` refused in details. ``prefix``: the path of what was validated (``network``);
    ``skip``: location parts that are no field (FastAPI's ``body``)."""
    problems = [problem_of(e, prefix, skip) for e in errors] or [("spec", None, "invalid")]
    field, value, _ = problems[0]
    text = "; ".join(f"{f}: {reason}" for f, _, reason in problems)
    return InvalidRequest(
        f"{what}: {text}" if what else text,
        field=field, value=policy_fields.shown(value), problems=len(problems),
    )  # fmt: skip


def problem_of(
    error: Mapping[str, Any], prefix: str = "", skip: tuple[str, ...] = ()
) -> tuple[str, object, str]:
    """One pydantic error as (field, value, reason); a network check names the item."""
    loc = [str(p) for p in error.get("loc", ()) if p not in skip]
    loc = [prefix, *loc] if prefix else loc
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, _FieldError) and loc:
        # The check names the field inside the network spec (with the item) itself.
        inner = str(cause.error.details.get("field", loc[-1]))
        reason = cause.error.reason.removeprefix(f"{inner}: ")
        return ".".join([*loc[:-1], inner]), cause.error.details.get("value"), reason
    reason = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return ".".join(loc) or "spec", error.get("input"), reason


MAX_MEMORY = 1024**5
MAX_DISK = 16 * 1024**4
# The largest memory and disk a spec may ask for, and their spelling in the error. The disk
# is a sparse file on the host: ext4 files end at 16 TiB (mkfs failed).
_SIZE_RANGES = {"memory": (MAX_MEMORY, "1PiB"), "disk": (MAX_DISK, "16TiB")}
MAX_DURATION_S = 3650 * 86400.0


class SandboxSpec(BaseModel):
    """What a sandbox is made of. Sizes accept ``512MiB``-style strings; durations ``15m``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    template: str = "default"
    isolation: Literal["namespaces", "gvisor"] = Field(
        default="namespaces",
        description="isolation tier: namespaces (bubblewrap + seccomp, fastest) or gvisor "
        "(runsc: a user-space kernel between the agent and the host); docs/design.md",
    )
    memory: int = Field(default=2 * 1024**3, description="memory limit in bytes")
    pids: int = Field(default=512, ge=8, le=1_000_000, description="max processes")
    cpus: float = Field(default=2.0, gt=0, le=1024, description="CPU quota in cores")
    disk: int = Field(default=10 * 1024**3, description="writable layer + /workspace, bytes")
    lifetime: float = Field(default=24 * 3600.0, description="max lifetime in seconds")
    idle_timeout: float = Field(
        default=15 * 60.0,
        ge=0,
        description="seconds without activity before on_idle applies (0: never); activity "
        "is defined in docs/design.md (Lifecycle)",
    )
    on_idle: Literal["pause", "stop", "destroy"] = "pause"
    network: NetworkSpec = NetworkSpec()
    env: dict[str, str] = Field(default_factory=dict)
    project: str = "default"
    volumes: tuple[VolumeMount, ...] = Field(
        default=(),
        max_length=6,
        description="named volumes to mount (agentbox.volumes): rw for one sandbox at a "
        "time, ro for many; not in snapshots or fork copies",
    )

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, value: tuple[VolumeMount, ...]) -> tuple[VolumeMount, ...]:
        check_mounts(value)
        return value

    @field_validator("memory", "disk", mode="before")
    @classmethod
    def _size(cls, value: int | str, info: object) -> int:
        name = getattr(info, "field_name", "size")
        return parse_size(value, name)

    @field_validator("lifetime", "idle_timeout", mode="before")
    @classmethod
    def _duration(cls, value: float | str, info: object) -> float:
        name = getattr(info, "field_name", "duration")
        if name == "idle_timeout" and value in (0, "0", "never"):
            return 0.0  # no idle timeout
        return parse_duration(value, name)

    @field_validator(*_SIZE_RANGES)
    @classmethod
    def _size_range(cls, value: int, info: ValidationInfo) -> int:
        top, spelled = _SIZE_RANGES[str(info.field_name)]
        if not 16 * 1024**2 <= value <= top:
            raise ValueError(f"{info.field_name} must be from 16MiB to {spelled}")
        return value

    @field_validator("lifetime", "idle_timeout")
    @classmethod
    def _duration_cap(cls, value: float, info: object) -> float:
        # Past this the sandbox init could not parse it (a 500 at create).
        if not value <= MAX_DURATION_S:  # NaN too
            raise ValueError(f"{getattr(info, 'field_name', 'duration')} must be at most 3650d")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not key or "=" in key:
                raise ValueError(f"invalid environment variable {key!r}")
            exec_text(key, "an environment variable name")
            exec_text(val, f"environment variable {key}")
        return value

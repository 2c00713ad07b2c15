"""Sandbox specifications (pydantic v2, unknown keys refused): what ``create`` validates.

Apart from ``agentbox.config`` so that a process which only uses existing sandboxes
(``agentbox sandbox exec``, the SDK's ``connect``) never imports pydantic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentbox.config import stored_network
from agentbox.errors import InvalidRequest
from agentbox.fsutil import exec_text
from agentbox.network import credentials as _credentials
from agentbox.network.names import normalize_pattern
from agentbox.units import parse_duration, parse_size


def _checked(check: Callable[[str], str], value: str) -> str:
    """Run one of the network checks, turning its error into a validation error."""
    try:
        return check(value)
    except InvalidRequest as e:
        raise ValueError(e.message) from None


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

    @field_validator("domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        return _checked(_credentials.check_domain, value)

    @field_validator("header")
    @classmethod
    def _header(cls, value: str) -> str:
        return _checked(_credentials.check_header, value)

    @field_validator("secret_env")
    @classmethod
    def _env(cls, value: str) -> str:
        return _checked(_credentials.check_env, value)

    @field_validator("format")
    @classmethod
    def _format(cls, value: str) -> str:
        return _checked(_credentials.check_format, value)


class NetworkSpec(BaseModel):
    """What a sandbox may reach. ``none``: loopback only; ``allowlist``: the names in
    ``allow`` (``*.example.com`` = any name below it); ``open``: any public address. In
    every mode internal ranges, the metadata address and the host stay unreachable, and
    so do the names matching ``deny`` (same syntax as ``allow``). ``credentials``: headers
    the egress proxy injects for one host each (see :class:`CredentialSpec`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["none", "allowlist", "open"] = "allowlist"
    allow: tuple[str, ...] = ()
    ports: tuple[Annotated[int, Field(gt=0, lt=65536)], ...] = (80, 443)
    # name -> IP literal, resolved by the egress proxy instead of DNS (private deployments,
    # tests); the address is still checked against the denied ranges.
    hosts: dict[str, str] = Field(default_factory=dict)
    deny: tuple[str, ...] = ()
    credentials: tuple[CredentialSpec, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _mode_only(cls, value: object) -> object:
        return {"mode": value} if isinstance(value, str) else value

    @field_validator("deny")
    @classmethod
    def _deny(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_checked(normalize_pattern, p) for p in value)

    @field_validator("credentials")
    @classmethod
    def _unique(cls, value: tuple[CredentialSpec, ...]) -> tuple[CredentialSpec, ...]:
        try:
            _credentials.check_unique(value)
        except InvalidRequest as e:
            raise ValueError(e.message) from None
        return value


def network_of(spec: Mapping[str, object]) -> NetworkSpec:
    """The network part of a stored spec (a record's ``spec`` dict), validated."""
    return NetworkSpec.model_validate(stored_network(spec))


MAX_MEMORY = 1024**5
MAX_DISK = 16 * 1024**4
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

    @field_validator("memory")
    @classmethod
    def _memory_range(cls, value: int) -> int:
        if not 16 * 1024**2 <= value <= MAX_MEMORY:
            raise ValueError("memory must be from 16MiB to 1PiB")
        return value

    @field_validator("disk")
    @classmethod
    def _disk_range(cls, value: int) -> int:
        # The disk is a sparse file on the host: ext4 files end at 16 TiB (mkfs failed).
        if not 16 * 1024**2 <= value <= MAX_DISK:
            raise ValueError("disk must be from 16MiB to 16TiB")
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

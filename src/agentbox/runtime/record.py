"""A sandbox's registry record (:mod:`agentbox.runtime.store`): its state one of a fixed
set, its settings one validated :class:`~agentbox.config.specs.SandboxSpec`.

The store keeps the spec as JSON text. A command on an existing sandbox never imports
pydantic (tests/unit/test_import_weight.py), so what that path needs (isolation tier,
network mode, credentials, environment) is read from the JSON; ``spec`` is parsed on
first use, once per distinct text in a process (the egress daemon re-reads its records
every few seconds). Records written by older versions still load: a network stored as a
mode string, a missing network (then ``none``), keys this version no longer knows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache

# typing only for the type checker: a record read back over the home's socket loads none
# (tests/unit/test_import_weight.py); SandboxState, built with it, is served lazily.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Literal

    from agentbox.config.specs import SandboxSpec
    from agentbox.runtime.spec_cache import StoredSpec

    SandboxState = Literal[
        "creating",  # reserved: its slot is held, its init not yet started
        "pooled",  # warm, invisible to calls until a create claims it
        "running",
        "paused",
        "stopped",  # no process; the disk is kept
        "destroying",
        "error",  # a create that failed; recovery removes it
        "exited",  # never stored: a running record whose init is gone (Runtime.get)
    ]


def __getattr__(name: str) -> object:
    if name == "SandboxState":
        from typing import Literal

        state = Literal[STATES]  # type: ignore[valid-type]  # a tuple: each of its members
        globals()[name] = state
        return state
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The states SandboxState names (the type checker's copy, with what each means, is above).
STATES = ("creating", "pooled", "running", "paused", "stopped", "destroying", "error", "exited")

PUBLIC_SPEC = ("memory", "cpus", "pids", "disk", "network", "project", "idle_timeout", "on_idle")


@dataclass(frozen=True)
class SandboxRecord:
    """A sandbox as the store holds it: identity, state, template and its init process."""

    id: str
    slot: int
    state: SandboxState
    template: str
    template_digest: str
    init_pid: int | None
    init_start_time: int | None
    created_at: float
    expires_at: float | None
    stored: str  # the spec as the store holds it (JSON; SQL reads its memory and project)

    PUBLIC_SPEC = PUBLIC_SPEC

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SandboxRecord:
        data = dict(row)
        return cls(**{k: v for k, v in data.items() if k != "spec"}, stored=data["spec"])

    @cached_property
    def spec(self) -> SandboxSpec:
        """The validated settings (pydantic is imported on first use; see parse_spec)."""
        return parse_spec(self.stored, self.id)

    @cached_property
    def _raw(self) -> dict[str, Any]:
        value = json.loads(self.stored)
        return value if isinstance(value, dict) else {}

    @property
    def pool(self) -> str | None:
        """The warm pool's key while ``pooled`` (see ``runtime.pool_key``)."""
        pool = self._raw.get("pool")
        return str(pool) if pool else None

    @property
    def from_pool(self) -> bool:
        """Whether a create claimed it warm from a pool (no launch on its create's path)."""
        return bool(self._raw.get("from_pool"))

    @property
    def isolation(self) -> str:
        """``namespaces`` (the default tier) or ``gvisor`` (see ``runtime.tiers``)."""
        return str(self._raw.get("isolation") or "namespaces")

    @property
    def network_mode(self) -> str:
        """``none``, ``allowlist``, ``open`` or ``ask``, read without pydantic."""
        return str(_stored_network(self._raw)["mode"])

    @property
    def has_credentials(self) -> bool:
        """Whether the egress proxy injects credentials for it (see ``specs.CredentialSpec``)."""
        return bool(_stored_network(self._raw).get("credentials"))

    @property
    def has_volumes(self) -> bool:
        """Whether named volumes are mounted in it (see ``agentbox.volumes``), read
        without pydantic (a destroy needs no more)."""
        return bool(self._raw.get("volumes"))

    @property
    def env(self) -> dict[str, str]:
        """The environment every command starts with, read without pydantic."""
        return dict(self._raw.get("env") or {})

    def to_dict(self) -> dict[str, Any]:
        """What clients see (the CLI's --json, the REST API); host details stay out."""
        return {
            "id": self.id,
            "state": self.state,
            "template": self.template,
            "template_digest": self.template_digest,
            "isolation": self.isolation,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "from_pool": self.from_pool,
            **{k: self._raw.get(k) for k in PUBLIC_SPEC},
        }


def stored(
    spec: SandboxSpec | StoredSpec, pool: str | None = None, *, from_pool: bool = False
) -> str:
    """The JSON text a record keeps for ``spec`` (and a warm sandbox's pool key, or that a
    create claimed it from one)."""
    data = spec.model_dump(mode="json")
    if pool is not None:
        data["pool"] = pool
    if from_pool:
        data["from_pool"] = True
    return json.dumps(data)


def _stored_network(raw: Mapping[str, Any]) -> dict[str, Any]:
    # Old records held only a mode string; older ones no network at all (no egress then).
    network = raw.get("network", "none")
    return {"mode": network} if isinstance(network, str) else dict(network)


@lru_cache(maxsize=1024)
def parse_spec(text: str, sandbox_id: str = "") -> SandboxSpec:
    """A stored spec, validated (cached: the spec is frozen); else
    :class:`~agentbox.errors.InvalidRequest` naming the field (an edited database).

    Older versions checked network names less strictly (``allow=['bad..name']`` was
    stored): such a network reads as mode ``none``, which is all the egress daemon can
    give it, and is logged once, so that idle timeouts, listings and the rest still work
    for that sandbox."""
    from pydantic import ValidationError

    from agentbox.config.specs import SandboxSpec, invalid_request

    raw = json.loads(text)
    known = {k: v for k, v in raw.items() if k in SandboxSpec.model_fields}
    known["network"] = _stored_network(raw)
    try:
        return SandboxSpec.model_validate(known)
    except ValidationError as e:
        error = invalid_request(e.errors(), f"sandbox {sandbox_id or '?'}: stored settings")
    if not str(error.details.get("field", "")).startswith("network"):
        raise error
    import logging  # here: a command on a sandbox never needs it (startup time)

    logging.getLogger(__name__).warning("%s; the sandbox gets no egress", error.message)
    try:
        return SandboxSpec.model_validate({**known, "network": "none"})
    except ValidationError as e:
        raise invalid_request(e.errors(), f"sandbox {sandbox_id}: stored settings") from None

"""The E2B-compatible front door: the unmodified E2B SDKs against agentbox.

Mounted at ``/e2b`` by the gateway: ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` both point
there (the control-plane and envd paths do not overlap; envd requests carry
``E2b-Sandbox-Id``). ``control`` is the control plane, ``envd`` the in-sandbox daemon's
API, ``connect`` the Connect RPC framing, ``models`` the wire shapes, ``access`` the keys.
"""

from __future__ import annotations

from starlette.applications import Starlette

from agentbox.gateway.e2b.access import E2BAccess
from agentbox.gateway.e2b.control import ControlPlane
from agentbox.gateway.e2b.envd import Envd
from agentbox.gateway.service import Gateway

PREFIX = "/e2b"


def build_e2b(gateway: Gateway) -> Starlette:
    settings = gateway.settings.e2b
    access = E2BAccess(settings, gateway.tokens, gateway.runtime.home, gateway.state_key)
    control = ControlPlane(gateway, access, settings.domain)
    return Starlette(routes=[*control.routes(), *Envd(gateway, access).routes()])

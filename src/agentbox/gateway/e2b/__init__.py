"""The E2B-compatible front door: the unmodified E2B SDKs against agentbox.

Mounted at ``/e2b`` by the gateway: ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` both point
there (the control-plane and envd paths do not overlap; envd requests carry
``E2b-Sandbox-Id``). ``control`` is the control plane, ``envd`` the in-sandbox daemon's
API, ``connect`` the Connect RPC framing, ``models`` the wire shapes, ``access`` the keys,
``ports`` the ``PORT-ID.DOMAIN`` hosts of ``get_host``, ``timeouts`` the pause at
an E2B timeout (``on_timeout: pause``).
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from agentbox.gateway.e2b.access import E2BAccess
from agentbox.gateway.e2b.control import ControlPlane
from agentbox.gateway.e2b.envd import Envd
from agentbox.gateway.e2b.models import e2b_error
from agentbox.gateway.e2b.ports import PortHosts
from agentbox.gateway.e2b.timeouts import TimeoutPauses
from agentbox.gateway.service import Gateway

PREFIX = "/e2b"


class E2BFrontDoor:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.settings = gateway.settings.e2b
        self.access = E2BAccess(
            self.settings, gateway.tokens, gateway.runtime.home, gateway.state_key
        )
        pauses = TimeoutPauses(gateway, self.access)
        control = ControlPlane(gateway, self.access, self.settings.domain, pauses)
        self.app = Starlette(
            routes=[*control.routes(), *Envd(gateway, self.access, pauses).routes()],
            exception_handlers={404: _not_found, 405: _not_found},
        )

    def port_hosts(self, app: ASGIApp) -> ASGIApp:
        """``app`` behind the layer that sends ``PORT-ID.DOMAIN`` requests to the port
        (and signed file URLs, which the SDKs address at the root, to envd)."""
        max_body = self.gateway.settings.gateway.max_body_bytes
        return PortHosts(app, self.app, self.gateway, self.access, self.settings.domain, max_body)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    """E2B routes agentbox does not serve (templates, snapshots, fork, ...): E2B's shape."""
    what = f"{request.method} {request.url.path}"
    return JSONResponse(e2b_error(404, f"{what} is not served by agentbox's E2B API"), 404)

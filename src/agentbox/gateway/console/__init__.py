"""The web console: its page served at ``/``, its script, style and desktop view under
``/console/``; both pages are put together once from their parts (:mod:`.pages`).

The page carries no data, so these routes need no token. The operator pastes the operator
token into the page, which keeps it in a JavaScript variable only (never storage, cookies
or URLs) and reads everything from the authenticated ``/v1`` API with it.

Every response here carries a strict Content-Security-Policy: scripts, styles and fetches
from this origin only, no inline code, no framing. The script inserts server data with
``textContent`` only, since audit records and command summaries are attacker-influenced.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from agentbox.errors import NotFound
from agentbox.gateway.console.pages import PAGES, render

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; object-src 'none'; form-action 'none'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # Revalidate on every load, so a gateway upgrade never pairs a new page with old code.
    "Cache-Control": "no-cache",
}
# noVNC draws JPEG rectangles (Tight encoding) through data: URLs: inert images, allowed
# on the desktop page only.
DESKTOP_HEADERS = SECURITY_HEADERS | {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY.replace(
        "img-src 'self'", "img-src 'self' data: blob:"
    )
}
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "desktop.html": "text/html; charset=utf-8",  # a sandbox's desktop, through noVNC
    "desktop.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
PAGE = "index.html"


def console_router() -> APIRouter:
    """``GET /`` (the page) and ``GET /console/{asset}``; the files are read once, here."""
    files = resources.files(__name__)
    page = render(PAGE)
    assets = {
        name: render(name) if name in PAGES else files.joinpath(name).read_bytes()
        for name in ASSETS
    }
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def console_page() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)

    @router.get("/console/{name}")
    async def console_asset(name: str) -> Response:
        if name not in assets:
            raise NotFound(f"no console file {name!r}")
        headers = DESKTOP_HEADERS if name == "desktop.html" else SECURITY_HEADERS
        return Response(assets[name], media_type=ASSETS[name], headers=headers)

    return router


def mount_console(app: FastAPI) -> None:
    app.include_router(console_router())
    if NOVNC.is_dir():  # Debian's novnc: the RFB client the desktop page imports
        app.mount("/console/novnc", NoVncFiles(directory=NOVNC), name="novnc")


NOVNC = Path("/usr/share/novnc")


class NoVncFiles(StaticFiles):
    """noVNC's ES modules (``core/``, ``vendor/``) only, with the console's headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        if not path.startswith(("core/", "vendor/")) or not path.endswith(".js"):
            raise NotFound(f"no noVNC file {path!r}")
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response

"""The console's two pages, put together once from their parts: one head for both
(``page.html``) and the operator page's tables from one pattern (``table.html``)."""

from __future__ import annotations

import html
from importlib import resources
from string import Template

# The operator page's keyed tables: console.js fills ``<name>-rows`` and keeps the rows in
# step with the API; the caption is what a screen reader announces.
TABLES = {
    "sandboxes": (
        "Sandboxes on this gateway, refreshed every few seconds",
        ("ID", "State", "Template", "Project", "Age", "Memory limit", "In use", "Actions"),
    ),
    "approvals": (
        "Commands and egress names waiting for an operator's decision",
        ("Request", "Sandbox", "Tool", "Rule", "Requested by", "Expires in", "Decision"),
    ),
    "audit": (
        "The latest audit records, newest first",
        ("Seq", "Time", "Decision", "Actor", "Sandbox", "Tool", "Details"),
    ),
}
# Page file -> the word after "agentbox" in its title, and its script.
PAGES = {"index.html": ("console", "console.js"), "desktop.html": ("desktop", "desktop.js")}


def render(name: str) -> bytes:
    """Page ``name`` (a key of PAGES) as served."""
    files = resources.files("agentbox.gateway.console")
    part = files.joinpath(name).read_text("utf-8")
    table = Template(files.joinpath("table.html").read_text("utf-8").rstrip("\n"))
    body = Template(part).substitute(
        {f"table_{rows}": _table(table, rows, caption, heads)
         for rows, (caption, heads) in TABLES.items()}
    )  # fmt: skip
    title, script = PAGES[name]
    page = Template(files.joinpath("page.html").read_text("utf-8"))
    return page.substitute(name=title, script=script, body=body).encode()


def _table(table: Template, rows: str, caption: str, heads: tuple[str, ...]) -> str:
    columns = "".join(
        f'                <th scope="col">{html.escape(h, quote=False)}</th>\n' for h in heads
    )
    return table.substitute(
        caption=html.escape(caption, quote=False), columns=columns, rows=f"{rows}-rows"
    )

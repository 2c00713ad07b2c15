"""A compact accessibility tree for an agent: landmarks and interactive elements, with refs.

Playwright's AI snapshot (``page.aria_snapshot(mode="ai")``) computes roles and accessible
names the way assistive technology does and tags elements with refs (``e12``, ``f1e3``
inside frames) that its ``aria-ref=`` locator resolves from then on, in the page's
injected script (the page's own scripts cannot re-point them). It lists every text node
too; an agent deciding what to click needs far less, so this keeps landmarks, headings
and what can be clicked or typed into, indented by their kept ancestors::

    - navigation "Main" [ref=e2]
      - link "Docs" [ref=e3] -> /docs
    - main [ref=e5]
      - heading "Search" [level=1] [ref=e6]
      - textbox "Query" [ref=e9]
      - button "Go" [ref=e10]
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

INTERACTIVE = frozenset(
    {
        "button", "link", "textbox", "searchbox", "checkbox", "radio", "combobox", "listbox",
        "menuitem", "menuitemcheckbox", "menuitemradio", "option", "tab", "switch", "slider",
        "spinbutton", "treeitem", "gridcell", "columnheader",
    }
)  # fmt: skip
LANDMARKS = frozenset(
    {
        "banner", "navigation", "main", "contentinfo", "complementary", "search", "form",
        "region", "dialog", "alertdialog", "alert", "iframe", "heading", "tablist", "menu",
        "menubar", "tree", "grid", "table",
    }
)  # fmt: skip
REF = re.compile(r"^(?:f\d+)?e\d+$")
_KEY = re.compile(
    r'^(?P<role>[a-zA-Z]+)(?: (?P<name>"(?:[^"\\]|\\.)*"))?(?P<attrs>(?: \[[^\]]*\])*)$'
)
_ATTR = re.compile(r"\[([^\]]*)\]")
_SHOWN_ATTRS = ("level", "checked", "disabled", "expanded", "pressed", "selected")


@dataclass(frozen=True)
class Element:
    ref: str
    role: str
    name: str
    depth: int
    attrs: tuple[str, ...] = ()
    url: str | None = None

    def line(self) -> str:
        parts = ["  " * self.depth + "- " + self.role]
        if self.name:
            parts.append(json.dumps(self.name, ensure_ascii=False))
        parts += [f"[{a}]" for a in self.attrs]
        parts.append(f"[ref={self.ref}]")
        if self.url:
            parts.append(f"-> {self.url}")
        return " ".join(parts)


@dataclass(frozen=True)
class Snapshot:
    elements: tuple[Element, ...]
    text: str
    truncated: bool


def compact(raw: str, max_chars: int) -> Snapshot:
    """The kept elements of Playwright's AI snapshot ``raw``, at most ``max_chars`` long.

    If the snapshot cannot be parsed (a format change), the raw text is returned, cut
    to the cap, so the agent still sees refs.
    """
    try:
        tree = yaml.safe_load(raw)
    except yaml.YAMLError:
        tree = None
    if not isinstance(tree, list):
        return Snapshot((), raw[:max_chars], len(raw) > max_chars)
    elements: list[Element] = []
    _walk(tree, 0, elements)
    lines, size, truncated = [], 0, False
    for element in elements:
        line = element.line()
        if size + len(line) + 1 > max_chars:
            truncated = True
            break
        lines.append(line)
        size += len(line) + 1
    return Snapshot(tuple(elements[: len(lines)]), "\n".join(lines), truncated)


def _walk(items: list[Any], depth: int, out: list[Element]) -> None:
    for item in items:
        if isinstance(item, str):
            key, value = item, None
        elif isinstance(item, dict) and len(item) == 1:
            key, value = next(iter(item.items()))
            key = str(key)
        else:
            continue
        element = _element(key, depth, value)
        if element is not None:
            out.append(element)
        if isinstance(value, list):
            _walk(value, depth + 1 if element is not None else depth, out)


def _element(key: str, depth: int, value: Any) -> Element | None:
    match = _KEY.match(key)
    if match is None:
        return None
    role = match["role"]
    attrs = _ATTR.findall(match["attrs"] or "")
    ref = next((a[4:] for a in attrs if a.startswith("ref=")), None)
    if ref is None or not REF.match(ref) or (role not in INTERACTIVE and role not in LANDMARKS):
        return None
    name = _name(match["name"])
    shown = tuple(a for a in attrs if a.split("=", 1)[0] in _SHOWN_ATTRS)
    url = None
    if isinstance(value, list):
        url = next((str(v["/url"]) for v in value if isinstance(v, dict) and "/url" in v), None)
    return Element(ref, role, name, depth, shown, url)


def _name(quoted: str | None) -> str:
    if not quoted:
        return ""
    try:
        return str(json.loads(quoted))
    except ValueError:
        return quoted[1:-1]

"""Every tool argument is described for a model: its unit, default and limit, and a JSON
Schema ``default`` that is the handler's own (the handler reads it from the schema)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest

from agentbox.config.settings import parse_settings
from agentbox.gateway.tools import TOOLS, ToolLimits, ToolSpec, render_tools

# A config with no default value, so a description that ignores the config shows.
CONFIG = """
tools:
  - name: terminal.run
    timeout_ms: 4321
    output_bytes: 3000
    max_output_bytes: 77777
  - name: fs.read
    max_bytes: 555555
  - name: fs.write
    max_bytes: 666666
  - name: browser.open
    viewport: 999x777
"""
LIMITS = ToolLimits.from_settings(parse_settings(CONFIG, "limits.yaml"))
RENDERED = render_tools(LIMITS)


def _args_reads(spec: ToolSpec) -> tuple[set[str], list[str]]:
    """The argument names the handler subscripts, and its ``.get(name, default)`` calls."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(spec.handler)))
    read, defaulted = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            read.add(str(node.slice.value))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and len(node.args) == 2):  # fmt: skip
            defaulted.append(ast.unparse(node))
    return read, defaulted


@pytest.mark.parametrize("spec", RENDERED, ids=lambda s: s.name)
def test_every_argument_is_described_and_defaulted_from_the_schema(spec: ToolSpec) -> None:
    props = spec.input_schema["properties"]
    required = set(spec.input_schema["required"])
    for name, prop in props.items():
        assert isinstance(prop.get("description"), str) and prop["description"].strip(), name
    read, defaulted = _args_reads(spec)
    # A default written in the handler could differ from the one the client was shown.
    assert defaulted == [], f"{spec.name} has its own defaults: {defaulted}"
    for name in read & set(props) - required:
        assert "default" in props[name], f"{spec.name} reads {name} but the schema has no default"
    for name in set(props) - required:
        if "default" in props[name]:
            assert spec.with_defaults({})[name] == props[name]["default"]


def test_configured_limits_are_in_the_descriptions_and_defaults() -> None:
    tools = {t.name: t.input_schema["properties"] for t in RENDERED}
    for tool in ("terminal_run", "shell_run"):
        assert tools[tool]["timeout_ms"]["default"] == 4321
        assert "4321" in tools[tool]["timeout_ms"]["description"]
        assert tools[tool]["max_output_bytes"]["default"] == 3000
        assert "77777" in tools[tool]["max_output_bytes"]["description"]
    assert tools["process_read"]["limit"]["default"] == 77777
    assert tools["fs_read"]["length"]["default"] == 555555
    assert "555555" in tools["fs_read"]["length"]["description"]
    assert "666666" in tools["fs_write"]["content"]["description"]
    assert "999x777" in tools["browser_screenshot"]["full_page"]["description"]
    assert "4.321 s" in tools["browser_open"]["url"]["description"]
    # The module's own list stays the default rendering; rendering leaves it alone.
    assert TOOLS[0].input_schema["properties"]["timeout_ms"]["default"] == 120_000


def test_a_mutable_default_is_a_fresh_copy_per_call() -> None:
    # Immutable defaults are shared (no copy per call); a list or dict one must not be, or
    # a handler changing its args would change the schema every client is shown.
    spec = next(t for t in RENDERED if t.name == "terminal_run")
    schema = {**spec.input_schema, "properties": {
        **spec.input_schema["properties"], "tags": {"type": "array", "default": [["a"]]}}}  # fmt: skip
    spec = dataclasses.replace(spec, input_schema=schema)
    first = spec.with_defaults({})
    first["tags"][0].append("changed")
    assert spec.with_defaults({})["tags"] == [["a"]]
    assert schema["properties"]["tags"]["default"] == [["a"]]
    assert first["timeout_ms"] == schema["properties"]["timeout_ms"]["default"]

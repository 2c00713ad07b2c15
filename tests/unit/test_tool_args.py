"""Each tool's MCP inputSchema is its pydantic argument model's schema (one declaration),
in a shape every MCP client takes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from agentbox.gateway.tool_args import ARGS, input_schema
from agentbox.gateway.tools import (
    DEFAULT_LIMITS,
    TOOLS,
    ToolSpec,
    configured_schema,
    render_tools,
)


def test_every_tool_has_one_argument_model() -> None:
    assert sorted(ARGS) == sorted(t.name for t in TOOLS)


@pytest.mark.parametrize("spec", TOOLS, ids=lambda t: t.name)
def test_input_schema_is_the_models_schema(spec: ToolSpec) -> None:
    assert spec.input_schema == configured_schema(input_schema(ARGS[spec.name]), DEFAULT_LIMITS)


def test_a_gateways_tools_state_its_limits_over_the_models_schema() -> None:
    limits = dataclasses.replace(DEFAULT_LIMITS, timeout_ms=1234, max_output_bytes=4096)
    for spec in render_tools(limits):
        expected = configured_schema(input_schema(ARGS[spec.name]), limits)
        assert spec.input_schema == expected, spec.name
    run = next(t for t in render_tools(limits) if t.name == "terminal_run")
    assert run.input_schema["properties"]["timeout_ms"]["default"] == 1234


def _keys(node: Any) -> set[str]:
    """Every schema keyword used (property names are skipped: they are not keywords)."""
    if isinstance(node, list):
        return set().union(*map(_keys, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = set(node)
    for key, value in node.items():
        if key == "properties":
            found |= set().union(*map(_keys, value.values())) if value else set()
        elif key != "default":
            found |= _keys(value)
    return found


@pytest.mark.parametrize("spec", TOOLS, ids=lambda t: t.name)
def test_schema_is_plain_for_every_client(spec: ToolSpec) -> None:
    schema = spec.input_schema
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert not _keys(schema) & {"$ref", "$defs", "title", "allOf"}, json.dumps(schema)
    assert list(schema["properties"])[-1] == "sandbox_id"
    assert "sandbox_id" not in schema["required"]
    for name, prop in schema["properties"].items():
        assert prop.get("description"), name  # what a model reads to fill it in
        if prop.get("type") == "object" and "properties" in prop:
            assert prop["additionalProperties"] is False, name


def test_nested_models_are_inlined_and_closed() -> None:
    pty = ARGS["process_start"]
    prop = input_schema(pty)["properties"]["pty"]
    size = prop["anyOf"][0]
    assert size["additionalProperties"] is False and size["required"] == ["cols", "rows"]
    assert prop["anyOf"][1] == {"type": "null"} and prop["default"] is None


def test_an_optional_argument_without_default_shows_its_type_alone() -> None:
    stdin = input_schema(ARGS["terminal_run"])["properties"]["stdin"]
    assert stdin["type"] == "string" and "default" not in stdin and "anyOf" not in stdin
    handle = input_schema(ARGS["browser_open"])["properties"]["handle"]
    assert handle["pattern"] == "^br-[0-9a-f]{12}$" and "default" not in handle

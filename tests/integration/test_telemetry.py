"""OpenTelemetry traces, exported over OTLP/HTTP to a collector on loopback (a real HTTP
server decoding the protobuf request), with GenAI / MCP semantic-convention attributes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from fakeproviders import FakeProvider, Reply
from gateway_harness import running_gateway
from httpsink import Sink


@pytest.fixture
def collector() -> Iterator[Sink]:
    with Sink(status=200) as sink:  # an OTLP/HTTP collector: 200, no partial-success body
        yield sink


def spans(collector: Sink) -> list[Any]:
    """The spans of every export request the collector received (OTLP protobuf)."""
    out: list[Any] = []
    for _, body in collector.posts:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                out.extend(scope.spans)
    return out


def attrs(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = value.string_value or value.int_value
    return out


def test_tool_and_model_calls_become_spans(
    tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None,
    collector: Sink,
) -> None:  # fmt: skip
    with FakeProvider("openai") as fake:
        extra = f"""
telemetry: {{otlp_endpoint: "http://127.0.0.1:{collector.port}", service_name: agentbox-test}}
providers:
  - name: fake
    kind: openai
    base_url: {fake.base_url}
    api_key_env: FAKE_KEY
    models: [fake-model]
"""
        with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwotel"), extra_yaml=extra,
                             env={"FAKE_KEY": "k"}) as gw:  # fmt: skip
            with gw.operator() as op:
                sid = op.post("/v1/sandboxes", json={"memory": "64MiB", "disk": "32MiB",
                                                     "network": "none"}).json()["id"]  # fmt: skip
                try:
                    r = op.post("/v1/tools/fs_stat",
                                json={"arguments": {"path": "/workspace", "sandbox_id": sid}})  # fmt: skip
                    assert r.status_code == 200
                    denied = op.post(f"/v1/sandboxes/{sid}/commands",
                                     json={"command": "curl http://x"})  # fmt: skip
                    assert denied.status_code == 403
                    fake.script(Reply(input_tokens=21, output_tokens=8))
                    r = op.post("/v1/chat/completions", json={
                        "model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
                    assert r.status_code == 200
                finally:
                    op.delete(f"/v1/sandboxes/{sid}")
        # the gateway's shutdown flushed the batch
    received = spans(collector)
    by_name = {s.name: s for s in received}
    tool = attrs(by_name["execute_tool fs_stat"])
    assert tool["gen_ai.operation.name"] == "execute_tool"
    assert tool["gen_ai.tool.name"] == "fs_stat" and tool["mcp.method.name"] == "tools/call"
    assert tool["agentbox.sandbox.id"] == sid
    refused = attrs(by_name["execute_tool terminal_run"])
    assert refused["error.type"] == "policy_denied"
    chat = attrs(by_name["chat fake-model"])
    assert chat["gen_ai.operation.name"] == "chat" and chat["gen_ai.provider.name"] == "fake"
    assert chat["gen_ai.usage.input_tokens"] == 21 and chat["gen_ai.usage.output_tokens"] == 8
    flat = repr([attrs(s) for s in received])
    assert "curl" not in flat and "/workspace" not in flat  # names and numbers only

"""OpenTelemetry traces, only when configured (``telemetry.otlp_endpoint`` or the standard
``OTEL_EXPORTER_OTLP_ENDPOINT``): without it nothing is imported and a span costs a
``nullcontext``.

Spans follow the GenAI semantic conventions: a tool call is ``execute_tool {name}``
(``gen_ai.operation.name=execute_tool``, ``gen_ai.tool.name``; ``mcp.method.name=tools/call``
as in the MCP conventions), a model call is ``chat {model}`` (``gen_ai.operation.name=chat``,
``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens``); failures set ``error.type``. No span
carries a prompt, an answer, a command or a path: attributes are names and numbers.
Exported with OTLP over HTTP (protobuf) in batches.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from agentbox.config.settings import GatewaySettings


class Telemetry:
    def __init__(self, settings: GatewaySettings) -> None:
        endpoint = settings.telemetry.otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        self._tracer: Any = None
        self._provider: Any = None
        if not endpoint:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": settings.telemetry.service_name})
        self._provider = TracerProvider(resource=resource)  # ours, not the global one
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("agentbox")

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @contextlib.contextmanager
    def span(self, name: str, kind: str = "internal", **attributes: Any) -> Iterator[Any]:
        """A span (or None when tracing is off); attributes with None values are left out."""
        if self._tracer is None:
            yield None
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        span_kind = SpanKind.CLIENT if kind == "client" else SpanKind.INTERNAL
        attrs = {k.replace("__", "."): v for k, v in attributes.items() if v is not None}
        with self._tracer.start_as_current_span(
            name, kind=span_kind, attributes=attrs, record_exception=False
        ) as span:
            try:
                yield span
            except Exception as e:
                span.set_attribute("error.type", getattr(e, "code", type(e).__name__))
                span.set_status(Status(StatusCode.ERROR))
                raise

    def tool_span(self, tool: str, sandbox: str | None) -> contextlib.AbstractContextManager[Any]:
        return self.span(
            f"execute_tool {tool}",
            gen_ai__operation__name="execute_tool",
            gen_ai__tool__name=tool,
            mcp__method__name="tools/call",
            agentbox__sandbox__id=sandbox,
        )

    def model_span(self, model: str | None, project: str) -> contextlib.AbstractContextManager[Any]:
        return self.span(
            f"chat {model or 'default'}",
            "client",
            gen_ai__operation__name="chat",
            gen_ai__request__model=model,
            agentbox__project=project,
        )

    def shutdown(self) -> None:
        """Export what is buffered (a graceful stop loses no span)."""
        if self._provider is not None:
            self._provider.shutdown()

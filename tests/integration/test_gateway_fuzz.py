"""The gateway fuzzed against a real instance (with a fake model provider): never a 5xx,
never a traceback or a double answer in the server log.

Two passes: schemathesis over the OpenAPI spec (valid-looking requests to every route),
and a hypothesis pass of hostile input over every route of the spec plus ``/mcp``:
bodies nested past the limit (up to 100k deep), lone surrogates in keys and values,
integers past 64 bits (up to 5,000 digits), 1e999, NaN, Infinity, the 64-bit extremes;
the same numbers in integer query parameters, path parameters and ``Last-Event-ID``.
Both are bounded and deterministic (derandomized, fixed example counts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakeproviders import FakeProvider
from gateway_harness import RunningGateway, ServerLog, running_gateway, server_log_handler

ST = str(Path(sys.executable).parent / "st")
MAX_INT = 2**63 - 1


@pytest.fixture(scope="module")
def server_log() -> Iterator[ServerLog]:
    with server_log_handler() as handler:
        yield handler


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None,
       server_log: ServerLog) -> Iterator[RunningGateway]:  # fmt: skip
    with FakeProvider("openai") as fake:
        extra = f"""
providers:
  - name: fake
    kind: openai
    base_url: {fake.base_url}
    api_key_env: FAKE_OPENAI_KEY
    models: [fake-model]
    prices: {{fake-model: {{input_per_mtok: 1, output_per_mtok: 1}}}}
"""
        with running_gateway(agentbox_home, tmp_path_factory.mktemp("fuzz"), "1s",
                             env={"FAKE_OPENAI_KEY": "k"}, extra_yaml=extra) as running:  # fmt: skip
            yield running


@pytest.fixture(scope="module")
def session(gw: RunningGateway) -> Iterator[tuple[str, str]]:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"disk": "64MiB"}).json()["id"]
        token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
    try:
        yield sid, token
    finally:
        with gw.operator() as op:
            op.delete(f"/v1/sandboxes/{sid}")


@pytest.fixture
def clean_log(server_log: ServerLog) -> Iterator[None]:
    server_log.records.clear()
    yield
    assert not server_log.records, server_log.lines()


def fuzz(gw: RunningGateway, token: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ST, "run", f"{gw.url}/openapi.json", "--checks", "not_a_server_error",
         "--max-examples", "15", "--generation-deterministic", "--request-timeout", "60",
         "-H", f"Authorization: Bearer {token}",
         # an open-ended stream by design (tested in test_gateway_lifecycle.py)
         "--exclude-path", "/v1/events", *extra],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.mark.usefixtures("clean_log")
def test_fuzz_every_route_with_a_session_token(
    gw: RunningGateway, session: tuple[str, str]
) -> None:
    r = fuzz(gw, session[1])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.usefixtures("clean_log")
def test_fuzz_operator_routes(gw: RunningGateway) -> None:
    """As the operator, minus sandbox creation (it would start hundreds of sandboxes)."""
    r = fuzz(gw, gw.operator_token, "--exclude-path", "/v1/sandboxes", "--exclude-method", "POST")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    with gw.operator() as op:
        assert op.get("/healthz").status_code == 200


# Hostile input -------------------------------------------------------------------------
# JSON texts, not Python values: json.dumps can write neither 100k levels nor a literal
# past 4,300 digits, and these are what a hostile client sends.
HOSTILE = st.one_of(
    st.sampled_from([65, 1_000, 100_000]).map(lambda n: "[" * n + "]" * n),
    st.sampled_from([65, 5_000]).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(min_value=19, max_value=5_000).map(lambda n: "9" * n),
    st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "-Infinity", str(-MAX_INT - 2)]),
    st.text(max_size=6).map(lambda t: json.dumps(t)[:-1] + '\\ud800"'),
    st.text(max_size=6).map(lambda t: '"\\udfff' + json.dumps(t)[1:]),
)
IN_RANGE = st.one_of(
    st.sampled_from([str(MAX_INT), str(-MAX_INT - 1), "0", "-1", "1e308", "0.5"]),
    st.sampled_from(['"/workspace"', '"true"', "true", "null", "{}", "[]", '""', '"x"']),
)
VALUE = st.one_of(HOSTILE, IN_RANGE)
NUMBER = st.sampled_from(
    ["9" * 30, "9" * 5_000, str(MAX_INT), str(MAX_INT + 1), "-1", "-" + "9" * 25, "0", "1e999"]
)


def obj(pairs: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"


def key(name: str) -> str:
    return json.dumps(name)


def body_for(properties: list[str]) -> st.SearchStrategy[str]:
    names = st.sampled_from([key(p) for p in properties or ["x"]] + ['"\\ud800"'])
    return st.lists(st.tuples(names, VALUE), max_size=3).map(obj)


@dataclass
class Operation:
    method: str
    path: str
    query: list[tuple[str, bool]]  # (name, integer)
    body: list[str] | None  # its properties, when it takes a JSON body


def operations(spec: dict[str, Any]) -> list[Operation]:
    found = []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            query = []
            for parameter in op.get("parameters", []):
                schema = parameter.get("schema", {})
                types = [schema, *schema.get("anyOf", [])]
                if parameter["in"] == "query":
                    query.append(
                        (parameter["name"], any(t.get("type") == "integer" for t in types))
                    )
            content = op.get("requestBody", {}).get("content", {}).get("application/json")
            body = None
            if content is not None:
                schema = content.get("schema", {})
                if "$ref" in schema:
                    schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
                body = sorted(schema.get("properties", {}))
            found.append(Operation(method.upper(), path, query, body))
    return found


def fill_path(path: str, sandbox: str, number: str) -> str:
    for name, value in (("{sandbox_id}", sandbox), ("{port}", number), ("{path}", "x"),
                        ("{name}", "fs_read")):  # fmt: skip
        path = path.replace(name, value)
    return path.replace("{", "").replace("}", "")  # other ids: unknown, hence not found


TOOL_ARGS = ["path", "command", "env", "cwd", "stdin", "offset", "length", "limit",
             "timeout_ms", "depth", "content", "data", "process_id", "session_id",
             "destination", "count", "old", "new", "url", "max_chars"]  # fmt: skip
TOOLS = ["fs_read", "fs_write", "fs_list", "fs_edit", "terminal_run", "process_read",
         "process_start", "shell_run", "fs_move"]  # fmt: skip


@st.composite
def requests(draw: st.DrawFn, ops: list[Operation], sid: str) -> tuple[str, str, dict[str, Any]]:
    tools = [op for op in ops if op.path == "/v1/tools/{name}"]
    op = draw(st.sampled_from(tools) | st.sampled_from(ops))  # the hottest route: half
    number = draw(NUMBER)
    path = fill_path(op.path, sid, number if draw(st.booleans()) else "8080")
    params: dict[str, str] = {}
    for name, integer in op.query:
        if integer and draw(st.booleans()):
            params[name] = draw(NUMBER)
    if op.path == "/v1/events":
        params["follow"] = "false"  # an open-ended stream otherwise
    headers: dict[str, str] = {"content-type": "application/json"}
    if op.path == "/v1/events" and draw(st.booleans()):
        headers["last-event-id"] = draw(NUMBER)
    kwargs: dict[str, Any] = {"params": params, "headers": headers}
    if op.path == "/v1/tools/{name}":
        path = f"/v1/tools/{draw(st.sampled_from(TOOLS))}"
        kwargs["content"] = obj([('"arguments"', draw(body_for(TOOL_ARGS)))])
    elif op.body is not None or op.method in ("POST", "PUT", "PATCH"):
        kwargs["content"] = draw(body_for(op.body or []))
    return op.method, path, kwargs


@st.composite
def mcp_calls(draw: st.DrawFn) -> str:
    arguments = draw(body_for(TOOL_ARGS))
    params = obj([('"name"', key(draw(st.sampled_from(TOOLS)))), ('"arguments"', arguments)])
    rpc_id = draw(st.sampled_from(["1", str(MAX_INT), "9" * 30, "1e999", '"\\ud800"']))
    return obj([('"jsonrpc"', '"2.0"'), ('"id"', rpc_id), ('"method"', '"tools/call"'),
                ('"params"', params)])  # fmt: skip


HOSTILE_PASS = settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def no_server_error(r: httpx2.Response, what: str) -> None:
    assert r.status_code < 500, f"{what}: {r.status_code} {r.text[:500]}"


@pytest.mark.usefixtures("clean_log")
def test_hostile_input_on_every_route(gw: RunningGateway, session: tuple[str, str]) -> None:
    sid, token = session
    with gw.operator() as op:
        ops = operations(op.get("/openapi.json").json())
    with gw.client(token) as client, gw.operator() as operator:

        @HOSTILE_PASS
        @given(requests(ops, sid), st.booleans())
        def run(request: tuple[str, str, dict[str, Any]], as_operator: bool) -> None:
            method, path, kwargs = request
            # The operator only reads: its writes would create and destroy sandboxes.
            c = operator if as_operator and method == "GET" else client
            no_server_error(c.request(method, path, **kwargs), f"{method} {path} {kwargs}"[:800])

        run()


@pytest.mark.usefixtures("clean_log")
def test_hostile_input_on_mcp(gw: RunningGateway, session: tuple[str, str]) -> None:
    headers = {"content-type": "application/json", "mcp-protocol-version": "2025-11-25",
               "accept": "application/json, text/event-stream"}  # fmt: skip
    with gw.client(session[1], headers=headers) as client:

        @settings(HOSTILE_PASS, max_examples=200)
        @given(mcp_calls())
        def run(body: str) -> None:
            no_server_error(client.post("/mcp", content=body), body[:300])

        run()


# Model endpoint bodies of any shape: what the wire translation must refuse cleanly.
ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=MAX_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "image_url", "tool_use", "tool_result",
                              "thinking", "audio"]) | ANY},
    optional={k: ANY for k in ("text", "source", "image_url", "input", "content", "id",
                               "name", "tool_use_id", "is_error")},
)  # fmt: skip
CALL = st.fixed_dictionaries(
    {"id": ANY, "function": ANY | st.fixed_dictionaries({"name": ANY, "arguments": ANY})}
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | ANY},
    optional={"content": ANY | st.lists(PART, max_size=3),
              "tool_calls": ANY | st.lists(CALL, max_size=2), "tool_call_id": ANY},
)  # fmt: skip
TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "custom", "web_search"]) | ANY},
    optional={"name": ANY, "function": ANY, "input_schema": ANY, "description": ANY},
)
MODEL_BODY = st.fixed_dictionaries(
    {"model": st.just("fake-model") | ANY, "messages": st.lists(MESSAGE, max_size=3) | ANY},
    optional={"max_tokens": ANY, "max_completion_tokens": ANY, "stream": st.booleans() | ANY,
              "tools": st.lists(TOOL, max_size=2) | ANY, "tool_choice": ANY, "stop": ANY,
              "stop_sequences": ANY, "system": ANY, "temperature": ANY, "top_p": ANY,
              "stream_options": ANY, "metadata": ANY},
)  # fmt: skip


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_model_bodies_of_any_shape(gw: RunningGateway, session: tuple[str, str], path: str) -> None:
    with gw.client(session[1]) as client:

        @settings(HOSTILE_PASS, max_examples=300)
        @given(MODEL_BODY)
        def run(body: dict[str, Any]) -> None:
            r = client.post(
                path, content=json.dumps(body), headers={"content-type": "application/json"}
            )
            no_server_error(r, json.dumps(body)[:500])

        run()

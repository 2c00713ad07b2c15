"""The gateway's model endpoint against fake providers on loopback: OpenAI- and
Anthropic-compatible requests (JSON and SSE) answered through the pool, attributed to the
session token's sandbox and project, accounted exactly, failed over, refused once a
budget is spent, and never carrying a planted secret upstream."""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from fakeproviders import FakeProvider, Reply
from gateway_harness import RunningGateway, running_gateway
from httpsink import Sink

SECRET = "sk-planted-0123456789abcdef0123"
# usage.db lives in the home and keeps a day's totals: a run's projects are its own, so a
# second run in the same home starts from zero.
TEAM = f"team-a-{secrets.token_hex(3)}"
TIGHT = f"tight-{secrets.token_hex(3)}"


@pytest.fixture(scope="module")
def fakes() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    with FakeProvider("openai") as primary, FakeProvider("anthropic") as secondary:
        yield primary, secondary


@pytest.fixture(scope="module")
def hook() -> Iterator[Sink]:
    with Sink() as sink:
        yield sink


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None,
       fakes: tuple[FakeProvider, FakeProvider], hook: Sink) -> Iterator[RunningGateway]:  # fmt: skip
    primary, secondary = fakes
    extra = f"""
providers:
  - name: primary
    kind: openai
    base_url: {primary.base_url}
    api_key_env: FAKE_OPENAI_KEY
    models: [fake-model]
    prices: {{fake-model: {{input_per_mtok: 3, output_per_mtok: 15}}}}
  - name: secondary
    kind: anthropic
    base_url: {secondary.base_url}
    api_key_env: FAKE_ANTHROPIC_KEY
    models: [fake-model]
    prices: {{fake-model: {{input_per_mtok: 1, output_per_mtok: 5}}}}
retry: {{max_attempts: 2, base_seconds: 0.01, max_seconds: 0.05, jitter: full}}
budgets:
  - project: {TIGHT}
    tokens_per_day: 100
    alert_at: [0.5]
    alert_webhook_env: AGENTBOX_TEST_BUDGET_HOOK
"""
    env = {"FAKE_OPENAI_KEY": "k1", "FAKE_ANTHROPIC_KEY": "k2",
           "AGENTBOX_TEST_PLANTED_SECRET": SECRET, "AGENTBOX_TEST_BUDGET_HOOK": hook.url + "/alerts"}  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwmodel"), extra_yaml=extra,
                         env=env) as running:  # fmt: skip
        yield running


@pytest.fixture(scope="module")
def session(gw: RunningGateway) -> Iterator[tuple[str, str]]:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"memory": "64MiB", "disk": "32MiB",
                                             "network": "none", "project": TEAM}).json()["id"]  # fmt: skip
        token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
        yield sid, token
        op.delete(f"/v1/sandboxes/{sid}")


def chat(gw: RunningGateway, token: str, **body: Any) -> Any:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **body}
    with gw.client(token) as c:
        return c.post("/v1/chat/completions", json=body)


def test_openai_json_is_answered_and_accounted(
    gw: RunningGateway, session: tuple[str, str], fakes: tuple[FakeProvider, FakeProvider]
) -> None:
    sid, token = session
    fakes[0].script(Reply(text="four", input_tokens=1000, output_tokens=200))
    r = chat(gw, token, messages=[{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": "2+2?"}])  # fmt: skip
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "four"}
    assert data["usage"] == {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
    assert r.headers["X-Agentbox-Provider"] == "primary"
    upstream = fakes[0].requests[-1].json()
    assert upstream["messages"][0] == {"role": "system", "content": "be brief"}
    with gw.operator() as op:
        usage = {u["project"]: u for u in op.get("/v1/usage").json()}
        records = op.get("/v1/audit", params={"decision": "model_call"}).json()
    # 1000 * $3/M + 200 * $15/M = $0.006, attributed to the sandbox's project
    assert usage[TEAM]["usd"] == pytest.approx(0.006, abs=1e-12)
    assert usage[TEAM]["tokens"] >= 1200
    last = records[-1]
    assert last["sandbox"] == sid and last["project"] == TEAM
    assert last["tokens_in"] == 1000 and last["cost_usd"] == pytest.approx(0.006)
    assert "2+2" not in json.dumps(records)  # no prompt in the trail


def test_openai_stream(gw: RunningGateway, session: tuple[str, str],
                       fakes: tuple[FakeProvider, FakeProvider]) -> None:  # fmt: skip
    _, token = session
    fakes[0].script(Reply(text="one two three", input_tokens=5, output_tokens=3))
    body = {"model": "fake-model", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "count"}]}  # fmt: skip
    with gw.client(token) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [x for x in r.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(x[6:]) for x in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "one two three"
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_anthropic_messages_with_x_api_key(
    gw: RunningGateway, session: tuple[str, str], fakes: tuple[FakeProvider, FakeProvider]
) -> None:
    _, token = session
    fakes[0].script(Reply(text="bonjour", input_tokens=4, output_tokens=2))
    body = {"model": "fake-model", "max_tokens": 50, "system": "French only",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}  # fmt: skip
    with gw.client(None, headers={"x-api-key": token}) as c:
        r = c.post("/v1/messages", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["content"] == [{"type": "text", "text": "bonjour"}]
        assert r.json()["usage"] == {"input_tokens": 4, "output_tokens": 2}
        fakes[0].script(Reply(text="un deux"))
        with c.stream("POST", "/v1/messages", json={**body, "stream": True}) as s:
            events = [x[7:] for x in s.iter_lines() if x.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_delta" in events and "message_delta" in events


def test_failover_and_a_planted_secret_never_leaves(
    gw: RunningGateway, session: tuple[str, str], fakes: tuple[FakeProvider, FakeProvider]
) -> None:
    _, token = session
    primary, secondary = fakes
    primary.script(Reply(status=500), Reply(status=500))  # both attempts fail
    secondary.script(Reply(text="from the fallback"))
    r = chat(gw, token, messages=[{"role": "user", "content": f"my key is {SECRET}"}])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "from the fallback"
    assert r.headers["X-Agentbox-Provider"] == "secondary"
    assert SECRET.encode() not in primary.sent_bytes() + secondary.sent_bytes()
    assert b"[REDACTED" in secondary.requests[-1].body
    with gw.operator() as op:
        health = {p["name"]: p for p in op.get("/v1/providers").json()}
        metrics = op.get("/metrics").text
    assert set(health) == {"primary", "secondary"}
    # every failed attempt counted by category, the retried ones too
    line = next(x for x in metrics.splitlines() if x.startswith("agentbox_provider_requests_total")
                and 'provider="primary"' in x and 'outcome="server_error"' in x)  # fmt: skip
    assert float(line.rsplit(" ", 1)[1]) >= 2


def test_all_providers_failing_is_a_clear_503(
    gw: RunningGateway, session: tuple[str, str], fakes: tuple[FakeProvider, FakeProvider]
) -> None:
    _, token = session
    for fake in fakes:  # whichever the health order tries first
        fake.script(Reply(status=400, error="bad field"))
    sent = len(fakes[0].requests) + len(fakes[1].requests)
    r = chat(gw, token)
    assert r.status_code == 400 and "bad field" in r.text
    assert len(fakes[0].requests) + len(fakes[1].requests) == sent + 1  # no retry, no failover
    for fake in fakes:
        fake.next_reply()  # drop the 400 the other one did not use
    fakes[0].script(Reply(status=503), Reply(status=503))
    fakes[1].script(Reply(status=503), Reply(status=503))
    r = chat(gw, token)
    assert r.status_code == 503, r.text
    providers = r.json()["error"]["details"]["providers"]
    assert {p["provider"] for p in providers} == {"primary", "secondary"}


def test_a_spent_budget_refuses_and_alerts(gw: RunningGateway, hook: Sink,
                                          fakes: tuple[FakeProvider, FakeProvider]) -> None:  # fmt: skip
    headers = {"X-Agentbox-Project": TIGHT}
    for fake in fakes:  # whichever provider answers, each call costs 60 tokens
        fake.script(*[Reply(input_tokens=60, output_tokens=0)] * 2)
    with gw.client(gw.operator_token, headers=headers) as c:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        assert c.post("/v1/chat/completions", json=body).status_code == 200  # crosses 100
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded"
        assert int(r.headers["Retry-After"]) >= 1
    with gw.operator() as op:
        alerts = op.get("/v1/audit", params={"decision": "budget_alert"}).json()
    assert any(a.get("project") == TIGHT for a in alerts)
    assert [(b["project"], b["threshold"]) for b in hook.json_bodies()] == [(TIGHT, 0.5)]


# Tool calling and images through the official SDKs, across formats ----------------------
# Last in the module: ``only`` fails one provider on purpose, which moves it down the
# health order the tests above rely on.
LOOKUP = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
OPENAI_TOOLS: Any = [{"type": "function", "function": {
    "name": "lookup", "description": "find a value", "parameters": LOOKUP}}]  # fmt: skip
ANTHROPIC_TOOLS: Any = [{"name": "lookup", "description": "find a value", "input_schema": LOOKUP}]


@pytest.fixture
def only(fakes: tuple[FakeProvider, FakeProvider]) -> Iterator[Any]:
    """``only(kind, *replies)``: the ``kind`` provider answers; the other fails both of
    its attempts if the health order tries it first. Scripts are cleared afterwards."""

    def script(kind: str, *replies: Reply) -> FakeProvider:
        for fake in fakes:
            fake.clear_script()
            fake.script(*(replies if fake.kind == kind else [Reply(status=500)] * 2))
        return next(f for f in fakes if f.kind == kind)

    yield script
    for fake in fakes:
        fake.clear_script()


@pytest.mark.parametrize("provider_kind", ["openai", "anthropic"])
def test_openai_sdk_tool_calls_round_trip(gw: RunningGateway, session: tuple[str, str],
                                          only: Any, provider_kind: str) -> None:  # fmt: skip
    _, token = session
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0)
    only(provider_kind, Reply(text="", tool_call=("lookup", {"q": "x"})))
    first = client.chat.completions.create(
        model="fake-model", tools=OPENAI_TOOLS, messages=[{"role": "user", "content": "find x"}]
    )
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls
    call = message.tool_calls[0]
    assert call.type == "function" and call.function.name == "lookup"
    assert json.loads(call.function.arguments) == {"q": "x"}

    # The result goes back, and the next answer (a call again) is streamed.
    fake = only(provider_kind, Reply(text="Again.", tool_call=("lookup", {"q": "y"})))
    history: Any = [
        {"role": "user", "content": "find x"},
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "x is 42"},
    ]
    text, pieces = "", {}
    for chunk in client.chat.completions.create(
        model="fake-model", tools=OPENAI_TOOLS, messages=history, stream=True
    ):
        delta = chunk.choices[0].delta if chunk.choices else None
        text += (delta.content or "") if delta else ""
        for piece in (delta.tool_calls or []) if delta else []:
            entry = pieces.setdefault(piece.index, {"name": "", "arguments": ""})
            entry["name"] += (piece.function.name or "") if piece.function else ""
            entry["arguments"] += (piece.function.arguments or "") if piece.function else ""
    assert text == "Again."
    assert [(p["name"], json.loads(p["arguments"])) for p in pieces.values()] == [
        ("lookup", {"q": "y"})
    ]
    upstream = fake.requests[-1].json()
    if provider_kind == "openai":
        assert upstream["messages"][-1] == {"role": "tool", "tool_call_id": call.id,
                                            "content": "x is 42"}  # fmt: skip
        assert upstream["tools"][0]["function"]["parameters"] == LOOKUP
    else:  # translated: the result in a user turn, the call as a tool_use block
        assert upstream["messages"][-1] == {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "x is 42"}]}  # fmt: skip
        assert upstream["messages"][-2]["content"] == [
            {"type": "tool_use", "id": call.id, "name": "lookup", "input": {"q": "x"}}]  # fmt: skip
        assert upstream["tools"] == ANTHROPIC_TOOLS


@pytest.mark.parametrize("provider_kind", ["anthropic", "openai"])
def test_anthropic_sdk_tool_use_round_trip(gw: RunningGateway, session: tuple[str, str],
                                           only: Any, provider_kind: str) -> None:  # fmt: skip
    # What Claude Code does: a streamed answer with a tool_use block, then a tool_result.
    _, token = session
    client = anthropic.Anthropic(base_url=gw.url, api_key=token, max_retries=0)
    only(provider_kind, Reply(text="Let me look.", tool_call=("lookup", {"q": "x"})))
    with client.messages.stream(
        model="fake-model", max_tokens=100, tools=ANTHROPIC_TOOLS,
        messages=[{"role": "user", "content": "find x"}],
    ) as stream:  # fmt: skip
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    use = final.content[1]
    assert use.type == "tool_use" and use.name == "lookup" and use.input == {"q": "x"}

    fake = only(provider_kind, Reply(text="x is 42", input_tokens=9, output_tokens=4))
    answer = client.messages.create(
        model="fake-model", max_tokens=100, tools=ANTHROPIC_TOOLS,
        messages=[
            {"role": "user", "content": "find x"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                              for b in final.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id,
                 "content": [{"type": "text", "text": "42"}]},
                {"type": "text", "text": "and so?"}]},
        ],
    )  # fmt: skip
    assert answer.content[0].type == "text" and answer.content[0].text == "x is 42"
    assert answer.stop_reason == "end_turn" and answer.usage.output_tokens == 4
    upstream = fake.requests[-1].json()
    if provider_kind == "anthropic":  # the client's own blocks, as it sent them
        assert upstream["messages"][-1]["content"] == [
            {"type": "tool_result", "tool_use_id": use.id,
             "content": [{"type": "text", "text": "42"}]},
            {"type": "text", "text": "and so?"}]  # fmt: skip
    else:  # translated: the call in the assistant turn, the result as a tool message
        assert upstream["messages"][-3]["tool_calls"][0]["function"]["name"] == "lookup"
        assert upstream["messages"][-2:] == [
            {"role": "tool", "tool_call_id": use.id, "content": "42"},
            {"role": "user", "content": "and so?"}]  # fmt: skip
        assert upstream["tools"] == OPENAI_TOOLS


def test_both_sdks_list_the_models(gw: RunningGateway, session: tuple[str, str]) -> None:
    _, token = session
    listed = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token).models.list()
    assert [(m.id, m.owned_by) for m in listed] == [("fake-model", "primary")]
    page = anthropic.Anthropic(base_url=gw.url, api_key=token).models.list()
    assert [m.id for m in page] == ["fake-model"]
    with gw.client("not-a-token") as c:
        assert c.get("/v1/models").status_code == 401


PNG_B64 = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()


@pytest.mark.parametrize("provider_kind", ["openai", "anthropic"])
def test_a_screenshot_in_a_tool_result_reaches_the_model(
    gw: RunningGateway, session: tuple[str, str], only: Any, provider_kind: str
) -> None:
    # Claude Code after a tool returned a screenshot (the browser tool makes them).
    _, token = session
    client = anthropic.Anthropic(base_url=gw.url, api_key=token, max_retries=0)
    fake = only(provider_kind, Reply(text="a login form"))
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG_B64}}  # fmt: skip
    answer = client.messages.create(
        model="fake-model", max_tokens=100, tools=ANTHROPIC_TOOLS,
        messages=[
            {"role": "user", "content": "what does the page show?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_9", "name": "lookup", "input": {"q": "shot"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9",
                                          "content": [{"type": "text", "text": "screenshot"},
                                                      image]}]},
        ],
    )  # fmt: skip
    assert answer.content[0].type == "text" and answer.content[0].text == "a login form"
    upstream = fake.requests[-1].json()["messages"]
    if provider_kind == "anthropic":
        assert upstream[-1]["content"][0]["content"] == [
            {"type": "text", "text": "screenshot"}, image]  # fmt: skip
    else:
        assert upstream[-2] == {"role": "tool", "tool_call_id": "toolu_9", "content": "screenshot"}
        assert upstream[-1]["content"][1] == {
            "type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}  # fmt: skip


def test_an_openai_image_reaches_an_anthropic_provider(
    gw: RunningGateway, session: tuple[str, str], only: Any
) -> None:
    _, token = session
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0)
    fake = only("anthropic", Reply(text="a cat"))
    answer = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}]}])  # fmt: skip
    assert answer.choices[0].message.content == "a cat"
    assert fake.requests[-1].json()["messages"][-1]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": PNG_B64}}]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "document",
         "source": {"type": "url", "url": "https://example.test/d.pdf"}}]}]},
         "documents must be sent inline"),
        ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "document",
         "source": {"type": "content", "content": [{"type": "image", "source": {
             "type": "url", "url": "https://example.test/p.png?d=secret"}}]}}]}]},
         "images must be sent inline"),
        ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "document",
         "source": {"type": "file", "file_id": "file_1"}}]}]}, "'file' is not supported"),
        ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
         "'input_audio' is not supported"),
        ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "image",
         "source": {"type": "url", "url": "https://example.test/p.png?d=secret"}}]}]},
         "images must be sent inline"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url",
         "image_url": {"url": "https://example.test/p.png"}}]}]}, "images must be sent inline"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
         "tools": [{"type": "function", "function": {"parameters": {}}}]}, "invalid tool"),
        ("/v1/messages", {"messages": [{"role": "user", "content": "x"}],
         "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
         "'web_search_20250305' is not supported"),
    ],
    ids=["document-url", "document-image-url", "document-file", "audio", "anthropic-image-url", "openai-image-url", "tool-without-name",
         "server-tool"],
)  # fmt: skip
def test_unsupported_content_is_a_clear_400(gw: RunningGateway, session: tuple[str, str],
                                            path: str, body: dict[str, Any], says: str
                                            ) -> None:  # fmt: skip
    _, token = session
    with gw.client(None, headers={"x-api-key": token}) as c:
        r = c.post(path, json={"model": "fake-model", "max_tokens": 10, **body})
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_tool_choice_and_stop_cross_formats(gw: RunningGateway, session: tuple[str, str],
                                            only: Any) -> None:  # fmt: skip
    _, token = session
    fake = only("anthropic", Reply(text="ok"))
    openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "x"}], tools=OPENAI_TOOLS,
        tool_choice={"type": "function", "function": {"name": "lookup"}}, stop="END", top_p=0.3)  # fmt: skip
    sent = fake.requests[-1].json()
    assert sent["tool_choice"] == {"type": "tool", "name": "lookup"}
    assert (sent["stop_sequences"], sent["top_p"]) == (["END"], 0.3)

    fake = only("openai", Reply(text="ok"))
    anthropic.Anthropic(base_url=gw.url, api_key=token, max_retries=0).messages.create(
        model="fake-model", max_tokens=10, messages=[{"role": "user", "content": "x"}],
        tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}, stop_sequences=["END", "STOP"])  # fmt: skip
    sent = fake.requests[-1].json()
    assert (sent["tool_choice"], sent["stop"]) == ("required", ["END", "STOP"])


def test_a_client_leaving_a_stream_stops_it_and_is_still_billed(
    gw: RunningGateway, session: tuple[str, str], only: Any
) -> None:
    sid, token = session
    words = " ".join(f"word{i}" for i in range(40))
    fake = only("openai", Reply(text=words, piece_delay=0.2))  # ~8 s to write it all
    body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    with gw.operator() as op:
        before = len(op.get("/v1/audit", params={"decision": "model_call"}).json())
    with gw.client(token) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if '"content": "word0' in line:
                break  # the first word: leave
    deadline = time.monotonic() + 15
    records: list[Any] = []
    with gw.operator() as op:
        while time.monotonic() < deadline and len(records) <= before:
            records = op.get("/v1/audit", params={"decision": "model_call"}).json()
            time.sleep(0.1)
    assert len(records) > before, "the abandoned stream was never accounted"
    last = records[-1]
    assert last["estimated"] is True and last["sandbox"] == sid
    assert 1 <= last["tokens_out"] < len(words) // 4  # what was produced, not the whole answer
    # The gateway closed the provider's stream: its writes failed before the answer's end.
    while time.monotonic() < deadline and not fake.clients_left:
        time.sleep(0.1)
    assert fake.clients_left == 1


@pytest.mark.parametrize("provider_kind", ["openai", "anthropic"])
def test_vendor_fields_travel_within_their_format(gw: RunningGateway, session: tuple[str, str],
                                                  only: Any, provider_kind: str) -> None:  # fmt: skip
    _, token = session
    fake = only(provider_kind, Reply(text="{}"))
    openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "json please"}],
        response_format={"type": "json_object"}, seed=3, n=2)  # fmt: skip
    sent = fake.requests[-1].json()
    if provider_kind == "openai":
        assert (sent["response_format"], sent["seed"]) == ({"type": "json_object"}, 3)
    else:
        assert "response_format" not in sent and "seed" not in sent
    assert "n" not in sent  # several answers, one returned: never asked for

    fake = only(provider_kind, Reply(text="ok"))
    anthropic.Anthropic(base_url=gw.url, api_key=token, max_retries=0).messages.create(
        model="fake-model", max_tokens=2000, messages=[{"role": "user", "content": "x"}],
        metadata={"user_id": "u-1"}, extra_body={"top_k": 5},
        thinking={"type": "enabled", "budget_tokens": 1024})  # fmt: skip
    sent = fake.requests[-1].json()
    if provider_kind == "anthropic":  # the client's body as it is
        assert (sent["metadata"], sent["top_k"]) == ({"user_id": "u-1"}, 5)
        assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    else:  # dropped across formats: its blocks verify only at Anthropic
        assert "metadata" not in sent and "top_k" not in sent and "thinking" not in sent


def test_a_failed_tool_result_keeps_its_flag(gw: RunningGateway, session: tuple[str, str],
                                             only: Any) -> None:  # fmt: skip
    _, token = session
    fake = only("openai", Reply(text="I will try another key"))
    anthropic.Anthropic(base_url=gw.url, api_key=token, max_retries=0).messages.create(
        model="fake-model", max_tokens=50, tools=ANTHROPIC_TOOLS, messages=[
            {"role": "user", "content": "find x"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_e", "name": "lookup", "input": {"q": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_e",
                                          "content": "no such key", "is_error": True}]},
        ])  # fmt: skip
    assert fake.requests[-1].json()["messages"][-1] == {
        "role": "tool", "tool_call_id": "toolu_e", "content": "Error: no such key"}  # fmt: skip

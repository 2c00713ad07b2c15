"""The model provider pool: wire formats, retries, failover, circuits, streaming, outbound
redaction, budgets. Every upstream is a fake on 127.0.0.1 (tests/fakeproviders.py); time
is a fake clock whose sleep records each delay, so no test waits on backoff."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import random
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agentbox.config.settings import (
    BudgetSettings,
    ModelPrice,
    ProviderSettings,
    RetrySettings,
    load_settings,
    parse_settings,
)
from agentbox.errors import (
    AllProvidersFailed,
    BudgetExceeded,
    InvalidConfig,
    InvalidRequest,
    ProviderRejected,
    ProviderStreamBroken,
)
from agentbox.models.providers import (
    BreakerSettings,
    BudgetLedger,
    ChatRequest,
    Image,
    Message,
    ProviderPool,
    StreamEvent,
    Tool,
    ToolCall,
    Usage,
    adapter_for,
)
from agentbox.models.providers.adapter import retry_after_seconds
from agentbox.models.providers.budget import cost_nanousd
from agentbox.policy.redaction import Redactor
from fakeproviders import FakeProvider, Reply, closed_port_url
from httpsink import Sink
from pgkit import StateKit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.example.yaml"
T = TypeVar("T")


class FakeTime:
    """The pool's clock and sleep: sleeping records the delay and moves the clock on."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.delays: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.now += seconds


@pytest.fixture
def openai() -> Iterator[FakeProvider]:
    with FakeProvider("openai") as fake:
        yield fake


@pytest.fixture
def anthropic() -> Iterator[FakeProvider]:
    with FakeProvider("anthropic") as fake:
        yield fake


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


def make_pool(
    *providers: ProviderSettings,
    time: FakeTime,
    retry: RetrySettings | None = None,
    breaker: BreakerSettings | None = None,
    redact: Callable[[str], str] = lambda s: s,
    env: dict[str, str] | None = None,
    seed: int = 7,
) -> ProviderPool:
    return ProviderPool(
        list(providers),
        retry or RetrySettings(max_attempts=3, base_seconds=1, max_seconds=30),
        redact=redact,
        env=env or {},
        breaker=breaker,
        clock=time.clock,
        sleep=time.sleep,
        rng=random.Random(seed),
    )


def run(pool: ProviderPool, scenario: Callable[[ProviderPool], Awaitable[T]]) -> T:
    async def main() -> T:
        async with pool:
            return await scenario(pool)

    return asyncio.run(main())


def ask(text: str = "hi", **fields: Any) -> ChatRequest:
    return ChatRequest(messages=[Message(role="user", content=text)], **fields)


async def collect(pool: ProviderPool, request: ChatRequest) -> list[StreamEvent]:
    return [event async for event in pool.stream(request)]


def text_of(events: list[StreamEvent]) -> str:
    return "".join(e.text for e in events if e.kind == "text")


# Wire formats ---------------------------------------------------------------------------
def test_openai_wire_format_both_ways(openai: FakeProvider, fake_time: FakeTime) -> None:
    openai.script(Reply(tool_call=("lookup", {"q": "x"}), input_tokens=21, output_tokens=4))
    settings = openai.settings("oai", api_key_env="OAI_KEY")
    pool = make_pool(settings, time=fake_time, env={"OAI_KEY": "sk-test-openai"})
    tool = Tool(name="lookup", description="find", parameters={"type": "object"})
    request = ask("find x", system="be brief", max_tokens=50, temperature=0.2, tools=[tool])

    response = run(pool, lambda p: p.complete(request))

    sent = openai.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test-openai"
    assert sent.json() == {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "find x"},
        ],
        "max_tokens": 50,
        "temperature": 0.2,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "find",
                    "parameters": {"type": "object"},
                },
            }
        ],
    }
    assert response.provider == "oai" and response.model == "fake-model"
    assert response.usage == Usage(21, 4)
    assert response.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("lookup", {"q": "x"})
    ]
    assert response.raw["id"] == "chatcmpl-fake"


def test_anthropic_wire_format_both_ways(anthropic: FakeProvider, fake_time: FakeTime) -> None:
    anthropic.script(Reply(text="Sure.", tool_call=("lookup", {"q": "y"})))
    settings = anthropic.settings("claude", api_key_env="ANT_KEY")
    pool = make_pool(settings, time=fake_time, env={"ANT_KEY": "sk-ant-test"})
    tool = Tool(name="lookup", parameters={"type": "object", "properties": {}})
    request = ask("find y", system="be brief", max_tokens=64, temperature=1.5, tools=[tool])

    response = run(pool, lambda p: p.complete(request))

    sent = anthropic.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.json() == {
        "model": "fake-model",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "find y"}],
        "system": "be brief",
        "temperature": 1.0,  # Anthropic's maximum
        "tools": [
            {
                "name": "lookup",
                "description": "",
                "input_schema": {"type": "object", "properties": {}},
            }
        ],
    }
    assert response.text == "Sure." and response.provider == "claude"
    assert response.usage == Usage(11, 7)
    assert response.finish_reason == "tool_calls"  # tool_use, in the one vocabulary
    assert [(c.id, c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("toolu_1", "lookup", {"q": "y"})
    ]


def test_default_base_urls_and_bad_ones() -> None:
    async def urls() -> list[str]:
        adapters = [
            adapter_for(ProviderSettings(name="a", kind="openai"), {}),
            adapter_for(ProviderSettings(name="b", kind="anthropic"), {}),
        ]
        for adapter in adapters:
            await adapter.aclose()
        return [a.url() for a in adapters]

    assert asyncio.run(urls()) == [
        "https://api.openai.com/v1/chat/completions",
        "https://api.anthropic.com/v1/messages",
    ]
    with pytest.raises(InvalidConfig, match="not an http"):
        adapter_for(ProviderSettings(name="c", kind="openai", base_url="ftp://x"), {})
    with pytest.raises(InvalidConfig, match="no model providers"):
        ProviderPool([], redact=str)


def test_the_environment_proxy_is_honoured_and_no_proxy_bypasses_it(
    openai: FakeProvider, fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake plays the proxy: it sees the absolute-form request line a proxy gets.
    monkeypatch.setenv("HTTP_PROXY", openai.base_url.rsplit("/", 1)[0])
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    nobody = closed_port_url()  # reached only through the proxy
    elsewhere = ProviderSettings(name="p", kind="openai", base_url=f"{nobody}/v1",
                                 models=["fake-model"])  # fmt: skip
    with pytest.raises(ProviderRejected):  # the "proxy" answers 404: no such route
        run(make_pool(elsewhere, time=fake_time), lambda p: p.complete(ask()))
    assert openai.requests[-1].path == f"{nobody}/v1/chat/completions"

    # NO_PROXY: straight to the provider, while the proxy variable names a dead port.
    monkeypatch.setenv("HTTP_PROXY", closed_port_url())
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    direct = run(make_pool(openai.settings("d"), time=fake_time), lambda p: p.complete(ask()))
    assert direct.provider == "d" and openai.requests[-1].path == "/v1/chat/completions"


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    """A provider that redirects elsewhere, or streams what is not SSE, or one huge event."""

    answer: tuple[int, dict[str, str], bytes] = (200, {}, b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status, headers, body = self.answer
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("answer", "stream", "category"),
    [
        ((307, {"Location": "SINK/v1/chat/completions"}, b""), False, "malformed"),
        ((200, {"Content-Type": "application/json"}, b"{}"), True, "malformed"),
        ((200, {"Content-Type": "text/event-stream"}, b"data: " + b"x" * (2 << 20)), True,
         "malformed"),
        ((200, {"Content-Type": "application/json"}, json.dumps({"choices": [{"message": {
            "role": "assistant", "content": "y" * (33 << 20)}, "finish_reason": "stop"}]}).encode()),
         False, "malformed"),  # a valid answer, only too big
    ],
    ids=["redirect-not-followed", "stream-not-sse", "sse-event-over-1-MiB", "answer-over-32-MiB"],
)  # fmt: skip
def test_a_provider_misbehaving_is_refused_and_its_key_goes_nowhere_else(
    answer: tuple[int, dict[str, str], bytes], stream: bool, category: str, fake_time: FakeTime
) -> None:
    with Sink(status=200) as sink:
        status, headers, body = answer
        headers = {k: v.replace("SINK", sink.url) for k, v in headers.items()}
        handler = type("H", (_Misbehaving,), {"answer": (status, headers, body)})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            settings = ProviderSettings(name="odd", kind="openai", api_key_env="K",
                                        base_url=f"http://127.0.0.1:{server.server_port}/v1",
                                        models=["fake-model"])  # fmt: skip
            pool = make_pool(settings, time=fake_time, env={"K": "sk-must-stay"},
                             retry=RetrySettings(max_attempts=1))  # fmt: skip

            async def call(p: ProviderPool) -> Any:
                if stream:
                    return [e async for e in p.stream(ask(stream=True))]
                return await p.complete(ask())

            with pytest.raises(AllProvidersFailed) as err:
                run(pool, call)
        finally:
            server.shutdown()
            server.server_close()
    assert [a["category"] for a in err.value.details["providers"]] == [category]
    assert sink.posts == []  # the redirect was not followed: the key stayed


def test_routing_by_model(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    pool = make_pool(
        openai.settings("oai", models=["gpt-x"]),
        anthropic.settings("claude", models=["claude-x", "claude-y"]),
        time=fake_time,
    )

    async def scenario(pool: ProviderPool) -> None:
        assert (await pool.complete(ask(model="claude-y"))).provider == "claude"
        assert (await pool.complete(ask())).provider == "oai"  # the first default
        with pytest.raises(InvalidRequest, match="no configured provider serves model 'nope'"):
            await pool.complete(ask(model="nope"))

    run(pool, scenario)
    assert [r.json()["model"] for r in anthropic.requests] == ["claude-y"]
    assert [r.json()["model"] for r in openai.requests] == ["gpt-x"]


def test_an_alias_is_served_under_the_providers_own_model_name(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    # Codex keeps its GPT model name; the operator maps it to a model a provider has.
    pool = make_pool(
        openai.settings("oai", models=["gpt-x"]),
        anthropic.settings("claude", models=["claude-x"], aliases={"gpt-5.5": "claude-x"}),
        time=fake_time,
    )

    async def scenario(pool: ProviderPool) -> None:
        assert (await pool.complete(ask(model="gpt-5.5"))).provider == "claude"
        assert (await pool.complete(ask(model="gpt-x"))).provider == "oai"

    run(pool, scenario)
    assert [r.json()["model"] for r in anthropic.requests] == ["claude-x"]


# Retries and failover -------------------------------------------------------------------
def test_failover_order_follows_health_then_configuration(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    with FakeProvider("openai") as third:
        openai.script(*[Reply(status=500)] * 3)
        pool = make_pool(
            openai.settings("first"),
            anthropic.settings("second"),
            third.settings("third"),
            time=fake_time,
        )

        async def scenario(pool: ProviderPool) -> list[str]:
            answered = [(await pool.complete(ask())).provider]  # first fails 3 times
            answered.append((await pool.complete(ask())).provider)  # first is now sickest
            fake_time.now += 200  # its fail score decays below the healthy mark
            answered.append((await pool.complete(ask())).provider)
            return answered

        assert run(pool, scenario) == ["second", "second", "first"]
        assert len(openai.requests) == 4 and len(anthropic.requests) == 2
        assert third.requests == []
        assert len(fake_time.delays) == 2  # between the three attempts on "first"


def test_retry_delays_use_full_jitter_within_the_cap(openai: FakeProvider) -> None:
    retry = RetrySettings(max_attempts=5, base_seconds=1, max_seconds=4, jitter="full")
    caps = [1, 2, 4, 4]  # min(max_seconds, base * 2**n)
    seen: list[float] = []
    for seed in range(5):
        time = FakeTime()
        openai.script(*[Reply(status=503)] * 4)
        pool = make_pool(openai.settings("p"), time=time, retry=retry, seed=seed)
        assert run(pool, lambda p: p.complete(ask())).text
        assert len(time.delays) == 4
        for delay, cap in zip(time.delays, caps, strict=True):
            assert 0 <= delay <= cap
        seen += time.delays
    assert len(set(seen)) == len(seen)  # jittered, not the fixed schedule

    time = FakeTime()
    openai.script(*[Reply(status=503)] * 4)
    pool = make_pool(
        openai.settings("p"), time=time, retry=retry.model_copy(update={"jitter": "none"})
    )
    run(pool, lambda p: p.complete(ask()))
    assert time.delays == caps


def test_retry_after_is_never_undercut(openai: FakeProvider, fake_time: FakeTime) -> None:
    openai.script(Reply(status=429, retry_after="3"), Reply(status=503, retry_after="2"))
    retry = RetrySettings(max_attempts=3, base_seconds=0.1, max_seconds=30)
    pool = make_pool(openai.settings("p"), time=fake_time, retry=retry)

    assert run(pool, lambda p: p.complete(ask())).provider == "p"
    first, second = fake_time.delays
    assert 3 <= first <= 30 and 2 <= second <= 30
    assert len(openai.requests) == 3


def test_a_long_retry_after_fails_over_and_keeps_the_provider_aside(
    openai: FakeProvider, fake_time: FakeTime
) -> None:
    openai.script(Reply(status=429, retry_after="120", error="slow down"))
    pool = make_pool(openai.settings("p"), time=fake_time)  # max_seconds 30 < 120

    async def scenario(pool: ProviderPool) -> None:
        with pytest.raises(AllProvidersFailed) as first:
            await pool.complete(ask())
        assert first.value.details["retry_after"] == 120
        assert first.value.details["providers"][0]["category"] == "rate_limited"
        fake_time.now += 60
        with pytest.raises(AllProvidersFailed, match="asked to wait 60 more s"):
            await pool.complete(ask())
        fake_time.now += 60
        assert (await pool.complete(ask())).provider == "p"

    run(pool, scenario)
    assert fake_time.delays == []  # nobody slept: the next provider (none here) was asked
    assert len(openai.requests) == 2  # none while it had asked to be left alone


def test_retry_after_header_forms() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds("1.5") == 1.5
    later = datetime.fromtimestamp(datetime.now(UTC).timestamp() + 100, UTC)
    from_date = retry_after_seconds(later.strftime("%a, %d %b %Y %H:%M:%S GMT"))
    assert from_date is not None and 95 <= from_date <= 100
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    for junk in (None, "", "soon", "inf", "nan"):
        assert retry_after_seconds(junk) is None


def test_auth_failure_demotes_at_once(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    openai.script(Reply(status=401, error="invalid api key"))
    pool = make_pool(openai.settings("first"), anthropic.settings("second"), time=fake_time)

    async def scenario(pool: ProviderPool) -> None:
        assert (await pool.complete(ask())).provider == "second"
        assert (await pool.complete(ask())).provider == "second"
        first = pool.health()[0]
        assert first["state"] == "open" and first["last_error"] == "auth"
        assert first["last_status"] == 401 and first["fail_score"] >= 100
        fake_time.now += 3600  # the auth cooldown: one probe (the key may have been rotated)
        assert (await pool.complete(ask())).provider == "first"
        assert pool.health()[0]["state"] == "closed"

    run(pool, scenario)
    assert len(openai.requests) == 2  # the 401 (not retried), then the probe an hour later
    assert fake_time.delays == []


def test_missing_key_fails_as_auth_without_a_request(
    openai: FakeProvider, fake_time: FakeTime
) -> None:
    pool = make_pool(openai.settings("p", api_key_env="UNSET_PROVIDER_KEY"), time=fake_time)
    with pytest.raises(AllProvidersFailed, match="UNSET_PROVIDER_KEY is not set") as err:
        run(pool, lambda p: p.complete(ask()))
    assert err.value.details["providers"][0]["category"] == "auth"
    assert openai.requests == []


def test_the_chain_ends_in_a_keyless_local_model(
    anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    # The example config's chain: a cloud vendor, a second one, then a local server
    # (Ollama, vLLM, llama.cpp: OpenAI-compatible, no key) that takes over when both fail.
    with FakeProvider("openai") as cloud, FakeProvider("openai") as local:
        anthropic.script(Reply(status=429, retry_after="3600"))  # longer than max_seconds
        cloud.script(Reply(status=401, error="key revoked"))
        pool = make_pool(
            anthropic.settings("primary", api_key_env="A_KEY"),
            cloud.settings("secondary", api_key_env="O_KEY"),
            local.settings("local"),
            time=fake_time,
            env={"A_KEY": "sk-ant-a", "O_KEY": "sk-o"},
        )
        answer = run(pool, lambda p: p.complete(ask()))
    assert answer.provider == "local"
    assert [len(anthropic.requests), len(cloud.requests), len(local.requests)] == [1, 1, 1]
    assert "authorization" not in local.requests[0].headers  # no key leaves for it
    assert fake_time.delays == []  # neither failure was worth waiting for


def test_bad_request_is_raised_at_once_not_retried(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    openai.script(Reply(status=400, error="max_tokens is too large"))
    pool = make_pool(openai.settings("first"), anthropic.settings("second"), time=fake_time)
    with pytest.raises(ProviderRejected, match="max_tokens is too large") as err:
        run(pool, lambda p: p.complete(ask()))
    assert err.value.http_status == 400 and err.value.details["status"] == 400
    assert len(openai.requests) == 1 and anthropic.requests == []
    assert fake_time.delays == []


def test_all_providers_failed_lists_each_answer(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    with FakeProvider("openai") as garbled:
        openai.script(*[Reply(status=500, error="upstream exploded")] * 2)
        anthropic.script(Reply(status=403, error="key revoked"))
        garbled.script(*[Reply(malformed=True)] * 2)
        pool = make_pool(
            openai.settings("flaky"),
            anthropic.settings("revoked"),
            ProviderSettings(name="down", kind="openai", base_url=closed_port_url(), models=["m"]),
            garbled.settings("garbled"),
            time=fake_time,
            retry=RetrySettings(max_attempts=2, base_seconds=0.5, max_seconds=1),
        )
        with pytest.raises(AllProvidersFailed) as err:
            run(pool, lambda p: p.complete(ask()))

    answers = {a["provider"]: a for a in err.value.details["providers"]}
    assert {n: (a["status"], a["category"], a["attempts"]) for n, a in answers.items()} == {
        "flaky": (500, "server_error", 2),
        "revoked": (403, "auth", 1),
        "down": (None, "connection", 2),
        "garbled": (None, "malformed", 2),
    }
    message = err.value.message
    for expected in (
        "flaky: HTTP 500: upstream exploded",
        "revoked: HTTP 403: key revoked",
        "down: ClientConnectorError: Cannot connect to host",
        "garbled: the answer does not follow",
    ):
        assert expected in message
    assert err.value.http_status == 503 and err.value.code == "all_providers_failed"


def test_a_timeout_is_classified_and_fails_over(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    anthropic.script(Reply(delay=30))  # released when the fake stops
    pool = make_pool(
        anthropic.settings("slow", timeout_seconds=0.3),
        openai.settings("fast"),
        time=fake_time,
        retry=RetrySettings(max_attempts=1),
    )
    assert run(pool, lambda p: p.complete(ask())).provider == "fast"
    assert pool.health()[0]["last_error"] == "timeout"


# Circuit breaker -------------------------------------------------------------------------
def test_circuit_opens_then_half_open_probe_then_closes(
    openai: FakeProvider, fake_time: FakeTime
) -> None:
    openai.script(*[Reply(status=500)] * 3)
    breaker = BreakerSettings(failures=2, cooldown_seconds=30)
    pool = make_pool(
        openai.settings("p"), time=fake_time, breaker=breaker, retry=RetrySettings(max_attempts=1)
    )

    async def scenario(pool: ProviderPool) -> list[str]:
        states = []
        for _ in range(2):
            with pytest.raises(AllProvidersFailed):
                await pool.complete(ask())
            states.append(pool.health()[0]["state"])
        with pytest.raises(AllProvidersFailed, match="circuit open for 30 more s"):
            await pool.complete(ask())  # not sent
        fake_time.now += 30
        states.append(pool.health()[0]["state"])
        with pytest.raises(AllProvidersFailed):
            await pool.complete(ask())  # the probe fails: open again
        states.append(pool.health()[0]["state"])
        fake_time.now += 30
        assert (await pool.complete(ask())).provider == "p"  # this probe succeeds
        states.append(pool.health()[0]["state"])
        return states

    assert run(pool, scenario) == ["closed", "open", "half_open", "open", "closed"]
    assert len(openai.requests) == 4
    health = pool.health()[0]
    assert health["consecutive_failures"] == 0 and health["last_error"] == "server_error"
    assert set(health) >= {"name", "state", "fail_score", "last_error"}


def test_half_open_lets_exactly_one_probe_through(
    openai: FakeProvider, fake_time: FakeTime
) -> None:
    openai.script(Reply(status=500))
    breaker = BreakerSettings(failures=1, cooldown_seconds=10)
    pool = make_pool(
        openai.settings("p"), time=fake_time, breaker=breaker, retry=RetrySettings(max_attempts=1)
    )

    async def scenario(pool: ProviderPool) -> list[Any]:
        with pytest.raises(AllProvidersFailed):
            await pool.complete(ask())
        fake_time.now += 10
        return await asyncio.gather(
            pool.complete(ask()), pool.complete(ask()), return_exceptions=True
        )

    probe, other = run(pool, scenario)
    assert probe.provider == "p"
    assert isinstance(other, AllProvidersFailed) and "probe call is in flight" in other.message
    assert len(openai.requests) == 2


# Streaming -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_streaming_in_both_formats(kind: Any, fake_time: FakeTime) -> None:
    with FakeProvider(kind) as fake:
        fake.script(Reply(text="one two three", input_tokens=30, output_tokens=3))
        pool = make_pool(fake.settings("p", api_key_env="K"), time=fake_time, env={"K": "key"})
        events = run(pool, lambda p: collect(p, ask(stream=True)))

    assert [e.text for e in events if e.kind == "text"] == ["one ", "two ", "three"]
    done = events[-1]
    assert done.kind == "done" and [e.kind for e in events].count("done") == 1
    assert (done.usage, done.provider, done.model, done.finish_reason) == (
        Usage(30, 3),
        "p",
        "fake-model",
        "stop",
    )
    body = fake.requests[0].json()
    assert body["stream"] is True
    if kind == "openai":
        assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_streams_reuse_their_connection(kind: Any, fake_time: FakeTime) -> None:
    """A stream read to its end hands the connection back: the next request (stream or
    not) does not pay a new TCP (or, against a real API, TLS) handshake."""
    with FakeProvider(kind) as fake:
        pool = make_pool(fake.settings("p", api_key_env="K"), time=fake_time, env={"K": "key"})

        async def three(p: ProviderPool) -> None:
            for stream in (True, True, False):
                if stream:
                    await collect(p, ask(stream=True))
                else:
                    await p.complete(ask())

        run(pool, three)
    assert len({r.client_port for r in fake.requests}) == 1, [r.client_port for r in fake.requests]


@pytest.mark.parametrize(("first", "second"), [("openai", "anthropic"), ("anthropic", "openai")])
def test_a_stream_cut_before_its_first_token_fails_over(
    first: Any, second: Any, fake_time: FakeTime
) -> None:
    with FakeProvider(first) as broken, FakeProvider(second) as good:
        broken.script(Reply(cut_after=0), Reply(malformed=True))
        good.script(Reply(text="from the second"))
        pool = make_pool(
            broken.settings("broken"),
            good.settings("good"),
            time=fake_time,
            retry=RetrySettings(max_attempts=2, base_seconds=0, max_seconds=0),
        )
        events = run(pool, lambda p: collect(p, ask()))

    assert text_of(events) == "from the second" and events[-1].provider == "good"
    assert len(broken.requests) == 2
    assert pool.health()[0]["last_error"] == "malformed"  # the second attempt's answer


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "script", [Reply(text="a b c d", cut_after=2), Reply(text="a b", end_early=True)]
)
def test_a_stream_cut_after_its_first_token_is_not_replayed(
    kind: Any, script: Reply, fake_time: FakeTime
) -> None:
    with FakeProvider(kind) as broken, FakeProvider("openai") as spare:
        broken.script(script)
        pool = make_pool(broken.settings("broken"), spare.settings("spare"), time=fake_time)
        received: list[StreamEvent] = []

        async def scenario(pool: ProviderPool) -> None:
            with pytest.raises(ProviderStreamBroken) as err:
                async for event in pool.stream(ask()):
                    received.append(event)
            assert err.value.details["provider"] == "broken"
            assert err.value.details["category"] == "connection"
            assert "retry the whole request" in err.value.message

        run(pool, scenario)

    assert text_of(received) == ("a b " if script.cut_after else "a b")
    assert all(e.kind == "text" for e in received)
    assert len(broken.requests) == 1 and spare.requests == []
    assert pool.health()[0]["consecutive_failures"] == 1


def test_a_stream_cut_after_a_tool_call_is_not_replayed(fake_time: FakeTime) -> None:
    # Anthropic sends a call at its block's end, before message_stop: a cut after it must
    # not make the pool ask again (the client would get the call twice and run it twice).
    with FakeProvider("anthropic") as broken, FakeProvider("openai") as spare:
        broken.script(Reply(text="", tool_call=("lookup", {"q": "x"}), end_early=True))
        pool = make_pool(broken.settings("broken"), spare.settings("spare"), time=fake_time)
        received: list[StreamEvent] = []

        async def scenario(pool: ProviderPool) -> None:
            with pytest.raises(ProviderStreamBroken):
                async for event in pool.stream(ask(tools=[Tool(name="lookup")])):
                    received.append(event)

        run(pool, scenario)
    assert [e.kind for e in received] == ["tool_call"]
    assert len(broken.requests) == 1 and spare.requests == []


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_streamed_tool_call_is_gathered_from_its_pieces(kind: Any, fake_time: FakeTime) -> None:
    with FakeProvider(kind) as fake:
        fake.script(Reply(text="Looking.", tool_call=("lookup", {"q": "x", "n": 2})))
        pool = make_pool(fake.settings("p"), time=fake_time)
        tool = Tool(name="lookup", parameters={"type": "object"})
        events = run(pool, lambda p: collect(p, ask(stream=True, tools=[tool])))
        sent_tools = fake.requests[0].json()["tools"]

    assert [e.kind for e in events] == ["text", "tool_call", "done"]
    call = events[1].tool_call
    assert call is not None and call.name == "lookup"
    assert json.loads(call.arguments) == {"q": "x", "n": 2}  # the pieces, joined
    assert call.id == ("call_1" if kind == "openai" else "toolu_1")
    assert events[-1].finish_reason == "tool_calls"  # one vocabulary for both
    assert len(sent_tools) == 1


TOOL_HISTORY = [
    Message(role="user", content="find x"),
    Message(role="assistant", content="Looking.",
            tool_calls=(ToolCall("call_9", "lookup", '{"q": "x"}'),)),
    Message(role="tool", tool_call_id="call_9", content="x is 42"),
    Message(role="user", content="thanks; and y?"),
]  # fmt: skip


def test_a_tool_history_in_openai_words(openai: FakeProvider, fake_time: FakeTime) -> None:
    run(make_pool(openai.settings("p"), time=fake_time),
        lambda p: p.complete(ChatRequest(messages=TOOL_HISTORY)))  # fmt: skip
    assert openai.requests[0].json()["messages"] == [
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "x is 42"},
        {"role": "user", "content": "thanks; and y?"},
    ]  # fmt: skip


def test_a_tool_history_in_anthropic_words(anthropic: FakeProvider, fake_time: FakeTime) -> None:
    run(make_pool(anthropic.settings("p"), time=fake_time),
        lambda p: p.complete(ChatRequest(messages=TOOL_HISTORY)))  # fmt: skip
    # Results travel in a user turn, merged with the user's text that follows.
    assert anthropic.requests[0].json()["messages"] == [
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "call_9", "name": "lookup", "input": {"q": "x"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_9", "content": "x is 42"},
            {"type": "text", "text": "thanks; and y?"}]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "choice", "wire"),
    [
        ("openai", "required", "required"),
        ("openai", "lookup", {"type": "function", "function": {"name": "lookup"}}),
        ("anthropic", "required", {"type": "any"}),
        ("anthropic", "lookup", {"type": "tool", "name": "lookup"}),
    ],
)
def test_stop_top_p_and_tool_choice_in_each_format(
    kind: Any, choice: str, wire: Any, fake_time: FakeTime
) -> None:
    request = ask(top_p=0.5, stop=["END"], tools=[Tool(name="lookup")], tool_choice=choice)
    with FakeProvider(kind) as fake:
        run(make_pool(fake.settings("p"), time=fake_time), lambda p: p.complete(request))
        body = fake.requests[0].json()
    assert body["top_p"] == 0.5 and body["tool_choice"] == wire
    assert body["stop" if kind == "openai" else "stop_sequences"] == ["END"]


def test_other_fields_reach_a_provider_of_the_same_format_only(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    secret = "planted-literal-secret-in-metadata"
    extra = {"response_format": {"type": "json_object"}, "seed": 7,
             "metadata": {"note": f"key {secret}", secret: 1}, "max_tokens": 99999}  # fmt: skip
    request = ask(max_tokens=50, extra=extra, extra_kind="openai")
    redact = Redactor({"K": secret}).redact
    run(make_pool(openai.settings("o"), time=fake_time, redact=redact),
        lambda p: p.complete(request))  # fmt: skip
    run(make_pool(anthropic.settings("a"), time=fake_time, redact=redact),
        lambda p: p.complete(request))  # fmt: skip
    sent = openai.requests[0].json()
    assert sent["response_format"] == {"type": "json_object"} and sent["seed"] == 7
    assert sent["metadata"] == {"note": "key [REDACTED:K]", "[REDACTED:K]": 1}  # keys too
    assert sent["max_tokens"] == 50  # what the neutral request says wins
    other = anthropic.requests[0].json()
    assert not {"response_format", "seed", "metadata"} & set(other)  # never translated


def test_anthropic_gets_temperature_or_top_p_not_both(
    anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    run(make_pool(anthropic.settings("p"), time=fake_time),
        lambda p: p.complete(ask(temperature=0.5, top_p=0.9)))  # fmt: skip
    sent = anthropic.requests[0].json()
    assert sent["temperature"] == 0.5 and "top_p" not in sent


def test_openai_tool_calls_without_an_index_stay_apart(fake_time: FakeTime) -> None:
    # Some compatible servers send each whole call in one chunk, with no index.
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return f"data: {json.dumps({'model': 'm', 'choices': [choice]})}\n\n"

    calls = [
        {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"q": i})},
        }
        for i in (1, 2)
    ]
    body = "".join([*(chunk({"tool_calls": [c]}) for c in calls), chunk({}, "tool_calls"),
                    "data: [DONE]\n\n"]).encode()  # fmt: skip
    handler = type("H", (_Misbehaving,), {"answer": (200, {"Content-Type": "text/event-stream"},
                                                     body)})  # fmt: skip
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = ProviderSettings(name="p", kind="openai", models=["m"],
                                    base_url=f"http://127.0.0.1:{server.server_port}/v1")  # fmt: skip
        events = run(make_pool(settings, time=fake_time), lambda p: collect(p, ask(stream=True)))
    finally:
        server.shutdown()
        server.server_close()
    got = [(e.tool_call.id, json.loads(e.tool_call.arguments)) for e in events if e.tool_call]
    assert got == [("c1", {"q": 1}), ("c2", {"q": 2})]


def test_a_failed_tool_result_says_so_in_both_formats(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    history = [*TOOL_HISTORY[:2],
               Message(role="tool", tool_call_id="call_9", content="no such key", is_error=True)]  # fmt: skip
    for fake in (openai, anthropic):
        run(make_pool(fake.settings("p"), time=fake_time),
            lambda p: p.complete(ChatRequest(messages=history)))  # fmt: skip
    assert openai.requests[0].json()["messages"][-1]["content"] == "Error: no such key"
    assert anthropic.requests[0].json()["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_9", "content": "no such key",
         "is_error": True}]  # fmt: skip


PNG = Image(media_type="image/png", data="iVBORw0KGgo=")
IMAGE_HISTORY = [
    Message(role="user", content="what is on screen?", images=(PNG,)),
    Message(role="assistant", tool_calls=(ToolCall("c1", "shot", "{}"), ToolCall("c2", "ls", "{}"))),
    Message(role="tool", tool_call_id="c1", content="a screenshot", images=(PNG,)),
    Message(role="tool", tool_call_id="c2", content="a.txt"),
]  # fmt: skip


def test_images_in_openai_words(openai: FakeProvider, fake_time: FakeTime) -> None:
    run(make_pool(openai.settings("p"), time=fake_time),
        lambda p: p.complete(ChatRequest(messages=IMAGE_HISTORY)))  # fmt: skip
    url = "data:image/png;base64,iVBORw0KGgo="
    messages = openai.requests[0].json()["messages"]
    assert messages[0] == {"role": "user", "content": [
        {"type": "text", "text": "what is on screen?"},
        {"type": "image_url", "image_url": {"url": url}}]}  # fmt: skip
    # Tool turns hold no images, and both results must follow the call: the image comes
    # after them, in a user turn.
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user"]
    assert messages[2]["content"] == "a screenshot"
    assert messages[4]["content"] == [
        {"type": "text", "text": "Images of the result of c1:"},
        {"type": "image_url", "image_url": {"url": url}}]  # fmt: skip


def test_images_in_anthropic_words(anthropic: FakeProvider, fake_time: FakeTime) -> None:
    run(make_pool(anthropic.settings("p"), time=fake_time),
        lambda p: p.complete(ChatRequest(messages=IMAGE_HISTORY)))  # fmt: skip
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}  # fmt: skip
    messages = anthropic.requests[0].json()["messages"]
    assert messages[0]["content"] == [{"type": "text", "text": "what is on screen?"}, image]
    assert messages[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "c1",
         "content": [{"type": "text", "text": "a screenshot"}, image]},
        {"type": "tool_result", "tool_use_id": "c2", "content": "a.txt"}]}  # fmt: skip


# Outbound redaction ----------------------------------------------------------------------
def test_a_planted_secret_never_reaches_the_upstream(
    openai: FakeProvider, anthropic: FakeProvider, fake_time: FakeTime
) -> None:
    literal = "planted-literal-secret-9f8e7d"
    github = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    redactor = Redactor({"OPENAI_API_KEY": literal})
    request = ChatRequest(
        system=f"the key is {literal}",
        messages=[
            Message(role="user", content=f"use {github} please"),
            Message(role="assistant", content=f"ok, {literal}"),
            Message(role="user", content="go"),
            Message(
                role="assistant",
                tool_calls=(ToolCall("c1", "run", json.dumps({"cmd": f"login {literal}"})),),
            ),
            Message(role="tool", tool_call_id="c1", content=f"token: {github}"),
        ],
    )
    pool = make_pool(
        openai.settings("oai"),
        anthropic.settings("claude"),
        time=fake_time,
        redact=redactor.redact,
    )

    async def scenario(pool: ProviderPool) -> list[str]:
        served = [(await collect(pool, request))[-1].provider or ""]
        served.append((await pool.complete(request)).provider)
        openai.script(*[Reply(status=500)] * 3)  # the rest goes to the other format
        served.append((await pool.complete(request)).provider)
        served.append((await collect(pool, request))[-1].provider or "")
        return served

    assert run(pool, scenario) == ["oai", "oai", "claude", "claude"]
    for fake in (openai, anthropic):
        sent = fake.sent_bytes()
        assert literal.encode() not in sent and github.encode() not in sent
        assert sent.count(b"[REDACTED:OPENAI_API_KEY]") == 3 * len(fake.requests)
        assert sent.count(b"[REDACTED:github-token]") == 2 * len(fake.requests)
    assert literal in request.system  # the caller's request itself is left alone


def test_a_native_body_is_redacted_but_for_its_opaque_fields() -> None:
    # Only the base64 data, the signature and a redacted_thinking block's data are left
    # alone; any other field of those blocks (or a lookalike in a tool's input) is text.
    literal = "planted-literal-secret-9f8e7d"
    redact = Redactor({"K": literal}).redact
    native = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0K" + literal}},
        {"type": "thinking", "thinking": f"think {literal}", "signature": "sig/" + literal},
        {"type": "tool_use", "id": "t", "name": "x", "input": {
            "type": "base64", "note": literal, "signature": literal}},
    ]}]}  # fmt: skip
    request = ChatRequest(messages=[Message(role="user", content="x")], native=native)
    sent = request.redacted(redact).native
    assert sent is not None
    blocks = sent["messages"][0]["content"]
    assert blocks[0]["source"]["data"] == "iVBORw0K" + literal
    assert blocks[1] == {"type": "thinking", "thinking": "think [REDACTED:K]",
                         "signature": "sig/" + literal}  # fmt: skip
    assert blocks[2]["input"] == {"type": "base64", "note": "[REDACTED:K]",
                                  "signature": "[REDACTED:K]"}  # fmt: skip


# Budgets ---------------------------------------------------------------------------------
class WallClock:
    def __init__(self, iso: str) -> None:
        self.now = datetime.fromisoformat(iso).timestamp()

    def __call__(self) -> float:
        return self.now


PRICES = {
    "claude": {
        "claude-sonnet-4": ModelPrice(input_per_mtok=3, output_per_mtok=15),
        "claude-haiku": ModelPrice(input_per_mtok=0.8, output_per_mtok=4),
    },
    "oai": {"gpt-small": ModelPrice(input_per_mtok=0.15, output_per_mtok=0.6)},
}


def test_tokens_and_cost_are_exact_to_the_cent(
    state: StateKit, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = BudgetLedger(
        state.where("usage"), prices=PRICES, clock=WallClock("2025-03-01T12:00:00+00:00")
    )
    # A dated name takes its base model's price: 3.703701 + 1.33518 USD.
    ledger.record(
        "web", "sb1", "t1", "claude", "claude-sonnet-4-20250514", Usage(1_234_567, 89_012)
    )
    for _ in range(10):  # 10 x (0.000015 + 0.000006): float sums would drift here
        ledger.record("web", "sb1", "t2", "oai", "gpt-small", Usage(100, 10))
    with caplog.at_level(logging.WARNING, logger="agentbox.models.providers.budget"):
        ledger.record("web", "sb2", None, "local", "llama3", Usage(5_000, 1_000))
        ledger.record("web", "sb2", None, "local", "llama3", Usage(5_000, 1_000))
    [warning] = [r for r in caplog.records if r.name == "agentbox.models.providers.budget"]
    assert "no price for model 'llama3'" in warning.getMessage()

    [web] = ledger.usage()
    assert web["usd"] == 5.039091  # 5.038881 + 0.00021
    assert round(web["usd"], 2) == 5.04
    assert web["input_tokens"] == 1_234_567 + 1_000 + 10_000
    assert web["output_tokens"] == 89_012 + 100 + 2_000
    assert web["tokens"] == web["input_tokens"] + web["output_tokens"]
    assert web["unpriced_tokens"] == 12_000 and web["requests"] == 13
    models = {(m["provider"], m["model"]): m for m in web["models"]}
    assert models["claude", "claude-sonnet-4-20250514"]["usd"] == 5.038881
    assert models["oai", "gpt-small"]["usd"] == 0.00021
    assert models["local", "llama3"]["usd"] == 0 and not models["local", "llama3"]["priced"]
    assert web["spent_fraction"] is None  # no budget for "web"


def test_cache_reads_and_writes_cost_their_own_prices(tmp_path: Path) -> None:
    sonnet = ModelPrice(input_per_mtok=3, output_per_mtok=15, cache_read_per_mtok=0.3,
                        cache_write_per_mtok=3.75)  # fmt: skip
    plain = ModelPrice(input_per_mtok=3, output_per_mtok=15)  # unset: the input price
    usage = Usage(10_000, 100, cache_read_tokens=6_000, cache_write_tokens=3_000)
    # (1000 * 3 + 6000 * 0.3 + 3000 * 3.75 + 100 * 15) / 10**6 USD, in nano-USD
    assert cost_nanousd(sonnet, usage) == 17_550_000
    assert cost_nanousd(plain, usage) == 31_500_000

    # A usage.db from before the cache columns gains them, its rows kept.
    path = tmp_path / "usage.db"
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE usage (id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, "
            "day TEXT NOT NULL, project TEXT NOT NULL, sandbox TEXT, task TEXT, provider TEXT "
            "NOT NULL, model TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens "
            "INTEGER NOT NULL, cost_nanousd INTEGER NOT NULL, priced INTEGER NOT NULL);"
            "INSERT INTO usage VALUES (1, 0, '2025-03-01', 'web', NULL, NULL, 'claude', "
            "'claude-sonnet-4', 50, 5, 225000, 1);"
        )
    db.close()
    prices = {"claude": {"claude-sonnet-4": sonnet}}
    ledger = BudgetLedger(path, prices=prices, clock=WallClock("2025-03-01T12:00:00+00:00"))
    ledger.record("web", None, None, "claude", "claude-sonnet-4", usage)
    [web] = ledger.usage()
    assert (web["input_tokens"], web["cache_read_tokens"], web["cache_write_tokens"]) == (
        10_050, 6_000, 3_000)  # fmt: skip
    assert web["usd"] == 0.017775


def test_budget_alerts_fire_once_per_threshold_and_refuse_when_spent(state: StateKit) -> None:
    clock = WallClock("2025-03-01T23:00:00+00:00")
    budget = BudgetSettings(
        project="p", tokens_per_day=1000, alert_at=[0.5, 0.8, 1.0], alert_webhook_env="HOOK"
    )
    ledger = BudgetLedger(state.where("usage"), [budget], PRICES, clock=clock)

    def spend(tokens: int) -> list[float]:
        alerts = ledger.record("p", None, None, "x", "m", Usage(tokens, 0))
        return [a.threshold for a in alerts]

    assert spend(400) == []
    assert spend(100) == [0.5]  # exactly half
    assert spend(100) == []
    alerts = ledger.record("p", None, None, "x", "m", Usage(250, 0))
    assert [a.threshold for a in alerts] == [0.8]
    assert alerts[0].webhook_env == "HOOK" and alerts[0].tokens == 850
    assert "85% of its daily model budget" in alerts[0].message
    ledger.check("p")  # 850 of 1000: still allowed
    assert spend(500) == [1.0]  # one call may overshoot; the next is refused
    with pytest.raises(BudgetExceeded) as err:
        ledger.check("p")
    assert err.value.details["retry_after"] == 3600  # until 00:00 UTC
    assert err.value.details["tokens"] == 1350 and err.value.http_status == 429
    assert "1350 of 1000 tokens" in err.value.message
    assert spend(10) == []  # no repeated alerts the same day

    clock.now += 3600  # a new UTC day
    ledger.check("p")
    [today] = ledger.usage("p")
    assert today["day"] == "2025-03-02" and today["tokens"] == 0
    assert today["spent_fraction"] == 0 and today["tokens_per_day"] == 1000
    assert spend(600) == [0.5]
    assert ledger.usage("p", day="2025-03-01")[0]["tokens"] == 1360


def test_usd_budget_is_refused_once_spent(state: StateKit) -> None:
    budget = BudgetSettings(project="p", usd_per_day=1.5, alert_at=[0.5, 1.0])
    prices = {"claude": {"claude-haiku": ModelPrice(input_per_mtok=0.8, output_per_mtok=4)}}
    ledger = BudgetLedger(
        state.where("u"), [budget], prices, clock=WallClock("2025-03-01T00:00:00+00:00")
    )
    usage = Usage(250_000, 137_500)  # 0.2 + 0.55 = 0.75 USD: exactly half
    assert [
        a.threshold for a in ledger.record("p", None, None, "claude", "claude-haiku", usage)
    ] == [0.5]
    ledger.check("p")
    assert [
        a.threshold for a in ledger.record("p", None, None, "claude", "claude-haiku", usage)
    ] == [1.0]
    with pytest.raises(BudgetExceeded, match=r"\$1.50 of \$1.50"):
        ledger.check("p")
    ledger.check("other")  # no budget: never refused
    assert [s["project"] for s in ledger.usage()] == ["p"]


def test_budget_accounting_is_shared_across_processes(state: StateKit) -> None:
    path = state.arg("usage")
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from agentbox.config.settings import BudgetSettings
        from agentbox.models.providers import BudgetLedger, Usage
        from agentbox.state.postgres import PostgresDB
        where = PostgresDB(sys.argv[1]) if "://" in sys.argv[1] else Path(sys.argv[1])
        budget = BudgetSettings(project="p", tokens_per_day=1000, alert_at=[0.25, 0.5, 0.75, 1.0])
        ledger = BudgetLedger(where, [budget])
        crossed = []
        for _ in range(25):
            crossed += [a.threshold for a in ledger.record("p", None, None, "x", "m", Usage(6, 4))]
        print(json.dumps(crossed))
        """
    )
    BudgetLedger(state.where("usage"))  # the schema, before four writers race
    workers = [
        subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    crossed: list[float] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0
        crossed += json.loads(out)
    assert sorted(crossed) == [0.25, 0.5, 0.75, 1.0]  # each crossed once, by one process
    ledger = BudgetLedger(state.where("usage"), [BudgetSettings(project="p", tokens_per_day=1000)])
    assert ledger.usage("p")[0]["tokens"] == 1000 and ledger.usage("p")[0]["requests"] == 100


# Settings --------------------------------------------------------------------------------
def test_the_example_config_still_parses_and_builds_a_pool() -> None:
    settings = load_settings(EXAMPLE)
    assert [p.timeout_seconds for p in settings.providers] == [60, 60, 60]
    # The prices are a commented example (the contract sets none): uncommented, they load.
    priced = parse_settings(re.sub(r"(?m)^    # (prices:|  )", r"    \1", EXAMPLE.read_text()))
    sonnet = priced.providers[0].prices["claude-sonnet-4"]
    assert (sonnet.cache_read_per_mtok, sonnet.cache_write_per_mtok) == (0.3, 3.75)
    assert sonnet.checked is not None and sonnet.source is not None
    assert priced.providers[1].prices["gpt-4.1"].cache_read_per_mtok == 0.5
    assert priced.providers[2].prices == {}  # a local model costs nothing
    assert settings.retry == RetrySettings(max_attempts=3, base_seconds=1, max_seconds=30)

    async def health() -> list[dict[str, Any]]:
        async with ProviderPool(settings.providers, settings.retry, redact=str, env={}) as pool:
            return pool.health()

    assert [(h["name"], h["state"]) for h in asyncio.run(health())] == [
        ("primary", "closed"),
        ("secondary", "closed"),
        ("local", "closed"),
    ]


def test_provider_prices_and_timeout_settings() -> None:
    text = textwrap.dedent(
        """
        providers:
          - name: claude
            kind: anthropic
            timeout_seconds: 20
            prices:
              claude-sonnet-4: {input_per_mtok: 3, output_per_mtok: 15}
        """
    )
    [claude] = parse_settings(text).providers
    assert claude.timeout_seconds == 20
    assert claude.prices["claude-sonnet-4"] == ModelPrice(input_per_mtok=3, output_per_mtok=15)

    with pytest.raises(
        InvalidConfig, match=r"providers\.0\.prices\.claude-sonnet-4\.cached.*unknown key"
    ):
        parse_settings(text.replace("output_per_mtok: 15}", "output_per_mtok: 15, cached: 1}"))
    with pytest.raises(InvalidConfig, match="input_per_mtok"):
        parse_settings(text.replace("input_per_mtok: 3", "input_per_mtok: -3"))
    with pytest.raises(InvalidConfig, match="provider names must be unique"):
        parse_settings(text + text.split("providers:\n", 1)[1])
    with pytest.raises(InvalidConfig, match="one budget per project"):
        parse_settings("budgets:\n  - project: a\n  - project: a\n")

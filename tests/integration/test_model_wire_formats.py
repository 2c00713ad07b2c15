"""``POST /v1/responses`` (what Codex speaks) through the official ``openai`` SDK, served by
a chat-completions provider and by an Anthropic provider (fakes on loopback speaking the
real wire formats): text, streaming, function and custom tools across turns, and the
fields refused with a 400 that names them. Then ``POST /v1/messages/count_tokens`` (what
Claude Code calls) through the ``anthropic`` SDK: exact from an Anthropic provider, an
estimate marked as such from any other. Then the fidelity an Anthropic client gets from an
Anthropic provider (thinking with its signature, cache_control, documents, the matched stop
sequence), and what happens to those across formats."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from agentbox.models.providers import anthropic as anthropic_adapter
from fakeproviders import FakeProvider, Reply
from gateway_harness import RunningGateway, running_gateway

SECRET = "sk-planted-fidelity-0123456789abcdef"
# One model per provider: the model a test names picks who answers.
MODEL = {"openai": "gpt-fake", "anthropic": "claude-fake"}
SHELL: Any = {"type": "function", "name": "shell", "description": "run a command",
              "strict": False, "parameters": {"type": "object", "properties": {
                  "command": {"type": "array", "items": {"type": "string"}}},
                  "required": ["command"]}}  # fmt: skip
PATCH: Any = {"type": "custom", "name": "apply_patch", "description": "edit files",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}  # fmt: skip


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeProvider]]:
    with FakeProvider("openai") as oai, FakeProvider("anthropic") as claude:
        yield {"openai": oai, "anthropic": claude}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       fakes: dict[str, FakeProvider]) -> Iterator[RunningGateway]:  # fmt: skip
    extra = f"""
providers:
  - name: oai
    kind: openai
    base_url: {fakes["openai"].base_url}
    models: [gpt-fake]
    prices: {{gpt-fake: {{input_per_mtok: 2, output_per_mtok: 8, cache_read_per_mtok: 0.5}}}}
  - name: claude
    kind: anthropic
    base_url: {fakes["anthropic"].base_url}
    models: [claude-fake]
    prices: {{claude-fake: {{input_per_mtok: 3, output_per_mtok: 15, cache_read_per_mtok: 0.3,
                            cache_write_per_mtok: 3.75, checked: 2026-12-01,
                            source: "https://docs.anthropic.com/en/docs/about-claude/pricing"}}}}
retry: {{max_attempts: 1}}
"""
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwresp"), extra_yaml=extra,
                         env={"AGENTBOX_TEST_PLANTED_SECRET": SECRET}) as running:  # fmt: skip
        yield running


@pytest.fixture
def client(gw: RunningGateway, fakes: dict[str, FakeProvider]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.operator_token, max_retries=0) as c:
        yield c
    for fake in fakes.values():
        fake.clear_script()


KINDS = ["openai", "anthropic"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_text_answer(client: openai.OpenAI, fakes: dict[str, FakeProvider], kind: str) -> None:
    fakes[kind].script(Reply(text="four", input_tokens=12, output_tokens=3))
    r = client.responses.create(model=MODEL[kind], instructions="be brief", input="2+2?",
                                store=False, prompt_cache_key="thread-1",
                                include=["reasoning.encrypted_content"])  # fmt: skip
    assert r.status == "completed" and r.output_text == "four"
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage is not None
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (12, 3, 15)
    sent = fakes[kind].requests[-1].json()
    if kind == "openai":
        assert sent["messages"] == [{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": "2+2?"}]  # fmt: skip
        assert "max_tokens" not in sent  # none set: the model's own limit, as at OpenAI
    else:
        assert sent["system"] == "be brief"
        assert sent["messages"] == [{"role": "user", "content": "2+2?"}]
        assert sent["max_tokens"] == 8192  # Anthropic requires one
    assert "prompt_cache_key" not in sent and "store" not in sent


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_of_events(client: openai.OpenAI, fakes: dict[str, FakeProvider],
                            kind: str) -> None:  # fmt: skip
    fakes[kind].script(Reply(text="one two three", input_tokens=5, output_tokens=3))
    events = list(client.responses.create(model=MODEL[kind], input="count", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]  # fmt: skip
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        "one two three"
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1]
    assert done.type == "response.completed" and done.response.usage is not None
    assert done.response.usage.total_tokens == 8
    assert done.response.id == events[0].response.id  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", KINDS)
def test_function_calls_across_turns(client: openai.OpenAI, fakes: dict[str, FakeProvider],
                                     kind: str) -> None:  # fmt: skip
    # What Codex does: a streamed call of its shell tool, the output sent back with the
    # whole input (store: false), parallel calls off.
    fake = fakes[kind]
    fake.script(Reply(text="", tool_call=("shell", {"command": ["ls"]})))
    with client.responses.stream(model=MODEL[kind], input="list files", tools=[SHELL],
                                 parallel_tool_calls=False, store=False) as stream:  # fmt: skip
        arguments = "".join(
            e.delta for e in stream if e.type == "response.function_call_arguments.delta"
        )
        final = stream.get_final_response()
    call = final.output[-1]
    assert call.type == "function_call" and call.name == "shell"
    assert json.loads(call.arguments) == json.loads(arguments) == {"command": ["ls"]}
    first = fake.requests[-1].json()
    if kind == "openai":
        assert first["parallel_tool_calls"] is False
        assert first["tools"][0]["function"]["parameters"] == SHELL["parameters"]
    else:
        assert first["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
        assert first["tools"][0]["input_schema"] == SHELL["parameters"]

    fake.script(Reply(text="a.txt"))
    history: Any = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt\n"},
    ]  # fmt: skip
    answer = client.responses.create(model=MODEL[kind], input=history, tools=[SHELL])
    assert answer.output_text == "a.txt"
    sent = fake.requests[-1].json()["messages"]
    if kind == "openai":
        assert sent[-2]["tool_calls"][0]["id"] == call.call_id
        assert sent[-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "a.txt\n"}
    else:
        assert sent[-2]["content"] == [{"type": "tool_use", "id": call.call_id, "name": "shell",
                                        "input": {"command": ["ls"]}}]  # fmt: skip
        assert sent[-1]["content"] == [{"type": "tool_result", "tool_use_id": call.call_id,
                                        "content": "a.txt\n"}]  # fmt: skip


def test_a_custom_tool_is_a_function_of_its_input(client: openai.OpenAI,
                                                  fakes: dict[str, FakeProvider]) -> None:  # fmt: skip
    # Codex's freeform apply_patch: the model writes the patch text; it comes back as a
    # custom_tool_call whose input is that text, and the call goes back up as a call.
    fake = fakes["openai"]
    fake.script(Reply(text="", tool_call=("apply_patch", {"input": "*** Begin Patch"})))
    r = client.responses.create(model="gpt-fake", input="fix it", tools=[PATCH])
    call = r.output[-1]
    assert call.type == "custom_tool_call" and call.input == "*** Begin Patch"
    tool = fake.requests[-1].json()["tools"][0]["function"]
    assert tool["parameters"]["required"] == ["input"] and "start: /.+/" in tool["description"]

    fake.script(Reply(text="", tool_call=("apply_patch", {"input": "again"})))
    events = list(client.responses.create(model="gpt-fake", tools=[PATCH], stream=True, input=[
        {"type": "message", "role": "user", "content": "fix it"},
        call.model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"}]))  # fmt: skip
    assert [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"] == [
        "again"
    ]
    sent = fake.requests[-1].json()["messages"]
    assert json.loads(sent[-2]["tool_calls"][0]["function"]["arguments"]) == {
        "input": "*** Begin Patch"
    }
    assert sent[-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "Done!"}


def test_web_search_is_left_out_and_says_so(gw: RunningGateway,
                                            fakes: dict[str, FakeProvider]) -> None:  # fmt: skip
    body = {"model": "gpt-fake", "input": "hi", "tools": [
        SHELL, {"type": "web_search", "external_web_access": False}]}  # fmt: skip
    with gw.operator() as c:
        r = c.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["X-Agentbox-Dropped-Tools"] == "web_search"
    assert [t["function"]["name"] for t in fakes["openai"].requests[-1].json()["tools"]] == [
        "shell"
    ]


def test_reasoning_effort_and_verbosity_across_providers(
    client: openai.OpenAI, fakes: dict[str, FakeProvider]
) -> None:
    # Codex sends both for its GPT models. An OpenAI provider gets them as fields; an
    # Anthropic one gets the verbosity in words (no such field there) and reasons as it
    # does by default (no thinking switched on: its signed blocks could not come back).
    client.responses.create(model="gpt-fake", input="think", reasoning={"effort": "high"},
                            text={"verbosity": "low"})  # fmt: skip
    sent = fakes["openai"].requests[-1].json()
    assert (sent["reasoning_effort"], sent["verbosity"]) == ("high", "low")
    for verbosity in ("low", "high"):
        fakes["anthropic"].script(Reply(text="ok"))
        r = client.responses.create(model="claude-fake", instructions="be kind", input="x",
                                    reasoning={"effort": "high"},
                                    text={"verbosity": verbosity})  # fmt: skip
        assert r.output_text == "ok"
        sent = fakes["anthropic"].requests[-1].json()
        assert sent["system"] == f"be kind\n\n{anthropic_adapter.VERBOSITY[verbosity]}"
        assert not {"thinking", "reasoning_effort", "verbosity"} & set(sent)
    fakes["anthropic"].script(Reply(text="ok"))  # medium, the default, says nothing
    client.responses.create(model="claude-fake", input="x", text={"verbosity": "medium"})
    assert "system" not in fakes["anthropic"].requests[-1].json()


# Codex's tool search (its GPT models get their MCP tools deferred): the search tool, as
# Codex 0.169 sends it, and what its search loads (a namespace of deferred functions).
SEARCH: Any = {"type": "tool_search", "execution": "client", "description": "Find tools.",
               "parameters": {"type": "object", "properties": {
                   "query": {"type": "string"}, "limit": {"type": "number"}},
                   "required": ["query"], "additionalProperties": False}}  # fmt: skip
RUN: Any = {"type": "function", "name": "terminal_run", "description": "Run a command.",
            "strict": False, "defer_loading": True, "parameters": {"type": "object",
            "properties": {"command": {"type": "string"}}, "required": ["command"]}}  # fmt: skip
LOADED: Any = [{"type": "namespace", "name": "mcp__agentbox", "description": "the sandbox",
                "tools": [RUN]}]  # fmt: skip


def _tool_names(kind: str, sent: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] if kind == "openai" else t["name"] for t in sent["tools"]]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_tool_search_and_the_tools_it_loads(client: openai.OpenAI,
                                              fakes: dict[str, FakeProvider], kind: str,
                                              stream: bool) -> None:  # fmt: skip
    fake = fakes[kind]
    fake.script(Reply(text="", tool_call=("tool_search", {"query": "run", "limit": 3})))
    ask: Any = {"type": "message", "role": "user", "content": "run ls"}
    if stream:
        with client.responses.stream(model=MODEL[kind], input=[ask], tools=[SHELL, SEARCH]
                                     ) as events:  # fmt: skip
            added = [e.item.type for e in events if e.type == "response.output_item.added"]
            first = events.get_final_response()
        assert added == ["tool_search_call"]
    else:
        first = client.responses.create(model=MODEL[kind], input=[ask], tools=[SHELL, SEARCH])
    search = first.output[-1]
    assert search.type == "tool_search_call"
    assert (search.execution, search.status, search.arguments) == (
        "client", "completed", {"query": "run", "limit": 3})  # fmt: skip
    sent = fake.requests[-1].json()
    assert _tool_names(kind, sent) == ["tool_search", "shell"]
    schema = sent["tools"][0]["function" if kind == "openai" else "input_schema"]
    assert (schema.get("parameters") if kind == "openai" else schema) == SEARCH["parameters"]

    # The client ran the search: the tools it loaded are callable from now on.
    fake.script(Reply(text="", tool_call=("mcp__agentbox__terminal_run", {"command": "ls"})))
    history: Any = [ask, search.model_dump(exclude_none=True),
                    {"type": "tool_search_output", "call_id": search.call_id,
                     "execution": "client", "status": "completed", "tools": LOADED}]  # fmt: skip
    second = client.responses.create(model=MODEL[kind], input=history, tools=[SHELL, SEARCH],
                                     stream=False)  # fmt: skip
    call = second.output[-1]
    assert call.type == "function_call"
    assert (call.namespace, call.name, json.loads(call.arguments)) == (
        "mcp__agentbox", "terminal_run", {"command": "ls"})  # fmt: skip
    sent = fake.requests[-1].json()
    assert _tool_names(kind, sent) == ["tool_search", "shell", "mcp__agentbox__terminal_run"]
    result = "These tools are now available to call:\n- mcp__agentbox__terminal_run: Run a command."
    if kind == "openai":
        assert sent["messages"][-2]["tool_calls"][0]["function"] == {
            "name": "tool_search", "arguments": json.dumps({"query": "run", "limit": 3})}  # fmt: skip
        assert sent["messages"][-1] == {"role": "tool", "tool_call_id": search.call_id,
                                        "content": result}  # fmt: skip
    else:
        assert sent["messages"][-2]["content"] == [{"type": "tool_use", "id": search.call_id,
                                                    "name": "tool_search",
                                                    "input": {"query": "run", "limit": 3}}]  # fmt: skip
        assert sent["messages"][-1]["content"] == [{"type": "tool_result",
                                                    "tool_use_id": search.call_id,
                                                    "content": result}]  # fmt: skip


def test_a_search_that_found_nothing_says_so(client: openai.OpenAI,
                                             fakes: dict[str, FakeProvider]) -> None:  # fmt: skip
    fakes["anthropic"].script(Reply(text="nothing to use"))
    client.responses.create(model="claude-fake", tools=[SEARCH], input=[
        {"type": "message", "role": "user", "content": "find"},
        {"type": "tool_search_call", "call_id": "ts1", "execution": "client",
         "status": "completed", "arguments": {"query": "x"}},
        {"type": "tool_search_output", "call_id": "ts1", "execution": "client",
         "status": "completed", "tools": []}])  # fmt: skip
    sent = fakes["anthropic"].requests[-1].json()
    assert _tool_names("anthropic", sent) == ["tool_search"]
    assert sent["messages"][-1]["content"][0]["content"] == "No tools matched the search."


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"previous_response_id": "resp_1"}, "whole conversation in `input`"),
        ({"frobnicate": 1}, "field 'frobnicate' is not supported"),
        ({"tools": [{"type": "local_shell"}]}, "tool type 'local_shell' is not supported"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}},
         "text.format"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "'item_reference'"),
        ({"service_tier": "priority"}, "service_tier 'priority'"),
        ({"include": ["message.output_text.logprobs"]}, "include 'message.output_text"),
        ({"tools": [{**SHELL, "strict": True}]}, "strict schemas"),
        ({"tools": [{"type": "tool_search"}]}, "tool_search run by the server"),
        ({"tools": [{**SEARCH, "execution": "server"}]}, "tool_search run by the server"),
        ({"tools": [SEARCH, {**SHELL, "name": "tool_search"}]}, "names would collide"),
        ({"input": [{"type": "tool_search_call", "execution": "server", "arguments": {}}]},
         "tool_search_call run by the server"),
    ],
    ids=["previous-response", "unknown-field", "local-shell", "json-schema", "item-reference",
         "service-tier", "include", "strict", "server-search", "server-search-explicit",
         "search-name-collision", "server-search-call"],
)  # fmt: skip
def test_what_cannot_be_honoured_is_a_400_naming_it(gw: RunningGateway, extra: dict[str, Any],
                                                    says: str) -> None:  # fmt: skip
    with gw.operator() as c:
        r = c.post("/v1/responses", json={"model": "gpt-fake", "input": "hi", **extra})
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_a_provider_refusal_is_an_sdk_error(client: openai.OpenAI,
                                            fakes: dict[str, FakeProvider]) -> None:  # fmt: skip
    fakes["anthropic"].script(Reply(status=400, error="prompt is too long"))
    with pytest.raises(openai.BadRequestError, match="prompt is too long"):
        client.responses.create(model="claude-fake", input="x", stream=True)


def test_a_stream_cut_after_its_first_token_ends_in_response_failed(
    client: openai.OpenAI, fakes: dict[str, FakeProvider]
) -> None:
    fakes["openai"].script(Reply(text="one two three four", cut_after=2))
    events = list(client.responses.create(model="gpt-fake", input="count", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None
    assert "cut the stream" in events[-1].response.error.message
    assert events[-2].type == "response.output_item.done"  # the text so far, closed


# count_tokens ----------------------------------------------------------------------------
COUNTED: Any = {"system": "be brief", "tools": [{"name": "lookup", "description": "find",
                "input_schema": {"type": "object"}}],
                "messages": [{"role": "user", "content": "how many tokens is this?"}]}  # fmt: skip


def test_count_tokens_is_exact_from_an_anthropic_provider(
    gw: RunningGateway, fakes: dict[str, FakeProvider]
) -> None:
    fakes["anthropic"].script(Reply(input_tokens=321))
    with anthropic.Anthropic(base_url=gw.url, api_key=gw.operator_token, max_retries=0) as client:
        raw = client.messages.with_raw_response.count_tokens(model="claude-fake", **COUNTED)
    assert raw.parse().input_tokens == 321
    assert raw.headers["X-Agentbox-Token-Count"] == "exact"
    assert raw.headers["X-Agentbox-Provider"] == "claude"
    upstream = fakes["anthropic"].requests[-1]
    assert upstream.path == "/v1/messages/count_tokens"
    assert set(upstream.json()) == {"model", "messages", "system", "tools"}  # no max_tokens


@pytest.mark.parametrize("model", ["gpt-fake", "claude-fake"])
def test_count_tokens_is_an_estimate_marked_as_such_otherwise(
    gw: RunningGateway, fakes: dict[str, FakeProvider], model: str
) -> None:
    # An OpenAI provider cannot count; an Anthropic one that fails to is not fatal.
    fakes["anthropic"].script(Reply(status=404, error="no counting here"))
    sent = len(fakes["openai"].requests)
    with anthropic.Anthropic(base_url=gw.url, api_key=gw.operator_token, max_retries=0) as client:
        raw = client.messages.with_raw_response.count_tokens(model=model, **COUNTED)
    assert raw.headers["X-Agentbox-Token-Count"] == "estimated"
    chars = len("be brief" + "how many tokens is this?" + "lookup" + "find" + '{"type": "object"}')
    assert raw.parse().input_tokens == -(-chars // 4)
    assert len(fakes["openai"].requests) == sent  # nothing was sent to count
    fakes["anthropic"].clear_script()


# Fidelity to an Anthropic provider ------------------------------------------------------
PDF: Any = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
            "data": "JVBERi0xLjQKJcfsj6IK"}, "cache_control": {"type": "ephemeral"}}  # fmt: skip
SIGNATURE = "EqQBCkgIARABGAIiQL7p2sig+/=="


@pytest.fixture
def claude(gw: RunningGateway, fakes: dict[str, FakeProvider]) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gw.url, api_key=gw.operator_token, max_retries=0) as c:
        yield c
    for fake in fakes.values():
        fake.clear_script()


def test_thinking_cache_marks_and_documents_reach_an_anthropic_provider_intact(
    claude: anthropic.Anthropic, fakes: dict[str, FakeProvider]
) -> None:
    fake = fakes["anthropic"]
    fake.script(Reply(text="It is a report.", thinking=("The user wants a summary.", SIGNATURE)))
    first: Any = [{"role": "user", "content": [PDF, {"type": "text", "text": "what is this?"}]}]
    common: Any = {
        "model": "claude-fake", "max_tokens": 4000,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "system": [{"type": "text", "text": "You read documents.",
                    "cache_control": {"type": "ephemeral"}}],
    }  # fmt: skip
    answer = claude.messages.create(messages=first, **common)
    assert [b.type for b in answer.content] == ["thinking", "text"]
    thought = answer.content[0]
    assert thought.type == "thinking" and thought.signature == SIGNATURE
    assert thought.thinking == "The user wants a summary."

    # The next turn sends the signed thinking back; it must arrive as it was sent.
    fake.script(Reply(text="Yes."))
    history: Any = [*first,
                    {"role": "assistant", "content": [b.model_dump() for b in answer.content]},
                    {"role": "user", "content": [{"type": "text", "text": "sure?",
                                                  "cache_control": {"type": "ephemeral"}}]}]  # fmt: skip
    claude.messages.create(messages=history, **common)
    sent = fake.requests[-1].json()
    assert sent["messages"] == json.loads(json.dumps(history))
    assert (sent["thinking"], sent["system"]) == (common["thinking"], common["system"])


def test_a_streamed_thinking_block_keeps_its_signature(
    claude: anthropic.Anthropic, fakes: dict[str, FakeProvider]
) -> None:
    fakes["anthropic"].script(Reply(text="Done.", thinking=("Step one, step two.", SIGNATURE)))
    with claude.messages.stream(model="claude-fake", max_tokens=4000,
                                thinking={"type": "enabled", "budget_tokens": 1024},
                                messages=[{"role": "user", "content": "go"}]) as stream:  # fmt: skip
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "thinking" in kinds and "signature" in kinds  # the SDK's thinking/signature events
    thought = final.content[0]
    assert thought.type == "thinking" and thought.signature == SIGNATURE
    assert thought.thinking == "Step one, step two."
    assert final.content[1].type == "text" and final.content[1].text == "Done."


@pytest.mark.parametrize("stream", [False, True])
def test_the_matched_stop_sequence_comes_back(claude: anthropic.Anthropic,
                                              fakes: dict[str, FakeProvider], stream: bool) -> None:  # fmt: skip
    fakes["anthropic"].script(Reply(text="1 2 3", stop_sequence="END"))
    body: Any = {"model": "claude-fake", "max_tokens": 50, "stop_sequences": ["STOP", "END"],
                 "messages": [{"role": "user", "content": "count"}]}  # fmt: skip
    if stream:
        with claude.messages.stream(**body) as s:
            answer = s.get_final_message()
    else:
        answer = claude.messages.create(**body)
    assert (answer.stop_reason, answer.stop_sequence) == ("stop_sequence", "END")


def test_a_native_body_without_max_tokens_still_gets_one(gw: RunningGateway,
                                                         fakes: dict[str, FakeProvider]) -> None:  # fmt: skip
    fakes["anthropic"].script(Reply(text="ok"))
    with gw.operator() as c:
        r = c.post("/v1/messages", json={"model": "claude-fake",
                                         "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert r.status_code == 200, r.text
    assert fakes["anthropic"].requests[-1].json()["max_tokens"] == 1024  # as before: the default


def test_a_secret_in_the_native_body_is_redacted_but_signatures_are_not(
    claude: anthropic.Anthropic, fakes: dict[str, FakeProvider]
) -> None:
    fake = fakes["anthropic"]
    fake.script(Reply(text="ok"))
    claude.messages.create(model="claude-fake", max_tokens=4000, messages=[
        {"role": "user", "content": [PDF, {"type": "text", "text": f"key {SECRET}",
                                            "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": SIGNATURE},
            {"type": "redacted_thinking", "data": "opaque+data=="},
            {"type": "text", "text": "?"}]},
        {"role": "user", "content": "go on"}])  # fmt: skip
    assert SECRET.encode() not in fake.sent_bytes()
    sent = fake.requests[-1].json()["messages"]
    assert "[REDACTED" in sent[0]["content"][1]["text"]
    assert sent[0]["content"][0] == PDF
    assert sent[1]["content"][:2] == [
        {"type": "thinking", "thinking": "hm", "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": "opaque+data=="}]  # fmt: skip


def test_across_formats_a_document_is_refused_and_thinking_dropped(
    claude: anthropic.Anthropic, fakes: dict[str, FakeProvider]
) -> None:
    with pytest.raises(anthropic.BadRequestError, match=r"kind 'anthropic'.*document"):
        claude.messages.create(model="gpt-fake", max_tokens=50, messages=[
            {"role": "user", "content": [PDF, {"type": "text", "text": "what is this?"}]}])  # fmt: skip
    fakes["openai"].script(Reply(text="ok"))
    claude.messages.create(model="gpt-fake", max_tokens=4000,
                           thinking={"type": "enabled", "budget_tokens": 1024}, messages=[
        {"role": "user", "content": [{"type": "text", "text": "x",
                                      "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": SIGNATURE},
            {"type": "text", "text": "y"}]},
        {"role": "user", "content": "z"}])  # fmt: skip
    sent = fakes["openai"].requests[-1].json()
    assert sent["messages"] == [{"role": "user", "content": "x"},
                                {"role": "assistant", "content": "y"},
                                {"role": "user", "content": "z"}]  # fmt: skip
    assert "thinking" not in sent


# Prompt-cache tokens at their own prices --------------------------------------------------
# 10000 input tokens of which 6000 read from the cache and 3000 written to it, 100 output.
CACHED = Reply(text="ok", input_tokens=10000, output_tokens=100, cache_read=6000, cache_write=3000)


def _usage_of(gw: RunningGateway, project: str) -> dict[str, Any]:
    with gw.operator() as op:
        [row] = op.get("/v1/usage", params={"project": project}).json()
    return dict(row)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_cache_reads_and_writes_are_priced_apart(
    gw: RunningGateway, fakes: dict[str, FakeProvider], stream: bool
) -> None:
    project = "cache-" + secrets.token_hex(4)  # the usage.db outlives a run: a fresh project
    fakes["anthropic"].script(CACHED)
    body: Any = {"model": "claude-fake", "max_tokens": 100,
                 "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    with anthropic.Anthropic(base_url=gw.url, api_key=gw.operator_token, max_retries=0,
                             default_headers={"X-Agentbox-Project": project}) as client:  # fmt: skip
        if stream:
            with client.messages.stream(**body) as s:
                usage = s.get_final_message().usage
        else:
            usage = client.messages.create(**body).usage
    # The client reads Anthropic's own words back, as the provider sent them.
    assert (usage.input_tokens, usage.cache_read_input_tokens,
            usage.cache_creation_input_tokens) == (1000, 6000, 3000)  # fmt: skip
    row = _usage_of(gw, project)
    assert (row["input_tokens"], row["cache_read_tokens"], row["cache_write_tokens"]) == (
        10000, 6000, 3000)  # fmt: skip
    # 1000 * $3 + 6000 * $0.30 + 3000 * $3.75 + 100 * $15, per million
    assert row["usd"] == pytest.approx((3000 + 1800 + 11250 + 1500) / 1e6, abs=1e-12)
    model = row["models"][0]
    assert (model["price_checked"], model["price_source"]) == (
        "2026-12-01", "https://docs.anthropic.com/en/docs/about-claude/pricing")  # fmt: skip
    with gw.operator() as op:
        metrics = op.get("/metrics").text
    lines = [x for x in metrics.splitlines() if x.startswith("agentbox_model_tokens_total")
             and f'project="{project}"' in x]  # fmt: skip
    by_direction = {x.split('direction="')[1].split('"')[0]: float(x.rsplit(" ", 1)[1])
                    for x in lines}  # fmt: skip
    assert by_direction == {"input": 1000, "cache_read": 6000, "cache_write": 3000, "output": 100}


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_cached_input_is_priced_apart(gw: RunningGateway, fakes: dict[str, FakeProvider],
                                             api: str) -> None:  # fmt: skip
    project = "cache-" + secrets.token_hex(4)
    fakes["openai"].script(Reply(text="ok", input_tokens=10000, output_tokens=100,
                                 cache_read=8000))  # fmt: skip
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.operator_token, max_retries=0,
                       default_headers={"X-Agentbox-Project": project}) as client:  # fmt: skip
        if api == "chat":
            usage = client.chat.completions.create(
                model="gpt-fake", messages=[{"role": "user", "content": "hi"}]).usage  # fmt: skip
            assert usage is not None and usage.prompt_tokens == 10000
            assert usage.prompt_tokens_details is not None
            assert usage.prompt_tokens_details.cached_tokens == 8000
        else:
            answer = client.responses.create(model="gpt-fake", input="hi")
            assert answer.usage is not None and answer.usage.input_tokens == 10000
            assert answer.usage.input_tokens_details.cached_tokens == 8000
    row = _usage_of(gw, project)
    assert (row["input_tokens"], row["cache_read_tokens"]) == (10000, 8000)
    # 2000 * $2 + 8000 * $0.50 + 100 * $8, per million
    assert row["usd"] == pytest.approx((4000 + 4000 + 800) / 1e6, abs=1e-12)


def test_an_anthropic_providers_cache_reads_reach_a_responses_client(
    client: openai.OpenAI, fakes: dict[str, FakeProvider]
) -> None:
    fakes["anthropic"].script(CACHED)
    events = list(client.responses.create(model="claude-fake", input="hi", stream=True))
    done = events[-1]
    assert done.type == "response.completed" and done.response.usage is not None
    assert done.response.usage.input_tokens == 10000
    assert done.response.usage.input_tokens_details.cached_tokens == 6000


# anthropic-beta --------------------------------------------------------------------------
# What Claude Code 2.1.328 sends on every call (captured from the real client).
CLAUDE_CODE_BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14",
                     "context-management-2025-06-27", "mid-conversation-tool-changes-2026-07-01",
                     "thinking-token-count-2026-05-13", "effort-2025-11-24"]  # fmt: skip
ASK: Any = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_safe_betas_reach_an_anthropic_provider_and_unknown_ones_are_named(
    claude: anthropic.Anthropic, fakes: dict[str, FakeProvider], stream: bool
) -> None:
    fake = fakes["anthropic"]
    fake.script(Reply(text="hello"))
    betas = [*CLAUDE_CODE_BETAS, "future-feature-2027-01-01"]
    raw = claude.beta.messages.with_raw_response.create(
        model="claude-fake", max_tokens=100, messages=ASK, betas=betas, stream=stream,
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]})  # fmt: skip
    assert raw.headers["X-Agentbox-Dropped-Betas"] == "future-feature-2027-01-01"
    if stream:
        assert "".join(e.delta.text for e in raw.parse() if e.type == "content_block_delta"
                       and e.delta.type == "text_delta") == "hello"  # fmt: skip
    else:
        assert raw.parse().content[0].text == "hello"  # type: ignore[union-attr]
    upstream = fake.requests[-1]
    assert upstream.headers["anthropic-beta"] == ",".join(CLAUDE_CODE_BETAS)
    assert upstream.json()["context_management"]["edits"][0]["keep"] == "all"


def test_betas_ride_along_to_count_tokens_and_nowhere_else(
    claude: anthropic.Anthropic, fakes: dict[str, FakeProvider]
) -> None:
    fakes["anthropic"].script(Reply(input_tokens=5))
    counted = claude.beta.messages.count_tokens(model="claude-fake", messages=ASK,
                                                betas=CLAUDE_CODE_BETAS)  # fmt: skip
    assert counted.input_tokens == 5
    # (the SDK adds its own token-counting beta to count_tokens calls)
    assert fakes["anthropic"].requests[-1].headers["anthropic-beta"] == ",".join(
        [*CLAUDE_CODE_BETAS, "token-counting-2024-11-01"]
    )
    # Without betas no header; an OpenAI provider has no such features.
    claude.messages.create(model="claude-fake", max_tokens=10, messages=ASK)
    assert "anthropic-beta" not in fakes["anthropic"].requests[-1].headers
    claude.beta.messages.create(model="gpt-fake", max_tokens=10, messages=ASK,
                                betas=CLAUDE_CODE_BETAS)  # fmt: skip
    assert "anthropic-beta" not in fakes["openai"].requests[-1].headers


@pytest.mark.parametrize(
    ("beta", "says"),
    [
        ("mcp-client-2025-04-04", "connect to MCP servers itself"),
        ("mcp-client-2030-01-01", "connect to MCP servers itself"),  # any version of it
        ("web-fetch-2025-09-10", "fetch URLs from its servers"),
        ("code-execution-2025-08-25", "run code on its servers"),
        ("files-api-2025-04-14", "past redaction"),
        ("extended-cache-ttl-2025-04-11", "cache_write price"),
        ("context-1m-2025-08-07", "budgets would undercount"),
    ],
)
def test_a_beta_that_would_escape_the_sandbox_or_the_prices_is_refused_by_name(
    claude: anthropic.Anthropic, fakes: dict[str, FakeProvider], beta: str, says: str
) -> None:
    sent = len(fakes["anthropic"].requests)
    betas = ["claude-code-20250219", beta]
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.beta.messages.create(model="claude-fake", max_tokens=10, messages=ASK,
                                    betas=betas)  # fmt: skip
    with pytest.raises(anthropic.BadRequestError) as refused_count:
        claude.beta.messages.count_tokens(model="claude-fake", messages=ASK, betas=betas)
    for error in (refused.value, refused_count.value):
        assert f"anthropic-beta {beta!r}" in str(error) and says in str(error)
    assert len(fakes["anthropic"].requests) == sent  # nothing left the host

"""A scripted model that drives a real coding agent (Claude Code, Codex) through a chain
of tool calls, one per turn, checking each tool result it gets back.

It is an Anthropic-format ``FakeProvider`` behind the gateway: the agent speaks its own
vendor's protocol to the gateway, the gateway translates, and this model answers from the
conversation it is sent, not from a queue: the number of tool results in the request says
which step is next, so a client that retries or sends side requests (titles, summaries)
does not shift the script. A request that offers no agentbox tool is such a side request
and gets plain text.

A client that defers its MCP tools (Codex with its GPT models) offers a ``tool_search``
tool instead: a step whose tool is not offered yet is preceded by a search for it, which
loads it; searches are not steps.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from fakeproviders import FakeProvider, Reply

SERVER = "agentbox"  # the MCP server's name in the agent's config: its tools carry it
SEARCH = "tool_search"  # a client's search for its deferred tools
MAX_SEARCHES = 2  # for one step: then the tool is not there to be found


@dataclass(frozen=True)
class Step:
    """One turn: call ``tool`` with ``arguments``; its result must match ``expect`` (a
    regex), and be an error result exactly when ``error``. ``tool`` is an agentbox tool's
    own name (found in the agent's tool list, whatever prefix the agent gives it), or with
    ``local`` the exact name of one of the agent's own tools."""

    tool: str
    arguments: dict[str, Any]
    expect: str
    error: bool = False
    local: bool = False


@dataclass
class Outcome:
    """What the model saw: each step's result text, and what went wrong, in order."""

    results: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    tool_names: list[str] = field(default_factory=list)  # the agent's tools, last main request
    searches: list[str] = field(default_factory=list)  # the tool each search looked for
    finished: bool = False


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def _blocks(messages: list[dict[str, Any]], role: str, kind: str) -> list[dict[str, Any]]:
    return [
        block
        for m in messages
        if m.get("role") == role and isinstance(m.get("content"), list)
        for block in m["content"]
        if isinstance(block, dict) and block.get("type") == kind
    ]


def _tool_results(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The results of the script's steps, and how many searches came back since the last
    one."""
    searches = {b.get("id") for b in _blocks(messages, "assistant", "tool_use")
                if b.get("name") == SEARCH}  # fmt: skip
    results: list[dict[str, Any]] = []
    since = 0
    for block in _blocks(messages, "user", "tool_result"):
        if block.get("tool_use_id") in searches:
            since += 1
        else:
            results.append(block)
            since = 0
    return results, since


class ScriptedAgentModel(FakeProvider):
    def __init__(self, steps: list[Step], final: str) -> None:
        super().__init__("anthropic")
        self.steps = steps
        self.final = final
        self.outcome = Outcome()
        self._turns = threading.Lock()

    def reply_for(self, body: bytes) -> Reply:
        request = json.loads(body)
        names = [str(t.get("name")) for t in request.get("tools") or []]
        if not any(SERVER in name for name in names) and SEARCH not in names:
            return Reply(text="ok")
        with self._turns:
            return self._turn(names, *_tool_results(request.get("messages") or []))

    def _turn(self, names: list[str], results: list[dict[str, Any]], searched: int) -> Reply:
        out = self.outcome
        out.tool_names = names
        done = len(results)
        if done > len(self.steps):
            out.failures.append(f"{done} tool results for {len(self.steps)} steps")
            return Reply(text="FAILED: more tool results than steps")
        if done:
            problem = self._check(self.steps[done - 1], results[-1])
            out.results[done - 1 :] = [_text(results[-1].get("content"))]
            if problem:
                out.failures.append(f"step {done} ({self.steps[done - 1].tool}): {problem}")
                return Reply(text=f"FAILED: {problem}")
        if done == len(self.steps):
            out.finished = True
            return Reply(text=self.final)
        step = self.steps[done]
        name = step.tool if step.local else self._resolve(names, step.tool)
        if name is None and SEARCH in names and searched < MAX_SEARCHES:
            out.searches.append(step.tool)
            query = {"query": step.tool.replace("_", " "), "limit": 8}
            return Reply(text=f"Looking for {step.tool}.", tool_call=(SEARCH, query),
                         call_id=f"toolu_s{len(out.searches):02d}")  # fmt: skip
        if name is None:
            out.failures.append(f"step {done + 1}: no tool {step.tool!r} among {names}")
            return Reply(text=f"FAILED: no tool {step.tool}")
        return Reply(text=f"Step {done + 1}: {step.tool}.", tool_call=(name, step.arguments),
                     call_id=f"toolu_{done + 1:02d}")  # fmt: skip

    @staticmethod
    def _resolve(names: list[str], tool: str) -> str | None:
        found = [n for n in names if SERVER in n and n.endswith(tool)]
        return found[0] if len(found) == 1 else None

    @staticmethod
    def _check(step: Step, result: dict[str, Any]) -> str | None:
        text = _text(result.get("content"))
        if bool(result.get("is_error")) != step.error:
            return f"is_error={result.get('is_error')!r}, expected {step.error}: {text[:500]}"
        if not re.search(step.expect, text):
            return f"no {step.expect!r} in the result: {text[:1000]}"
        return None

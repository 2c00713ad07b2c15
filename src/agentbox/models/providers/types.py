"""The neutral model request and answer every adapter translates to and from.

Requests are pydantic models (they arrive from agents and are validated); answers are
frozen dataclasses (built by adapters from already-parsed JSON).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it (it may be invalid JSON)


@dataclass(frozen=True)
class Image:
    """An image a user turn or a tool result carries: base64 ``data`` of ``media_type``,
    or a ``url`` the provider fetches. Images are not redacted (they are not text)."""

    media_type: str = ""
    data: str = ""
    url: str = ""

    def data_url(self) -> str:
        return self.url or f"data:{self.media_type};base64,{self.data}"


class Message(_Strict):
    """One turn of the conversation; system prompts go in ``ChatRequest.system``, because
    Anthropic accepts them nowhere else. An assistant turn may call tools
    (``tool_calls``); each result comes back as a ``tool`` turn naming its call. User
    and tool turns may carry images after their text."""

    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    images: tuple[Image, ...] = ()
    is_error: bool = False  # a tool turn whose tool failed


class Tool(_Strict):
    """A function the model may call; ``parameters`` is its arguments' JSON Schema."""

    name: str = Field(min_length=1, max_length=64)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ChatRequest(_Strict):
    """A chat completion, independent of the vendor.

    ``model`` None means each provider's default (the first of its configured ``models``).
    ``stream`` records what the caller asked for; ``ProviderPool.complete`` and
    ``ProviderPool.stream`` decide the wire mode. Calls of ``tools`` come back in
    ``ChatResponse.tool_calls``, or as ``tool_call`` stream events.
    """

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: str | None = None
    # None: no limit of ours (an OpenAI provider is sent none: the model's own applies;
    # Anthropic, which requires one, gets anthropic.DEFAULT_MAX_TOKENS).
    max_tokens: int | None = Field(default=1024, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: list[str] | None = None  # sequences that end the answer
    stream: bool = False
    tools: list[Tool] | None = None
    # auto (the default), required (some tool), none, or one tool's name (that tool)
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None  # False: at most one call per answer
    # OpenAI's reasoning effort (minimal … high): sent to an openai provider; another
    # model reasons as it does by default (Anthropic's thinking would come back as signed
    # blocks that an OpenAI-format client cannot carry to the next turn).
    reasoning_effort: str | None = None
    # OpenAI's answer length (low, high): sent to an openai provider; for Anthropic the
    # same request in words, in the system prompt (anthropic.VERBOSITY).
    verbosity: str | None = None
    # The client's other top-level fields (response_format, metadata, seed, …), in its
    # own format: sent only to a provider of that kind, never translated.
    extra: dict[str, Any] | None = None
    extra_kind: Literal["openai", "anthropic"] | None = None
    # The client's whole body, for a provider of ``extra_kind`` (Anthropic clients): what
    # it sends instead of a translation, so thinking blocks and their signatures,
    # cache_control marks and documents arrive as they left the client.
    native: dict[str, Any] | None = None
    # Anthropic betas the client asked for that are safe (anthropic.SAFE_BETAS): sent
    # as anthropic-beta to an Anthropic provider; another has no such features.
    betas: tuple[str, ...] = ()
    # Why only a provider of ``extra_kind`` can serve the request (content with no
    # translation, such as a document), or None.
    native_only: str | None = None

    def requires(self) -> tuple[str, str] | None:
        """(provider kind, why) when only a provider of that kind can serve the request
        as asked; None when any provider can."""
        if self.native_only is not None and self.extra_kind is not None:
            return self.extra_kind, self.native_only
        return None

    def redacted(self, redact_text: Callable[[str], str]) -> ChatRequest:
        """A copy whose every text passed ``redact_text`` (what leaves the host)."""
        seen: dict[str, str] = {}  # the native body repeats the messages' texts

        def redact(text: str) -> str:
            if text not in seen:
                seen[text] = redact_text(text)
            return seen[text]

        messages = [
            m.model_copy(
                update={
                    "content": redact(m.content),
                    "tool_calls": tuple(
                        ToolCall(c.id, c.name, redact(c.arguments)) for c in m.tool_calls
                    ),
                }
            )
            for m in self.messages
        ]
        system = None if self.system is None else redact(self.system)
        extra = None if self.extra is None else _redact_strings(self.extra, redact)
        native = None if self.native is None else _redact_strings(self.native, redact)
        return self.model_copy(
            update={"messages": messages, "system": system, "extra": extra, "native": native}
        )


# Block type -> its field that is not text.
_OPAQUE = {"base64": "data", "redacted_thinking": "data", "thinking": "signature"}


def _redact_strings(value: Any, redact: Callable[[str], str]) -> Any:
    """``value`` (parsed JSON) with every string, keys too, passed through ``redact``;
    but not what is not text: base64 sources (images, PDFs: the neutral form's images are
    not redacted either), a thinking block's ``signature`` and a redacted_thinking block
    (opaque proofs only their issuer reads; thinking text that was redacted fails its
    signature at the provider, which is right: the secret did not leave)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        # Only that one field of those blocks: the rest (keys, other fields) is redacted.
        opaque = _OPAQUE.get(str(value.get("type")))
        return {
            redact(k): v if k == opaque and isinstance(v, str) else _redact_strings(v, redact)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redact_strings(v, redact) for v in value]
    return value


@dataclass(frozen=True)
class Usage:
    """Tokens as the provider counted them (a server that reports none gives zeros).

    ``input_tokens`` counts every input token, those read from the provider's prompt
    cache (``cache_read_tokens``) and those written to it (``cache_write_tokens``)
    included: each vendor's own words are rebuilt from these at the edges."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class Reasoning:
    """A model's thinking, as Anthropic returns it: ``text`` with the ``signature`` that
    lets the next turn send it back, or a redacted block's opaque ``redacted`` data."""

    text: str = ""
    signature: str = ""
    redacted: str = ""


@dataclass(frozen=True)
class ChatResponse:
    """``finish_reason`` is normalised to OpenAI's words: stop, length, tool_calls, …;
    ``raw`` is the provider's JSON, for debugging and fields not modelled here."""

    text: str
    model: str
    provider: str
    usage: Usage
    finish_reason: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    reasoning: list[Reasoning] = field(default_factory=list)  # before the text
    stop_sequence: str | None = None  # the stop sequence that ended the answer, if known


@dataclass(frozen=True)
class StreamEvent:
    """``text``: the next piece of the answer (never empty). ``tool_call``: one complete
    call (adapters gather a call's pieces). ``reasoning``: the next piece of a thinking
    block's text; ``reasoning_done`` ends the block (``reasoning.signature``), or is a
    whole redacted block (``reasoning.redacted``). ``done``: the last event, with the
    usage, the finish reason, the stop sequence and who answered."""

    kind: Literal["text", "tool_call", "reasoning", "reasoning_done", "done"]
    text: str = ""
    tool_call: ToolCall | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    model: str | None = None
    provider: str | None = None
    reasoning: Reasoning | None = None
    stop_sequence: str | None = None


class Category(StrEnum):
    """What a failed provider call means for what the pool does next."""

    RATE_LIMITED = "rate_limited"  # retry after Retry-After, then fail over
    SERVER_ERROR = "server_error"  # retry with backoff, then fail over
    TIMEOUT = "timeout"
    CONNECTION = "connection"  # refused, reset, or a stream cut short
    MALFORMED = "malformed"  # an answer that does not follow the protocol
    AUTH = "auth"  # bad or missing key, account unusable: demote at once
    BAD_REQUEST = "bad_request"  # the request is wrong: raise, never retry

    @property
    def retryable(self) -> bool:
        return self not in (Category.AUTH, Category.BAD_REQUEST)


class ProviderFailure(Exception):
    """Raised by adapters, handled by the pool (never seen by callers)."""

    def __init__(
        self,
        category: Category,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.category = category
        self.message = message
        self.status = status
        self.retry_after = retry_after  # seconds, from the provider's Retry-After

    def answer(self, provider: str) -> dict[str, Any]:
        """How ``AllProvidersFailed`` reports it."""
        return {
            "provider": provider,
            "status": self.status,
            "category": self.category.value,
            "message": self.message,
        }

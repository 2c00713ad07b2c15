"""The gateway's one JSON decoder for request bodies: hostile bodies are a typed
InvalidRequest (never RecursionError, ValueError or a value no encoder can write), and
every body within the bounds decodes exactly as the stdlib decodes it."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbox.errors import InvalidRequest
from agentbox.gateway import jsonbody
from agentbox.gateway.jsonbody import MAX_DEPTH, MAX_INT, MIN_INT

BOUNDED = settings(max_examples=300, derandomize=True, deadline=None)


def nested(depth: int, inner: bytes = b"1", opener: bytes = b"[") -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    if opener == b"{":
        return b'{"k":' * depth + inner + closer * depth
    return opener * depth + inner + closer * depth


def depth_of(value: Any) -> int:
    stack, deepest = [(value, 1)], 0
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


@pytest.mark.parametrize("opener", [b"[", b"{"])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5_000, 100_000])
def test_deep_nesting_is_refused_without_recursion(opener: bytes, depth: int) -> None:
    with pytest.raises(InvalidRequest, match="nests deeper"):
        jsonbody.loads(nested(depth, opener=opener))
    with pytest.raises(InvalidRequest, match="nests deeper"):
        jsonbody.loads(b'{"arguments": {"x": ' + nested(depth, opener=opener) + b"}}")


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"a":' * 100_000, b"[1," * 100_000])
def test_deep_unterminated_nesting_is_refused(body: bytes) -> None:
    with pytest.raises(InvalidRequest, match="nests deeper"):
        jsonbody.loads(body)


def test_the_limit_itself_and_brackets_inside_strings_pass() -> None:
    assert depth_of(jsonbody.loads(nested(MAX_DEPTH))) == MAX_DEPTH
    text = json.dumps({"s": "[" * 10_000 + '\\"{' * 1000, "t": ["]]]"]}).encode()
    assert jsonbody.loads(text)["t"] == ["]]]"]


@pytest.mark.parametrize(
    "literal",
    [str(MAX_INT + 1), str(MIN_INT - 1), "9" * 4301, "9" * 100_000, "-" + "1" * 5000],
)
def test_integers_past_64_bits_are_refused(literal: str) -> None:
    with pytest.raises(InvalidRequest, match="64 bits"):
        jsonbody.loads(f'{{"arguments": {{"offset": {literal}}}}}'.encode())


def test_64_bit_integers_pass() -> None:
    assert jsonbody.loads(f"[{MAX_INT}, {MIN_INT}, 0, -0]".encode()) == [MAX_INT, MIN_INT, 0, 0]


@pytest.mark.parametrize("literal", ["1e999", "-1e999", "NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(literal: str) -> None:
    with pytest.raises(InvalidRequest):
        jsonbody.loads(f'{{"x": {literal}}}'.encode())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"arguments": {"path": "/workspace/\\ud800"}}', "arguments.path"),
        (b'{"arguments": {"env": {"\\udfff": "x"}}}', "arguments.env"),
        (b'{"env": {"A": "x\\udc80y"}}', "env.A"),
        (b'{"argv": ["ls", "\\ud83d"]}', "argv[1]"),
        (b'"\\ud800"', ""),
    ],
)
def test_lone_surrogates_are_refused_naming_the_field(body: bytes, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        jsonbody.loads(body)
    assert caught.value.details["field"] == field
    assert "surrogate" in caught.value.message


def test_paired_surrogates_and_escaped_backslashes_pass() -> None:
    assert jsonbody.loads(b'["\\ud83d\\ude00", "\\\\ud800"]') == ["\U0001f600", "\\ud800"]


@pytest.mark.parametrize("body", [b"\xff\xfe[]", b'["\xed\xa0\x80"]', b"[1,]", b""])
def test_not_utf8_or_not_json_is_invalid_request(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        jsonbody.loads(body)


@pytest.mark.parametrize(
    ("text", "ok"),
    [("0", True), (str(MAX_INT), True), (str(MAX_INT + 1), False), ("-1", False),
     ("9" * 30, False), ("²", False), ("1e3", False), ("", False), (" 1", False)],
)  # fmt: skip
def test_header_integers_are_bounded(text: str, ok: bool) -> None:
    if ok:
        assert jsonbody.parse_int(text, "the X header") == int(text)
    else:
        with pytest.raises(InvalidRequest, match="the X header"):
            jsonbody.parse_int(text, "the X header")


# Hostile JSON values: huge integers, non-finite floats, any text (surrogates included).
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF))  # surrogates too
)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=30,
)


def _stdlib_text(value: Any) -> bytes:
    # ensure_ascii: lone surrogates go as \\u escapes, like a hostile client sends them
    return json.dumps(value).encode()


def _in_bounds(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in item):
            return False
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, int) and not MIN_INT <= item <= MAX_INT:
            return False
        if isinstance(item, float) and not abs(item) < float("inf"):
            return False
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return depth_of(value) <= MAX_DEPTH


@BOUNDED
@given(VALUES, st.integers(min_value=0, max_value=3 * MAX_DEPTH))
def test_any_value_decodes_as_the_stdlib_does_or_is_refused(value: Any, wrap: int) -> None:
    for _ in range(wrap):
        value = {"k": value}
    text = _stdlib_text(value)
    try:
        decoded = jsonbody.loads(text)
    except InvalidRequest:
        assert not _in_bounds(value)
        return
    assert _in_bounds(value)
    assert json.dumps(decoded) == json.dumps(json.loads(text))


@BOUNDED
@given(st.binary(max_size=200) | st.text(alphabet='[]{}"\\,:1e-.NaIfiuy ').map(str.encode))
def test_arbitrary_bytes_are_values_or_invalid_requests(body: bytes) -> None:
    with contextlib.suppress(InvalidRequest):  # anything else escapes and fails the test
        jsonbody.loads(body)


class _Text(str):
    """A str subclass (as a StrEnum member is): handled as text, not passed through."""


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
    max_leaves=20,
))  # fmt: skip
@BOUNDED
def test_encodable_leaves_what_encodes_unchanged_and_fixes_lone_surrogates(value: Any) -> None:
    out = jsonbody.encodable(value)
    json.dumps(out)  # never raises, whatever surrogates the text held
    text = json.dumps(value, ensure_ascii=True)
    if "\\ud8" not in text.lower() and "\\udc" not in text.lower():
        assert out == value or value != value  # NaN is never equal to itself


def test_encodable_replaces_surrogates_in_keys_values_and_subclasses_at_any_depth() -> None:
    bad = "a\udcff"
    value = {bad: [bad, (1, _Text(bad)), {"k": bad}], "ok": 1.5, "n": None, "t": True}
    assert jsonbody.encodable(value) == {
        "a\ufffd": ["a\ufffd", [1, "a\ufffd"], {"k": "a\ufffd"}], "ok": 1.5, "n": None,
        "t": True,
    }  # fmt: skip

"""The gateway checks tool arguments with jsonschema-rs first and takes only its "valid": it
must never accept what the Python validator (the authority, which writes the messages)
rejects. Differential, over the real tool schemas and arguments near them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentbox.errors import InvalidRequest
from agentbox.gateway.service import _FAST_VALIDATORS, _VALIDATORS, Gateway
from agentbox.gateway.tools import TOOLS

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["", "br-0123456789ab", "f1e2", "e7", "/workspace", "\n", "a\n"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _arguments(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    names = [*sorted(schema.get("properties", {})), "unexpected"]
    return st.dictionaries(st.sampled_from(names), VALUES, max_size=len(names))


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_fast_check_never_accepts_what_jsonschema_rejects(tool: Any) -> None:
    slow, fast = _VALIDATORS[tool.name], _FAST_VALIDATORS[tool.name]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_arguments(tool.input_schema))
    def check(args: dict[str, Any]) -> None:
        if fast.is_valid(args):
            assert slow.is_valid(args), args

    check()


def test_invalid_arguments_keep_their_message() -> None:
    spec = next(t for t in TOOLS if t.name == "fs_read")
    with pytest.raises(InvalidRequest, match="invalid arguments for fs_read: path"):
        Gateway._validate(spec, {"path": ""})
    with pytest.raises(InvalidRequest, match="invalid arguments for fs_read: offset"):
        Gateway._validate(spec, {"path": "a", "offset": -1})
    Gateway._validate(spec, {"path": "a", "offset": 1.0})  # a whole float is an integer

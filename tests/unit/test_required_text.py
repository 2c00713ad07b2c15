"""The runtime checks the text arguments in-process callers pass through one helper
(``fsutil.required_text``): the same words for every empty or NUL-bearing argument, the
argument named in ``details["field"]``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentbox.errors import InvalidRequest
from agentbox.fsutil import required_text
from agentbox.runtime.commands import normalise_argv
from agentbox.runtime.files import _normalize


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [
        (lambda: normalise_argv("  \n"), "the command", "is empty: pass a shell string"),
        (lambda: normalise_argv([]), "the argv's program", "is empty: pass at least its name"),
        (lambda: normalise_argv([""]), "the argv's program", "is empty"),
        (lambda: normalise_argv("echo \0"), "the command", "contains a NUL byte"),
        (lambda: _normalize("", "/workspace"), "the path", "is empty: name a file, e.g. /wo"),
        (lambda: _normalize("a\0b", "/workspace"), "the path", "contains a NUL byte"),
        (lambda: _normalize(3, "/workspace"), "the path", "must be a string, got int"),
    ],
)
def test_one_helper_one_wording(call: Callable[[], Any], field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        call()
    assert info.value.message.startswith(f"{field} {words}"), info.value.message
    assert info.value.details["field"] == field


def test_blank_is_empty_only_where_asked() -> None:
    assert required_text(" ", "the path", "x") == " "  # a file may be named " "
    with pytest.raises(InvalidRequest, match="is empty"):
        required_text(" ", "the command", "x", blank=True)

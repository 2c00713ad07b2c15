"""Small pure pieces: size/duration parsing, the error tree, bounded output capture."""

from __future__ import annotations

import pytest

import agentbox
from agentbox import errors
from agentbox.runtime.output import BoundedCapture
from agentbox.units import format_size, human_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 * 1024**2),
        ("2G", 2 * 1000**3),
        ("1.5KiB", 1536),
        (4096, 4096),
        ("10 gib", 10 * 1024**3),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "-1GiB", "5 parsecs", "0", True, {}, [], None])
def test_parse_size_refuses(bad: object) -> None:
    with pytest.raises(errors.InvalidRequest) as err:
        parse_size(bad, "memory")  # type: ignore[arg-type]
    assert "memory" in err.value.message


def test_parse_duration() -> None:
    assert parse_duration("15m") == 900
    assert parse_duration("250ms") == 0.25
    assert parse_duration(3) == 3.0
    with pytest.raises(errors.InvalidRequest):
        parse_duration("soon")
    for bad in ({}, [], None):  # what JSON or YAML can hold: a typed error, never a crash
        with pytest.raises(errors.InvalidRequest, match="ask_timeout"):
            parse_duration(bad, "ask_timeout")  # type: ignore[arg-type]


def test_human_size() -> None:
    assert human_size(128 * 1024**2) == "128MiB"
    assert human_size(3 * 1024**3 // 2) == "1.5GiB"
    assert human_size(900) == "900B" and human_size(2 * 1024**4) == "2TiB"


def test_format_size() -> None:
    assert format_size(512 * 1024**2) == "512MiB"
    assert format_size(1000) == "1000B"


def test_every_error_has_a_unique_code_and_round_trips() -> None:
    classes = [getattr(errors, name) for name in errors.__all__]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))
    for cls in classes:
        again = errors.AgentboxError.from_dict(cls("msg", k=1).to_dict())
        assert type(again) is cls and again.message == "msg" and again.details == {"k": 1}
    assert issubclass(errors.PathEscape, errors.PermissionDenied)


def test_unknown_code_becomes_the_base_error() -> None:
    err = errors.AgentboxError.from_dict({"code": "from_the_future", "message": "m"})
    assert type(err) is errors.AgentboxError


def test_public_api() -> None:
    for name in agentbox.__all__:
        assert getattr(agentbox, name) is not None


def test_capture_keeps_everything_under_the_limit() -> None:
    cap = BoundedCapture(10)
    cap.feed(b"abc")
    cap.feed(b"def")
    assert (cap.value(), cap.truncated, cap.total) == (b"abcdef", False, 6)


def test_capture_keeps_head_and_tail_and_marks_the_cut() -> None:
    cap = BoundedCapture(10)
    for i in range(1000):
        cap.feed(bytes([48 + i % 10]) * 7)
    value = cap.value()
    assert cap.truncated and cap.total == 7000
    assert value.startswith(b"0000011111"[:5])
    assert value.endswith(b"9" * 5)
    assert b"[agentbox: 6990 bytes (0 lines) of output cut here]" in value


def test_capture_cuts_at_line_ends_and_counts_lines() -> None:
    cap = BoundedCapture(40, "stdout")
    cap.feed(b"".join(b"%d\n" % i for i in range(1, 1001)))
    value = cap.value("see /tmp/x")
    head, marker, tail = value.split(b"\n[", 1)[0], *value.split(b"\n[", 1)[1].split(b"]\n")
    assert head.endswith(b"\n") is False and head.split(b"\n")[0] == b"1"
    assert tail.endswith(b"1000\n") and not tail.startswith(b"\n")
    assert all(line.isdigit() for line in (head + b"\n" + tail).split())  # whole lines only
    kept_lines = (head + b"\n" + tail).count(b"\n")
    assert marker == b"agentbox: %d bytes (%d lines) of stdout cut here; see /tmp/x" % (
        cap.total - len(head) - 1 - len(tail),
        1000 - kept_lines,
    )


def test_capture_spools_the_whole_stream_up_to_keep() -> None:
    data = bytes(range(256)) * 40_000  # 10 MB: the spool goes to a temp file past 1 MiB
    cap = BoundedCapture(100, "stdout", keep=len(data))
    for i in range(0, len(data), 65536):
        cap.feed(data[i : i + 65536])
    assert cap.saved_complete and b"".join(cap.saved_chunks()) == data
    small = BoundedCapture(100, "stdout", keep=1000)
    small.feed(data[:5000])
    assert not small.saved_complete and b"".join(small.saved_chunks()) == data[:1000]
    cap.close()
    small.close()


def test_capture_listener_sees_everything() -> None:
    seen: list[tuple[str, bytes]] = []
    cap = BoundedCapture(2, "stdout", lambda s, b: seen.append((s, b)))
    cap.feed(b"hello")
    assert seen == [("stdout", b"hello")] and cap.value().startswith(b"h")


def test_error_classes_defined_elsewhere_round_trip() -> None:
    from agentbox.policy.tool_policy import UnparseableCommand

    again = errors.AgentboxError.from_dict(UnparseableCommand("x").to_dict())
    assert type(again) is UnparseableCommand


def test_every_error_a_caller_can_see_is_defined_in_errors_py() -> None:
    """One error tree: an AgentboxError subclass defined in another module is one the
    tree's picture (errors.py's docstring) and its users do not know about."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(agentbox.__path__, "agentbox."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra this host lacks (e.g. a database driver)
            continue
    elsewhere = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in errors._all_subclasses(errors.AgentboxError)
        if cls.__module__ != "agentbox.errors"
    ]
    assert not elsewhere, f"error classes outside errors.py: {elsewhere}"
    pictured = errors.__doc__ or ""
    missing = [c.__name__ for c in errors._all_subclasses(errors.AgentboxError)
               if c.__name__ not in pictured or c.code not in pictured]  # fmt: skip
    assert not missing, f"errors.py's tree does not show {missing}"


def test_the_command_rule_of_an_unparseable_command_is_the_analysers() -> None:
    from agentbox.policy.shell_analysis import RULE_UNPARSEABLE

    assert errors.UnparseableCommand("x").rule == RULE_UNPARSEABLE
    assert errors.UnparseableCommand("x", rule="r").details == {"rule": "r"}

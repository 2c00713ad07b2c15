"""Small pure pieces: size/duration parsing, the error tree, bounded output capture."""

from __future__ import annotations

import pytest

import agentbox
from agentbox import errors
from agentbox.runtime.output import BoundedCapture
from agentbox.units import format_size, parse_duration, parse_size


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


@pytest.mark.parametrize("bad", ["", "lots", "-1GiB", "5 parsecs", "0", True])
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
    assert b"[agentbox: 6990 bytes truncated]" in value


def test_capture_listener_sees_everything() -> None:
    seen: list[tuple[str, bytes]] = []
    cap = BoundedCapture(2, "stdout", lambda s, b: seen.append((s, b)))
    cap.feed(b"hello")
    assert seen == [("stdout", b"hello")] and cap.value().startswith(b"h")


def test_error_classes_defined_elsewhere_round_trip() -> None:
    from agentbox.gateway.policy import UnparseableCommand

    again = errors.AgentboxError.from_dict(UnparseableCommand("x").to_dict())
    assert type(again) is UnparseableCommand

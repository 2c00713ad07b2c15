"""The secret scan run over a sandbox's files before a snapshot: what it finds, what it
never reveals, what the allow-list waives, and that a hostile tree cannot lead it astray."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agentbox.errors import InvalidRequest
from agentbox.storage import secretscan
from agentbox.storage.secretscan import (
    AllowList,
    Finding,
    format_report,
    redact_file,
    scan_tree,
)

# Built from parts so that this file itself does not look like a leak.
AWS_ID = "AKIA" + "Q3RZ7T2XW4VB6N8M"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYzQ9kPm2LsT"  # 40, as AWS makes them
KEY_BODY = "MIIEowIBAAKCAQEA7x" + "Yz0123456789abcdefghij"
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    f"{KEY_BODY}\n"
    "c2VjcmV0LWtleS1tYXRlcmlhbA==\n"
    "-----END RSA PRIVATE KEY-----\n"
)
CREDENTIALS = f"[default]\n\naws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}\n"
VALUES = (AWS_ID, AWS_SECRET, KEY_BODY)


def plant(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        else:
            path.write_bytes(content)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return plant(
        tmp_path / "root",
        {
            "home/user/.aws/credentials": CREDENTIALS,
            "home/user/.ssh/id_rsa": "# deploy key\n" + PEM,
            "work/settings.py": f"DEBUG = True\nAWS_SECRET_KEY = '{AWS_SECRET}'  # aws key\n",
            "work/README.md": "nothing to see here\n",
        },
    )


EXPECTED = [
    Finding("home/user/.aws/credentials", 3, "AWS Access Key"),
    Finding("home/user/.aws/credentials", 4, "AWS Access Key"),
    Finding("home/user/.ssh/id_rsa", 2, "Private Key"),
    Finding("work/settings.py", 2, "AWS Access Key"),
]


def test_planted_secrets_are_found_with_path_line_and_kind(tree: Path) -> None:
    result = scan_tree(tree)
    assert list(result) == EXPECTED
    assert result.over_budget == [] and result.skipped_unreadable == []


def test_secret_values_never_appear_in_findings_or_report(tree: Path) -> None:
    result = scan_tree(tree)
    shown = [repr(result), str(result), format_report(result), *map(repr, result)]
    for text in shown:
        for value in VALUES:
            assert value not in text
    report = format_report(result)
    assert "home/user/.aws/credentials:3: AWS Access Key" in report
    assert "home/user/.ssh/id_rsa:2: Private Key" in report
    assert "--redact" in report and "allow-list" in report


def test_report_of_nothing() -> None:
    assert format_report([]) == "No secrets found."


def test_allow_list_by_glob_line_and_kind(tree: Path, tmp_path: Path) -> None:
    by_glob = AllowList.parse("# fixtures\n\nhome/user/.ssh/*\n")
    assert [f.path for f in scan_tree(tree, by_glob)] == [
        "home/user/.aws/credentials",
        "home/user/.aws/credentials",
        "work/settings.py",
    ]
    by_line = AllowList.parse("home/*/credentials:4\n./work/settings.py:2\n")
    assert list(scan_tree(tree, by_line)) == [EXPECTED[0], EXPECTED[2]]
    allow_file = tmp_path / "allow.txt"
    allow_file.write_text("kind=AWS Access Key  # not a comment: whole line is the kind\n")
    with pytest.raises(InvalidRequest):
        AllowList.from_file(allow_file)
    allow_file.write_text("kind=AWS Access Key\nkind=private-key\n")  # either spelling
    assert list(scan_tree(tree, AllowList.from_file(allow_file))) == []


def test_a_glob_star_crosses_directories(tree: Path) -> None:
    assert list(scan_tree(tree, AllowList.parse("home/*\nwork/*.py\n"))) == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("kind=Not A Detector", "unknown secret type"),
        ("kind=", "unknown secret type"),
        ("work/settings.py:", "line number"),
        ("work/settings.py:0", "line number"),
        (":12", "missing path glob"),
    ],
)
def test_bad_allow_list_lines_name_file_and_line(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "allow.txt"
    path.write_text(f"# header\n\ngood/*\n{line}\n")
    with pytest.raises(InvalidRequest) as caught:
        AllowList.from_file(path)
    assert f"{path}:4:" in caught.value.message and problem in caught.value.message
    assert caught.value.details == {"file": str(path), "line": 4}


def test_missing_allow_list_file_is_an_invalid_request(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="cannot read the allow-list"):
        AllowList.from_file(tmp_path / "nope.txt")


def test_redact_file_removes_every_value_and_keeps_the_rest(tree: Path) -> None:
    result = scan_tree(tree)
    for rel in ("home/user/.aws/credentials", "home/user/.ssh/id_rsa", "work/settings.py"):
        data = (tree / rel).read_bytes()
        redacted = redact_file(data, [f for f in result if f.path == rel]).decode()
        for value in VALUES:
            assert value not in redacted
    creds = redact_file(
        CREDENTIALS.encode(), [f for f in result if f.path.endswith("credentials")]
    ).decode()
    assert creds == (
        "[default]\n\naws_access_key_id = [REDACTED:AWS Access Key]\n"
        "aws_secret_access_key = [REDACTED:AWS Access Key]\n"
    )
    key = redact_file(
        ("# deploy key\n" + PEM).encode(), [Finding("id_rsa", 2, "Private Key")]
    ).decode()
    assert key == "# deploy key\n[REDACTED:Private Key]\n"
    quoted = redact_file(
        f"AWS_SECRET_KEY = '{AWS_SECRET}'  # aws key\n".encode(),
        [Finding("s.py", 1, "AWS Access Key")],
    ).decode()
    assert quoted == "AWS_SECRET_KEY = '[REDACTED:AWS Access Key]'  # aws key\n"


def test_redact_file_touches_only_the_findings_given() -> None:
    data = f"a = {AWS_ID}\nb = {AWS_ID}\n".encode()
    assert redact_file(data, [Finding("f", 2, "AWS Access Key")]) == (
        f"a = {AWS_ID}\nb = [REDACTED:AWS Access Key]\n".encode()
    )
    assert redact_file(data, []) == data


def test_redact_file_replaces_the_whole_line_when_the_value_moved() -> None:
    data = b"first\nsecond line changed since the scan\r\nthird"
    assert redact_file(data, [Finding("f", 2, "AWS Access Key")]) == (
        b"first\n[REDACTED:AWS Access Key]\r\nthird"
    )
    assert redact_file(data, [Finding("f", 3, "Private Key")]) == (
        b"first\nsecond line changed since the scan\r\n[REDACTED:Private Key]"
    )


def test_redact_file_keeps_invalid_utf8_bytes() -> None:
    data = b"\xff\xfe junk " + AWS_ID.encode() + b" \x80\n"
    assert redact_file(data, [Finding("f", 1, "AWS Access Key")]) == (
        b"\xff\xfe junk [REDACTED:AWS Access Key] \x80\n"
    )


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    outside = plant(tmp_path / "outside", {"creds": CREDENTIALS, "dir/key.pem": PEM})
    root = tmp_path / "root"
    root.mkdir()
    (root / "shadow").symlink_to("/etc/shadow")
    (root / "host-creds").symlink_to(outside / "creds")
    (root / "host-dir").symlink_to(outside / "dir")
    (root / "up").symlink_to("..")
    assert list(scan_tree(root)) == []
    assert scan_tree(root).skipped_unreadable == []


def test_a_symlinked_root_is_refused(tmp_path: Path) -> None:
    plant(tmp_path / "real", {"creds": CREDENTIALS})
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(InvalidRequest, match="cannot scan"):
        scan_tree(tmp_path / "link")
    with pytest.raises(InvalidRequest, match="cannot scan"):
        scan_tree(tmp_path / "missing")


@pytest.mark.timeout(30)
def test_a_fifo_and_a_socket_do_not_hang_the_scan(tmp_path: Path) -> None:
    import socket

    root = plant(tmp_path / "root", {"after/creds": CREDENTIALS})
    os.mkfifo(root / "a-fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "a-socket"))
        assert [f.path for f in scan_tree(root)] == ["after/creds", "after/creds"]


def test_binary_files_and_invalid_utf8_are_scanned(tmp_path: Path) -> None:
    root = plant(
        tmp_path / "root",
        {
            "blob.bin": b"\x00\x01\x02" + AWS_ID.encode(),
            "latin1.txt": b"caf\xe9 \xff\xfe\n" + f"key = {AWS_ID}\n".encode(),
        },
    )
    assert list(scan_tree(root)) == [
        Finding("blob.bin", 1, "AWS Access Key"),
        Finding("latin1.txt", 2, "AWS Access Key"),
    ]


def test_what_is_past_the_scan_budget_is_listed_with_its_reason(tmp_path: Path) -> None:
    root = plant(tmp_path / "root", {"big.log": "x" * 2000 + AWS_ID, "small": AWS_ID})
    result = scan_tree(root, max_scan_bytes=1000)
    assert list(result) == []  # big.log (first) used the budget up, and hid its secret
    assert result.over_budget == ["big.log", "small"]
    assert result.unscanned() == [
        {"path": "big.log", "reason": "over the scan budget"},
        {"path": "small", "reason": "over the scan budget"},
    ]


def test_unreadable_and_too_deep_directories_are_listed_not_fatal(tmp_path: Path) -> None:
    root = tmp_path / "root"
    deep = root.joinpath(*["d"] * 210)
    deep.mkdir(parents=True)
    (deep / "creds").write_text(CREDENTIALS)
    (root / "top").write_text(f"k={AWS_ID}\n")
    result = scan_tree(root)
    assert list(result) == [Finding("top", 1, "AWS Access Key")]
    assert len(result.skipped_unreadable) == 1
    assert result.skipped_unreadable[0].startswith("d/d/")


def test_hostile_file_names_cannot_forge_report_lines(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    name = b"x\nfake.txt:1: Nothing \x1b[2J\xff"
    with open(os.fsencode(root) + b"/" + name, "wb") as f:
        f.write(AWS_ID.encode())
    report = format_report(scan_tree(root))
    assert "\x1b" not in report
    assert "\n  fake.txt" not in report
    assert r"x\nfake.txt:1: Nothing \x1b[2J\xff:1: AWS Access Key" in report


@pytest.mark.parametrize(
    "line",
    [
        f"export AWS_SECRET_ACCESS_KEY={AWS_SECRET}",
        f'AWS_SECRET_ACCESS_KEY="{AWS_SECRET}"',
        f"aws_secret_access_key: {AWS_SECRET}",
    ],
)
def test_unquoted_and_env_style_aws_secrets_are_found(tmp_path: Path, line: str) -> None:
    root = plant(tmp_path / "root", {".env": f"# env\n{line}\n"})
    result = scan_tree(root)
    assert list(result) == [Finding(".env", 2, "AWS Access Key")]
    redacted = redact_file((root / ".env").read_bytes(), result).decode()
    assert AWS_SECRET not in redacted and "[REDACTED:AWS Access Key]" in redacted


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("cloudant_password = 'abcdefghijklmnopqrstuvwx'", "Cloudant Credentials"),
        ("ibm_cloud_iam_key: " + "aB3_-" * 8 + "zZ9q", "IBM Cloud IAM Key"),
        ("softlayer_api_key = " + "a1b2c3d4" * 8, "SoftLayer Credentials"),
        ("ibm_cos_hmac_secret_access_key = " + "0fa9" * 12, "IBM COS HMAC Credentials"),
        ("aws pass = '" + "Ab1/+" * 8 + "'", "AWS Access Key"),
    ],
)
def test_keyword_detectors_still_find_their_values_through_the_value_gate(
    tmp_path: Path, line: str, kind: str
) -> None:
    # A keyword detector's lookbehinds run only on windows that hold a run of its value
    # (storage.secretscan._value_gate); the gate must never stand in a real match's way.
    root = plant(tmp_path / "root", {"conf": f"# settings\n{line}\n"})
    assert Finding("conf", 2, kind) in scan_tree(root)


def test_a_big_file_s_read_ahead_runs_beside_its_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hints cost the reading thread ~0.5 ms a MiB on a fresh clone: another thread
    # gives them, with a descriptor of its own that it closes when it is done.
    import threading
    import time

    calls: list[str] = []
    real = secretscan._read_ahead

    def recording(fd: int, start: int, end: int) -> None:
        if end > start:
            calls.append(threading.current_thread().name)
        real(fd, start, end)

    monkeypatch.setattr(secretscan, "_read_ahead", recording)
    data = os.urandom(20 * secretscan._CHUNK + 123)
    (tmp_path / "big").write_bytes(data)
    fds_before = len(os.listdir("/proc/self/fd"))
    fd = os.open(tmp_path / "big", os.O_RDONLY)
    try:
        scan = secretscan.FileScan("big")
        budget = secretscan.Budget(None)
        got = b"".join(secretscan.read_file(fd, len(data), scan, budget, archive=True))
    finally:
        os.close(fd)
    assert got == data and scan.left_out == 0
    assert calls[0] == threading.current_thread().name  # the first 8 MiB: asked at once
    assert "snapshot-readahead" in calls[1:]
    deadline = time.monotonic() + 5
    while any(t.name == "snapshot-readahead" for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert len(os.listdir("/proc/self/fd")) == fds_before  # its duplicate was closed


def test_a_snapshot_drops_what_it_read_of_a_big_file_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A snapshot reads its clone once: the pages read go as it goes (on the read-ahead
    # thread), not all in the unmount at the end (0.13 s at 1 GB). A plain scan of a
    # tree leaves the page cache alone.
    import threading

    dropped: list[tuple[int, int, str]] = []
    real = secretscan._drop

    def recording(fd: int, start: int, end: int) -> None:
        dropped.append((start, end, threading.current_thread().name))
        real(fd, start, end)

    monkeypatch.setattr(secretscan, "_drop", recording)
    data = os.urandom(20 * secretscan._CHUNK + 123)
    (tmp_path / "big").write_bytes(data)
    fd = os.open(tmp_path / "big", os.O_RDONLY)
    try:
        for archive in (False, True):
            scan, budget = secretscan.FileScan("big"), secretscan.Budget(None)
            assert b"".join(secretscan.read_file(fd, len(data), scan, budget, archive=archive))
            if not archive:
                assert dropped == []
    finally:
        os.close(fd)
    for _ in range(500):  # the thread may still be at it
        if len(dropped) == 2:
            break
        time.sleep(0.01)
    assert [(s, e) for s, e, _ in dropped] == [(0, 8 << 20), (8 << 20, 16 << 20)]
    assert {name for _, _, name in dropped} == {"snapshot-readahead"}

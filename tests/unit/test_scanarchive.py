"""The snapshot archive with its secret scan in the same read (storage/scanarchive.py):
the tar holds the tree as it is (files, holes, links, directories), every stored byte
went through the scan, and what the scan finds is refused or redacted as before, in
held files and streamed ones alike."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from agentbox.errors import InvalidRequest
from agentbox.storage import scanarchive
from agentbox.storage.scanarchive import Outcome, Tree
from agentbox.storage.secretscan import AllowList, Finding, scan_tree

AWS_ID = "AKIA" + "Q3RZ7T2XW4VB6N8M"  # built from parts: this file is not a leak
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
AWS = "AWS Access Key"
CHUNK = 1 << 20


class Sink:
    def __init__(self) -> None:
        self.data = io.BytesIO()

    def write(self, data: bytes) -> int:
        return self.data.write(data)


def tree_of(root: Path, ids: object = None) -> Tree:
    return Tree(
        root,
        ("upper", "workspace"),
        lambda part, rel: f"/{part}/{rel}",
        ids or (lambda uid, gid: (uid, gid)),  # type: ignore[arg-type]
        lambda fd: {},
    )


def at_call(n: int, action: object) -> object:
    """An ``ids`` hook that runs ``action`` on its n-th call: each entry's header asks it,
    a regular file's right after the file is opened and before its data is read."""
    calls = []

    def ids(uid: int, gid: int) -> tuple[int, int]:
        calls.append(1)
        if len(calls) == n:
            action()  # type: ignore[operator]
        return uid, gid

    return ids


def run(root: Path, **kw: object) -> tuple[Outcome, dict[str, tarfile.TarInfo], dict[str, bytes]]:
    sink = Sink()
    outcome = scanarchive.archive(tree_of(root), sink, **kw)  # type: ignore[arg-type]
    members: dict[str, tarfile.TarInfo] = {}
    contents: dict[str, bytes] = {}
    if outcome.complete:
        with tarfile.open(fileobj=io.BytesIO(sink.data.getvalue())) as tar:
            for m in tar:
                members[m.name] = m
                if m.isreg():
                    f = tar.extractfile(m)
                    assert f is not None
                    contents[m.name] = f.read()
    return outcome, members, contents


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "upper" / "etc").mkdir(parents=True)
    (tmp_path / "workspace" / "src").mkdir(parents=True)
    return tmp_path


def test_the_tar_holds_the_tree_as_it_is(root: Path) -> None:
    ws = root / "workspace"
    (ws / "src" / "main.py").write_text("print(1)\n")
    blob = os.urandom(3 * CHUNK + 77)
    (ws / "blob.bin").write_bytes(blob)
    os.link(ws / "blob.bin", ws / "hard.bin")
    (ws / "link").symlink_to("src/main.py")
    with (ws / "sparse").open("wb") as f:  # a hole between two runs of data
        f.write(b"head")
        f.seek(5 * CHUNK)
        f.write(b"tail")
    (root / "upper" / "etc" / "conf").write_text("k=v")
    outcome, members, contents = run(root, hold_bytes=CHUNK)  # blob.bin is streamed
    assert outcome.complete and outcome.findings == [] and outcome.unscanned == []
    assert list(members) == [
        "upper", "upper/etc", "upper/etc/conf", "workspace", "workspace/blob.bin",
        "workspace/hard.bin", "workspace/link", "workspace/sparse", "workspace/src",
        "workspace/src/main.py",
    ]  # fmt: skip
    assert outcome.entries == len(members)
    assert contents["workspace/blob.bin"] == blob
    assert members["workspace/hard.bin"].islnk()
    assert members["workspace/hard.bin"].linkname == "workspace/blob.bin"
    assert members["workspace/link"].linkname == "src/main.py"
    assert contents["workspace/sparse"] == b"head" + bytes(5 * CHUNK - 4) + b"tail"
    assert contents["upper/etc/conf"] == b"k=v"


def test_the_same_tree_gives_the_same_tar(root: Path) -> None:
    (root / "workspace" / "a").write_text("same")
    first, second = Sink(), Sink()
    scanarchive.archive(tree_of(root), first)
    scanarchive.archive(tree_of(root), second)
    assert first.data.getvalue() == second.data.getvalue()


def test_a_file_rewritten_after_the_walk_found_it_is_stored_as_scanned(root: Path) -> None:
    # The scan and the archive are one read: bytes that change between the walk and the
    # read (here: while the header is made, right before the data is read) are the bytes
    # both see. Scanning first and archiving after let such a change through unscanned.
    target = root / "workspace" / "notes.txt"
    benign = b"nothing to see here, just text " + b"." * 30 + b"\n"
    target.write_bytes(benign)
    secret = f"key = {AWS_ID}\n".encode().ljust(len(benign), b" ")

    def rewrite() -> None:
        with target.open("r+b") as f:
            f.write(secret)

    # upper, upper/etc, workspace, then workspace/notes.txt: the 4th header
    refused = scanarchive.archive(tree_of(root, at_call(4, rewrite)), Sink())
    assert refused.findings == [Finding("/workspace/notes.txt", 1, AWS)]
    target.write_bytes(benign)
    sink = Sink()
    redacted = scanarchive.archive(tree_of(root, at_call(4, rewrite)), sink, redact=True)
    assert redacted.complete and redacted.redacted == ["/workspace/notes.txt"]
    with tarfile.open(fileobj=io.BytesIO(sink.data.getvalue())) as tar:
        member = tar.extractfile("workspace/notes.txt")
        assert member is not None
        stored = member.read()
    assert AWS_ID.encode() not in stored and b"[REDACTED:" in stored


def test_whatever_is_stored_scans_clean_or_was_reported(root: Path, tmp_path: Path) -> None:
    # The property itself: unpack what was stored and scan it; every secret in it is one
    # the archive reported (and, with redact, none is left).
    ws = root / "workspace"
    (ws / "a.env").write_text(f"AWS_ACCESS_KEY_ID={AWS_ID}\n")
    (ws / "b.bin").write_bytes(os.urandom(CHUNK) + f"\n{GITHUB}\n".encode())
    (ws / "c.txt").write_bytes(f"x\ntoken = {GITHUB}\n".encode("utf-16"))
    outcome, _, contents = run(root, redact=True)
    assert outcome.complete
    assert {f.path for f in outcome.findings} == {
        "/workspace/a.env", "/workspace/b.bin", "/workspace/c.txt"
    }  # fmt: skip
    unpacked = tmp_path / "unpacked"
    for name, data in contents.items():
        (unpacked / name).parent.mkdir(parents=True, exist_ok=True)
        (unpacked / name).write_bytes(data)
    assert list(scan_tree(unpacked)) == []


def test_a_refusal_lists_every_finding_after_giving_up(root: Path) -> None:
    ws = root / "workspace"
    (ws / "first").write_text(f"k={AWS_ID}\n")
    (ws / "second").write_text(f"\n\n{GITHUB}\n")
    (root / "upper" / "etc" / "creds").write_text(f"aws={AWS_ID}\n")
    outcome, _, _ = run(root)
    assert not outcome.complete
    assert outcome.findings == [
        Finding("/upper/etc/creds", 1, AWS),
        Finding("/workspace/first", 1, AWS),
        Finding("/workspace/second", 3, "GitHub Token"),
    ]


def test_a_secret_in_a_streamed_file_asks_for_a_run_that_holds_it(root: Path) -> None:
    big = root / "workspace" / "big.log"
    big.write_bytes(b"x" * (2 * CHUNK) + f"\nkey = {AWS_ID}\n".encode())
    first, _, _ = run(root, redact=True, hold_bytes=CHUNK)
    assert not first.complete and first.hold == {"/workspace/big.log"}
    second, _, contents = run(root, redact=True, hold_bytes=CHUNK, hold=frozenset(first.hold))
    assert second.complete and second.redacted == ["/workspace/big.log"]
    assert contents["workspace/big.log"].endswith(b"\nkey = [REDACTED:AWS Access Key]\n")


def test_allow_lists_and_hard_links(root: Path) -> None:
    ws = root / "workspace"
    (ws / "fixture").write_text(f"k={AWS_ID}\n")
    os.link(ws / "fixture", ws / "z-copy")  # the same file under a name not allowed
    allow = AllowList.parse("/workspace/fixture\n")
    refused, _, _ = run(root, allow=allow)
    assert refused.findings == [Finding("/workspace/z-copy", 1, AWS)]
    outcome, members, contents = run(root, allow=allow, redact=True)
    assert outcome.complete and outcome.redacted == ["/workspace/z-copy"]
    assert contents["workspace/fixture"] == f"k={AWS_ID}\n".encode()  # allowed: as it is
    assert not members["workspace/z-copy"].islnk()  # its own copy, without the value
    assert contents["workspace/z-copy"] == b"k=[REDACTED:AWS Access Key]\n"
    both, members, _ = run(root, redact=True)
    assert both.redacted == ["/workspace/fixture", "/workspace/z-copy"]
    assert members["workspace/z-copy"].islnk()  # the stored copy is redacted already


def test_what_the_budget_leaves_is_stored_and_reported(root: Path) -> None:
    (root / "workspace" / "a-big").write_bytes(b"q" * (3 * CHUNK))
    (root / "workspace" / "b-key").write_text(f"k={AWS_ID}\n")
    outcome, _, contents = run(root, budget=2 * CHUNK)
    assert outcome.complete and outcome.findings == []
    assert outcome.unscanned == [
        {"path": "/workspace/a-big", "reason": "over the scan budget"},
        {"path": "/workspace/b-key", "reason": "over the scan budget"},
    ]
    assert contents["workspace/a-big"] == b"q" * (3 * CHUNK)


def test_the_archives_scan_finds_what_scan_tree_finds(root: Path) -> None:
    # One scanner, two callers: the same findings on the same files, chunk seams included.
    ws = root / "workspace"
    head = b"a" * 100 + b"\n"
    filler = head * ((CHUNK - 10) // len(head))
    (ws / "seam").write_bytes(filler + b"b" * (CHUNK - 10 - len(filler)) + f" {GITHUB}\n".encode())
    (ws / "utf16").write_bytes(f"first\nkey = {AWS_ID}\n".encode("utf-16-be"))
    (ws / "bin").write_bytes(b"\x7fELF\0" + f"token {GITHUB}".encode("utf-16-le"))
    outcome, _, _ = run(root)
    expected = [Finding(f"/workspace/{f.path}", f.line, f.kind) for f in scan_tree(ws)]
    assert outcome.findings == sorted(expected)
    assert {f.path for f in expected} == {"/workspace/seam", "/workspace/utf16", "/workspace/bin"}


def test_a_file_cut_short_while_read_is_an_error(root: Path) -> None:
    target = root / "workspace" / "shrinks"
    target.write_bytes(b"z" * (2 * CHUNK))

    def cut() -> None:
        os.truncate(target, CHUNK // 2)

    with pytest.raises(InvalidRequest, match="changed while the snapshot read it"):
        scanarchive.archive(tree_of(root, at_call(4, cut)), Sink())

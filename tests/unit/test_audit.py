"""The audit trail: record format, hash chain, every kind of tampering verify must catch
(one test each), torn lines, rotation, resume, fsync policies, concurrency, secrets never
written, queries, follow, and the `audit` CLI group."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbox.audit import log as audit_mod
from agentbox.audit.chain import hashed_line
from agentbox.audit.log import (
    GENESIS,
    AuditLog,
    Decision,
    args_hash,
    canonical_json,
    follow,
    read_head,
    read_records,
    record_hash,
    verify,
)
from agentbox.cli.audit_commands import audit as audit_cli
from agentbox.config.audit_fields import RESERVED
from agentbox.config.settings import AuditSettings, RemoteAuditSettings
from agentbox.errors import Conflict, InvalidConfig, InvalidRequest

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def write_log(path: Path, n: int, **kwargs: Any) -> list[dict[str, Any]]:
    with AuditLog(path, **kwargs) as log:
        return [
            log.append(
                decision="allowed",
                actor="agent",
                session="s1",
                sandbox=f"sb-{i % 3}",
                tool="terminal.run",
                args={"cmd": f"echo {i}"},
                exit_code=0,
                duration_ms=1.5,
                bytes_out=i,
            )
            for i in range(n)
        ]


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def set_lines(path: Path, new: list[bytes]) -> None:
    path.write_bytes(b"".join(new))


def rewrite(rec: dict[str, Any]) -> bytes:
    """What an attacker who knows the format writes: a record with a recomputed hash."""
    rec = dict(rec)
    rec["hash"] = record_hash(rec)
    return canonical_json(rec) + b"\n"


def eventually(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Bounded polling for something a background thread does."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "audit" / "audit.jsonl"


@pytest.fixture(autouse=True)
def _no_stray_threads() -> Iterator[None]:
    """close() must stop the log's background threads."""
    yield
    eventually(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("audit-")],
        "the audit threads to stop",
    )


# -- format and chain -----------------------------------------------------------------------


def test_record_has_every_field_and_a_utc_microsecond_timestamp(log_path: Path) -> None:
    with AuditLog(log_path) as log:
        rec = log.append(
            decision=Decision.DENIED,
            actor="op",
            session="s",
            sandbox="sb",
            tool="fs.write",
            args={"path": "a"},
            exit_code=None,
            duration_ms=3,
            bytes_out=0,
            error="policy: path outside root",
        )
    on_disk = json.loads(lines(log_path)[0])
    assert on_disk == rec
    assert on_disk.keys() >= RESERVED
    assert TS.match(on_disk["ts"]) and on_disk["decision"] == "denied" and on_disk["seq"] == 1
    assert lines(log_path)[0] == canonical_json(on_disk) + b"\n"


def test_each_record_chains_to_the_previous_one(log_path: Path) -> None:
    recs = write_log(log_path, 5)
    assert recs[0]["prev"] == GENESIS
    for before, after in itertools.pairwise(recs):
        assert after["prev"] == before["hash"] and after["seq"] == before["seq"] + 1
    for rec in recs:
        body = {k: v for k, v in rec.items() if k != "hash"}
        expected = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        ).hexdigest()
        assert rec["hash"] == f"sha256:{expected}"
    assert read_head(log_path) == audit_mod.Head(5, recs[-1]["hash"])


def test_raw_argument_values_never_reach_the_file(log_path: Path) -> None:
    secret = "hunter2-very-secret-value"
    with AuditLog(log_path) as log:
        rec = log.append(decision="allowed", tool="terminal.run", args={"cmd": f"login {secret}"})
    text = log_path.read_text()
    assert secret not in text and "login" not in text
    assert rec["args_hash"] == args_hash({"cmd": f"login {secret}"})
    assert args_hash({"a": 1, "b": [1, 2]}) == args_hash({"b": [1, 2], "a": 1})
    assert re.match(r"^sha256:[0-9a-f]{64}$", args_hash(None))
    with pytest.raises(InvalidRequest):
        args_hash({"x": object()})


def test_redact_hook_runs_over_every_caller_string(log_path: Path) -> None:
    seen: list[str] = []

    def redact(text: str) -> str:
        seen.append(text)
        return text.replace("SECRET", "[REDACTED]")

    with AuditLog(log_path, redact=redact) as log:
        log.append(
            decision="denied",
            actor="SECRET-actor",
            session="SECRET-session",
            sandbox="SECRET-sb",
            tool="SECRET-tool",
            error="token SECRET leaked",
            extra={"note": "SECRET", "nested": {"list": ["a SECRET b", 3]}},
        )
    text = log_path.read_text()
    assert "SECRET" not in text and text.count("[REDACTED]") == 7
    assert len(seen) == 7  # hashes and timestamps are the log's own, not redacted
    assert verify(log_path).ok


def test_extra_fields_merge_at_top_level_but_never_replace_reserved_keys(log_path: Path) -> None:
    with AuditLog(log_path) as log:
        rec = log.append(decision="approval_requested", extra={"approval_id": "ap-1"})
        assert rec["approval_id"] == "ap-1"
        for key in ("seq", "hash", "prev", "decision", "args_hash", "ts"):
            with pytest.raises(InvalidRequest, match=key):
                log.append(decision="allowed", extra={key: "forged"})
        with pytest.raises(InvalidRequest):
            log.append(decision="allowed", extra={"when": datetime.now(UTC)})
        with pytest.raises(InvalidRequest):
            log.append(decision="Not A Word")
        with pytest.raises(InvalidRequest):
            log.append(decision="allowed", args={"a": 1}, args_hash=args_hash({"a": 1}))
    assert [r["seq"] for r in read_records(log_path)] == [1]  # refused appends left no trace


# -- verify: an intact log, and each kind of tampering -----------------------------------


def test_verify_accepts_an_intact_log(log_path: Path) -> None:
    write_log(log_path, 10)
    result = verify(log_path)
    assert result.ok and result.records == 10 and result.first_bad is None
    assert result.reason == "ok"


def test_verify_catches_a_modified_field(log_path: Path) -> None:
    write_log(log_path, 10)
    content = lines(log_path)
    content[4] = content[4].replace(b'"terminal.run"', b'"fs.read"')
    set_lines(log_path, content)
    result = verify(log_path)
    assert not result.ok
    assert (result.first_bad, result.file, result.line) == (5, "audit.jsonl", 5)
    assert "hash mismatch" in result.reason and result.records == 4


def test_verify_catches_a_modified_record_whose_hash_was_recomputed(log_path: Path) -> None:
    recs = write_log(log_path, 10)
    content = lines(log_path)
    content[4] = rewrite(dict(recs[4], exit_code=1))  # valid on its own; breaks the next link
    set_lines(log_path, content)
    result = verify(log_path)
    assert not result.ok and (result.first_bad, result.line) == (6, 6)
    assert "prev does not match the hash of record 5" in result.reason


def test_verify_catches_a_deleted_middle_line(log_path: Path) -> None:
    write_log(log_path, 10)
    content = lines(log_path)
    del content[4]
    set_lines(log_path, content)
    result = verify(log_path)
    assert not result.ok and (result.first_bad, result.line) == (6, 5)
    assert "record(s) 5 are missing" in result.reason


def test_verify_catches_a_deleted_last_line_through_the_head(log_path: Path) -> None:
    write_log(log_path, 10)
    set_lines(log_path, lines(log_path)[:-1])
    result = verify(log_path)
    assert not result.ok and result.first_bad == 10 and result.records == 9
    assert "removed from the end" in result.reason


def test_verify_catches_two_swapped_lines(log_path: Path) -> None:
    write_log(log_path, 10)
    content = lines(log_path)
    content[3], content[4] = content[4], content[3]
    set_lines(log_path, content)
    result = verify(log_path)
    assert not result.ok and (result.first_bad, result.line) == (5, 4)


@pytest.mark.parametrize("forged_seq", ["next", "fresh"])
def test_verify_catches_an_inserted_line_with_a_valid_hash(log_path: Path, forged_seq: str) -> None:
    recs = write_log(log_path, 10)
    forged = dict(recs[4], tool="nothing.to.see", decision="allowed")
    # "next": claims seq 6 and links to record 5 correctly; "fresh": a seq never used.
    forged["seq"] = 6 if forged_seq == "next" else 11
    forged["prev"] = recs[4]["hash"]
    content = lines(log_path)
    content.insert(5, rewrite(forged))
    set_lines(log_path, content)
    result = verify(log_path)
    assert not result.ok
    if forged_seq == "next":  # the forged line fits; the genuine seq 6 after it does not
        assert (result.first_bad, result.line) == (
            6,
            7,
        ) and "reordered or inserted" in result.reason
    else:
        assert (result.first_bad, result.line) == (11, 6) and "seq jumps" in result.reason


def test_verify_catches_a_renumbered_tail_that_forgot_the_head(log_path: Path) -> None:
    recs = write_log(log_path, 6)
    # Delete record 3, then rewrite 4..6 as 3..5 with a consistent chain: only the head knows.
    content = lines(log_path)[:2]
    prev = recs[1]["hash"]
    for rec in recs[3:]:
        new = dict(rec, seq=rec["seq"] - 1, prev=prev)
        line = rewrite(new)
        prev = json.loads(line)["hash"]
        content.append(line)
    set_lines(log_path, content)
    result = verify(log_path)
    assert not result.ok and "removed from the end" in result.reason


def test_verify_catches_a_non_canonical_rewrite(log_path: Path) -> None:
    write_log(log_path, 3)
    content = lines(log_path)
    content[1] = json.dumps(json.loads(content[1]), indent=None).encode() + b"\n"  # spaces
    set_lines(log_path, content)
    result = verify(log_path)
    assert not result.ok and result.line == 2 and "canonical" in result.reason


def test_verify_catches_a_rotated_file_removed_from_the_middle(log_path: Path) -> None:
    write_log(log_path, 40, rotate_bytes=2000)
    rotated = audit_mod.rotated_files(log_path)
    assert len(rotated) >= 3
    victim = rotated[1][1]
    first_gone = json.loads(lines(victim)[0])["seq"]
    victim.unlink()
    result = verify(log_path)
    assert not result.ok and result.file == victim.name and result.first_bad == first_gone
    assert "missing" in result.reason


def test_verify_catches_the_oldest_rotated_file_removed(log_path: Path) -> None:
    write_log(log_path, 40, rotate_bytes=2000)
    audit_mod.rotated_files(log_path)[0][1].unlink()
    result = verify(log_path)
    assert not result.ok and result.file == "audit.jsonl.1" and result.first_bad == 1


def test_verify_catches_a_deleted_head(log_path: Path) -> None:
    write_log(log_path, 3)
    audit_mod.head_path(log_path).unlink()
    result = verify(log_path)
    assert not result.ok and "head file is missing" in result.reason


def test_a_full_rewrite_including_the_head_is_NOT_detected(log_path: Path) -> None:
    """What verify does not prove: only an external anchor (the remote sink) catches this."""
    recs = write_log(log_path, 5)
    prev, content = GENESIS, []
    for rec in recs:
        line = rewrite(dict(rec, prev=prev, tool="innocent"))
        prev = json.loads(line)["hash"]
        content.append(line)
    set_lines(log_path, content)
    audit_mod.head_path(log_path).write_bytes(canonical_json({"v": 1, "seq": 5, "hash": prev}))
    assert verify(log_path).ok


def test_verify_of_a_missing_log_fails(tmp_path: Path) -> None:
    result = verify(tmp_path / "nothing.jsonl")
    assert not result.ok and "no audit log" in result.reason


# -- torn lines, rotation, resume -----------------------------------------------------------


def test_a_torn_last_line_is_reported_set_aside_and_the_chain_continues(log_path: Path) -> None:
    write_log(log_path, 5)
    torn = b'{"actor":"agent","args_hash":"sha256:12'
    with open(log_path, "ab") as f:
        f.write(torn)
    before = verify(log_path)  # a crash mid-write: not a committed record, but reported
    assert before.ok and before.records == 5 and "unfinished last line" in before.reason

    with AuditLog(log_path) as log:
        assert log.append(decision="allowed")["seq"] == 6
    aside = audit_mod.torn_files(log_path)
    assert len(aside) == 1 and aside[0].read_bytes() == torn
    assert re.search(r"\.torn-\d{8}T\d{6}\.\d{6}Z$", aside[0].name)
    after = verify(log_path)
    assert after.ok and after.records == 6 and after.torn == (aside[0].name,)
    assert "torn lines set aside" in after.reason


def test_a_complete_garbage_last_line_is_set_aside_too(log_path: Path) -> None:
    write_log(log_path, 3)
    with open(log_path, "ab") as f:
        f.write(b"\x00" * 100 + b"\n")  # delayed allocation after a crash can leave this
    with AuditLog(log_path) as log:
        assert log.append(decision="allowed")["seq"] == 4
    assert audit_mod.torn_files(log_path)[0].read_bytes() == b"\x00" * 100 + b"\n"
    assert verify(log_path).ok


def test_rotation_keeps_the_chain_across_files(log_path: Path) -> None:
    recs = write_log(log_path, 30, rotate_bytes=1500)
    rotated = audit_mod.rotated_files(log_path)
    assert [n for n, _ in rotated] == list(range(1, len(rotated) + 1)) and len(rotated) >= 3
    files = [p for _, p in rotated] + [log_path]
    seqs = [json.loads(line)["seq"] for p in files for line in lines(p)]
    assert seqs == list(range(1, 31))  # higher N is newer
    for older, newer in itertools.pairwise(files):
        last, first = json.loads(lines(older)[-1]), json.loads(lines(newer)[0])
        assert first["prev"] == last["hash"]
        assert older.stat().st_size <= 1500
    result = verify(log_path)
    assert result.ok and result.records == 30 and recs[-1]["seq"] == 30


def test_resume_after_reopen_continues_the_chain(log_path: Path) -> None:
    write_log(log_path, 5, rotate_bytes=800)
    recs = write_log(log_path, 5, rotate_bytes=800)
    assert [r["seq"] for r in recs] == [6, 7, 8, 9, 10]
    assert verify(log_path).records == 10


def test_resume_reads_only_the_tail(log_path: Path) -> None:
    write_log(log_path, 5)
    content = lines(log_path)
    content[0] = b"this line would stop a parser that read the whole file\n"
    set_lines(log_path, content)
    with AuditLog(log_path) as log:
        assert log.append(decision="allowed")["seq"] == 6


def test_resume_after_a_rotation_left_no_active_file(log_path: Path) -> None:
    recs = write_log(log_path, 10, rotate_bytes=800)
    n = len(audit_mod.rotated_files(log_path)) + 1
    log_path.rename(log_path.with_name(f"audit.jsonl.{n}"))  # crash between rename and create
    with AuditLog(log_path, rotate_bytes=800) as log:
        assert log.append(decision="allowed")["prev"] == recs[-1]["hash"]
    assert verify(log_path).ok


def test_open_refuses_a_log_that_lost_its_tail(log_path: Path) -> None:
    write_log(log_path, 5)
    set_lines(log_path, lines(log_path)[:-2])
    with pytest.raises(Conflict, match="records were removed"):
        AuditLog(log_path)
    assert not verify(log_path).ok  # the evidence was not overwritten


def test_only_one_writer_at_a_time(log_path: Path) -> None:
    with AuditLog(log_path), pytest.raises(Conflict, match="already open"):
        AuditLog(log_path)
    AuditLog(log_path).close()


def test_append_after_close_is_refused(log_path: Path) -> None:
    log = AuditLog(log_path)
    log.close()
    log.close()  # idempotent
    with pytest.raises(Conflict):
        log.append(decision="allowed")


# -- durability -----------------------------------------------------------------------------


@pytest.fixture
def fsync_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each fsync or fdatasync (the head, rewritten in place, needs only its data)."""
    calls: list[int] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def counting(fd: int, real: Any = real) -> None:
            calls.append(fd)
            real(fd)

        monkeypatch.setattr(os, name, counting)
    return calls


def test_fsync_always_is_durable_before_append_returns(
    log_path: Path, fsync_calls: list[int]
) -> None:
    with AuditLog(log_path, fsync="always") as log:
        for i in range(1, 6):
            before = len(fsync_calls)
            rec = log.append(decision="allowed")
            assert len(fsync_calls) - before >= 2  # the log, then the new head
            assert read_head(log_path) == audit_mod.Head(i, rec["hash"])
    assert verify(log_path).ok


def test_the_head_is_rewritten_in_place_at_a_fixed_size(log_path: Path) -> None:
    """Once written whole at open, the head is overwritten in place (no new file and rename
    per append: a journal commit each), at a size a crash writes whole or not at all."""
    head = audit_mod.head_path(log_path)
    with AuditLog(log_path, fsync="always") as log:
        inode = head.stat().st_ino
        for i in range(1, 4):
            rec = log.append(decision="allowed")
            assert head.stat().st_ino == inode
            assert head.stat().st_size == audit_mod.HEAD_BYTES
            assert read_head(log_path) == audit_mod.Head(i, rec["hash"])
    assert not head.with_name(head.name + ".tmp").exists()
    assert verify(log_path).ok


def test_a_head_replaced_while_the_log_is_open_is_written_anew(log_path: Path) -> None:
    head = audit_mod.head_path(log_path)
    with AuditLog(log_path, fsync="always") as log:
        log.append(decision="allowed")
        stale = head.with_name("stale")
        stale.write_bytes(head.read_bytes())
        stale.replace(head)  # the log's handle now points at a file no name leads to
        rec = log.append(decision="allowed")
        assert read_head(log_path) == audit_mod.Head(2, rec["hash"])


def test_fsync_batch_catches_up_in_the_background_and_on_close(
    log_path: Path, fsync_calls: list[int]
) -> None:
    with AuditLog(log_path, fsync="batch", batch_interval=0.02, batch_records=1000) as log:
        before = len(fsync_calls)
        recs = [log.append(decision="allowed") for _ in range(50)]
        assert len(fsync_calls) - before < 50  # appends do not fsync one by one
        head = audit_mod.Head(50, recs[-1]["hash"])
        eventually(lambda: read_head(log_path) == head, "the batch flusher to write the head")
        last = log.append(decision="denied")
    assert read_head(log_path) == audit_mod.Head(51, last["hash"])  # close flushed it
    assert verify(log_path).ok


def test_fsync_batch_flushes_when_enough_records_pile_up(log_path: Path) -> None:
    with AuditLog(log_path, fsync="batch", batch_interval=60, batch_records=10) as log:
        recs = [log.append(decision="allowed") for _ in range(10)]
        head = audit_mod.Head(10, recs[-1]["hash"])
        eventually(lambda: read_head(log_path) == head, "batch_records to trigger a flush")


@pytest.mark.parametrize("fsync", ["always", "batch"])
def test_concurrent_appends_keep_one_chain(log_path: Path, fsync: str) -> None:
    threads, per_thread = 8, 125
    barrier = threading.Barrier(threads)
    seqs: list[int] = []
    guard = threading.Lock()
    with AuditLog(log_path, fsync=fsync, rotate_bytes=64 * 1024) as log:  # type: ignore[arg-type]

        def worker(n: int) -> None:
            barrier.wait()
            mine = [log.append(decision="allowed", actor=f"t{n}")["seq"] for _ in range(per_thread)]
            with guard:
                seqs.extend(mine)

        pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    assert sorted(seqs) == list(range(1, 1001))
    result = verify(log_path)
    assert result.ok and result.records == 1000
    assert len(audit_mod.rotated_files(log_path)) >= 2


def test_append_async_from_asyncio(log_path: Path) -> None:
    async def main(log: AuditLog) -> list[int]:
        recs = await asyncio.gather(*(log.append_async(decision="allowed") for _ in range(20)))
        return sorted(r["seq"] for r in recs)

    with AuditLog(log_path) as log:
        assert asyncio.run(main(log)) == list(range(1, 21))


# -- reading --------------------------------------------------------------------------------


def test_query_filters_and_reads_newest_first_across_files(log_path: Path) -> None:
    write_log(log_path, 60, rotate_bytes=2000)
    with AuditLog(log_path, rotate_bytes=2000) as log:
        log.append(decision="denied", sandbox="sb-x", tool="fs.write")
        newest = log.query(limit=5)
        assert [r["seq"] for r in newest] == [57, 58, 59, 60, 61]
        assert [r["seq"] for r in log.query(since_seq=58)] == [59, 60, 61]
        sb1 = log.query(sandbox="sb-1", limit=100)
        assert [r["seq"] for r in sb1] == list(range(2, 61, 3))  # spans the rotated files
        assert [r["seq"] for r in log.query(decision="denied")] == [61]
        assert [r["seq"] for r in log.query(tool="fs.write", sandbox="sb-x")] == [61]
        assert log.query(tool="nope") == []
        with pytest.raises(InvalidRequest):
            log.query(limit=0)
    assert [r["seq"] for r in read_records(log_path, limit=2)] == [60, 61]


def test_follow_sees_new_records_across_a_rotation(log_path: Path) -> None:
    write_log(log_path, 3)
    stop = threading.Event()
    got: list[int] = []
    all_seen = threading.Event()

    def reader() -> None:
        for rec in follow(log_path, since_seq=2, poll_interval=0.01, stop=stop):
            got.append(rec["seq"])
            if rec["seq"] == 30:
                all_seen.set()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        with AuditLog(log_path, rotate_bytes=1500) as log:
            for _ in range(27):
                log.append(decision="allowed")
        assert all_seen.wait(10), f"follow stopped at {got[-1:]}"
    finally:
        stop.set()
        thread.join(5)
    assert got == list(range(3, 31))
    assert len(audit_mod.rotated_files(log_path)) >= 2


def test_subscribers_get_every_record_in_order(log_path: Path) -> None:
    got: list[int] = []
    with AuditLog(log_path) as log:
        unsubscribe = log.subscribe(lambda rec: got.append(rec["seq"]))

        def broken_listener(rec: dict[str, Any]) -> None:
            raise RuntimeError("a listener bug must not break auditing")

        broken = log.subscribe(broken_listener)
        for _ in range(3):
            log.append(decision="allowed")
        unsubscribe()
        broken()
        log.append(decision="allowed")
    assert got == [1, 2, 3]


# -- configuration --------------------------------------------------------------------------


def test_from_settings_needs_the_remote_and_its_token(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with AuditLog.from_settings(AuditSettings(path=path, fsync="batch")) as log:
        assert log.fsync == "batch" and log.sink is None
    remote = RemoteAuditSettings(url="https://logs.example/ingest", token_env="AUDIT_TOKEN")
    both: list[Any] = ["local_jsonl", "remote_log_service"]
    with pytest.raises(InvalidConfig, match=r"audit\.remote is not set"):
        AuditLog.from_settings(AuditSettings(path=path, sink=both))
    with pytest.raises(InvalidConfig, match="AUDIT_TOKEN"):
        AuditLog.from_settings(AuditSettings(path=path, sink=both, remote=remote), environ={})
    plain = RemoteAuditSettings(url="http://logs.example/ingest")
    with pytest.raises(InvalidConfig, match="https"):
        AuditLog.from_settings(AuditSettings(path=path, sink=both, remote=plain), environ={})
    with pytest.raises(InvalidConfig):
        AuditLog(path, fsync="sometimes")  # type: ignore[arg-type]


# -- CLI ------------------------------------------------------------------------------------


@pytest.fixture
def cli() -> Callable[..., Any]:
    runner = CliRunner(mix_stderr=False)

    def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
        return runner.invoke(audit_cli, list(args), env=env, catch_exceptions=False)

    return invoke


def test_cli_verify_ok_and_failure(log_path: Path, cli: Callable[..., Any]) -> None:
    write_log(log_path, 4)
    ok = cli("verify", str(log_path))
    assert ok.exit_code == 0 and ok.stdout == "ok: 4 records\n"
    content = lines(log_path)
    content[2] = content[2].replace(b'"agent"', b'"admin"')
    set_lines(log_path, content)
    bad = cli("verify", str(log_path))
    assert bad.exit_code == 1
    assert bad.stdout.startswith("FAILED: audit.jsonl:3: seq 3: hash mismatch")
    as_json = json.loads(cli("verify", "--json", str(log_path)).stdout)
    assert as_json["ok"] is False and as_json["first_bad"] == 3 and as_json["line"] == 3


def test_cli_default_path_comes_from_the_environment(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    home_log = tmp_path / "home" / "audit" / "audit.jsonl"
    write_log(home_log, 2)
    env = {"AGENTBOX_HOME": str(tmp_path / "home"), "AGENTBOX_AUDIT_PATH": ""}
    assert cli("verify", env=env).stdout == "ok: 2 records\n"
    other = tmp_path / "elsewhere.jsonl"
    write_log(other, 3)
    assert cli("verify", env={**env, "AGENTBOX_AUDIT_PATH": str(other)}).stdout == "ok: 3 records\n"


def test_cli_tail_prints_the_newest_records(log_path: Path, cli: Callable[..., Any]) -> None:
    write_log(log_path, 12)
    human = cli("tail", str(log_path)).stdout.splitlines()
    assert len(human) == 10 and human[-1].split()[0] == "12" and "tool=terminal.run" in human[-1]
    as_json = [
        json.loads(x) for x in cli("tail", "-n", "3", "--json", str(log_path)).stdout.splitlines()
    ]
    assert [r["seq"] for r in as_json] == [10, 11, 12]
    assert cli("tail", "-n", "0", str(log_path)).stdout == ""
    assert cli("tail", str(log_path.with_name("nope.jsonl"))).exit_code == 1


def test_cli_help_has_examples(cli: Callable[..., Any]) -> None:
    for command in ("verify", "tail"):
        text = cli(command, "--help").stdout
        assert "Examples:" in text and f"agentbox audit {command}" in text


def test_fsync_always_group_commit_shares_fsyncs_and_ships_only_durable_records(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent appenders share fsyncs (a slow disk made slower here), every append
    returns durable, and the sink gets each record once, in seq order, after its fsync."""
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.01)
        real_fsync(fd)

    monkeypatch.setattr(audit_mod.os, "fsync", slow_fsync)

    class Sink:
        def __init__(self) -> None:
            self.seen: list[tuple[int, int]] = []  # (seq, durable seq when submitted)

        def start(self, last_seq: int, read_after: Callable[[int], Any]) -> None:
            pass

        def submit(self, record: dict[str, Any]) -> None:
            self.seen.append((record["seq"], log._synced_seq))

        def close(self, timeout: float) -> bool:
            return True

    sink = Sink()
    log = AuditLog(log_path, fsync="always", sink=sink)  # type: ignore[arg-type]
    heads: list[int] = []
    real_head = log._write_head
    monkeypatch.setattr(log, "_write_head", lambda seq, h: (heads.append(seq), real_head(seq, h)))
    late: list[int] = []

    def writer() -> None:
        for _ in range(5):
            record = log.append(decision="allowed", tool="fs_read")
            if log._synced_seq < record["seq"]:
                late.append(record["seq"])

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert late == [], f"append returned before its record was fsynced: {late}"
    assert len(heads) < 40 * 0.75, f"{len(heads)} group commits for 40 appends: no sharing"
    assert [seq for seq, _ in sink.seen] == list(range(1, 41))
    assert all(durable >= seq for seq, durable in sink.seen), "shipped before it was durable"
    assert verify(log_path).ok


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(), kids, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(min_size=1).filter(lambda k: k != "hash"), _JSON, max_size=8))
@settings(max_examples=300, derandomize=True, deadline=None)
def test_the_line_written_is_the_record_with_its_hash_encoded_once(record: dict[str, Any]) -> None:
    # append encodes a record once and splices its hash in; it must be exactly what the
    # verifier recomputes: the hash of the record without it, and the canonical JSON with it.
    digest, line = hashed_line(record)
    assert digest == record_hash(record)
    assert line == canonical_json({**record, "hash": digest})

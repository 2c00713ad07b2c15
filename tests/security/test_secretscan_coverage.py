"""The snapshot secret scan covers every byte of every regular file, or says what it did
not read: a secret cannot hide in a big file, after a NUL, in a database, in UTF-16,
across the scan's chunk boundary or behind a hole, and a sparse bomb costs nothing."""

from __future__ import annotations

import json
import os
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.errors import SecretsFound
from agentbox.runtime.runtime import Runtime
from agentbox.storage import secrethits, secretscan, secretwindows
from agentbox.storage.secretscan import Finding, scan_tree
from gateway_harness import running_gateway

AWS_ID = "AKIA" + "Z7QHXQ4VN3TPLM2D"  # built from parts: this file is not a leak
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
AWS = "AWS Access Key"
CHUNK = secretscan._CHUNK


def _holes_supported(tmp_path: Path) -> bool:
    probe = tmp_path / "hole-probe"
    with probe.open("wb") as f:
        f.truncate(1 << 20)
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.lseek(fd, 0, os.SEEK_DATA)
    except OSError:
        return True  # ENXIO: the file is one hole
    finally:
        os.close(fd)
        probe.unlink()
    return False


def only(root: Path, name: str) -> secretscan.ScanResult:
    result = scan_tree(root)
    assert result.over_budget == [] and result.skipped_unreadable == []
    assert {f.path for f in result} <= {name}
    return result


def test_every_detector_is_prefiltered_without_reading_everything() -> None:
    # A detector this pre-filter does not know makes every byte a candidate: slow, never
    # blind; this holds the list in step with detect-secrets.
    assert not secretwindows.default().everything


def test_the_c_pass_finds_every_place_the_python_pass_does() -> None:
    # Two implementations of one pre-filter: the C one (used when a compiler is there)
    # must never be blinder than the Python one the detectors' literals are checked with.
    assert secrethits.available()
    text = Path(secretscan.__file__).read_bytes() + Path(__file__).read_bytes()
    noise = random.Random(20).randbytes(1 << 20)
    tricky = "to\u212aen = x\n\u017fecret: y\n".encode() + "key: z".encode("utf-16-le")
    pf = secretwindows.default()
    for data in (text, noise, tricky, noise + text + tricky):
        c_hits = set(secretwindows.hits(data, 0, len(data)))
        assert set(secretwindows._python_hits(data, 0, len(data), pf)) <= c_hits
    assert len(secretwindows.hits(tricky, 0, len(tricky))) >= 2  # the folded letters


def _planted(seed: int) -> bytes:
    """Noise with needles, fold traps and UTF-16 text sown through it."""
    rng = random.Random(seed)
    seeds = [AWS_ID.encode(), GITHUB.encode(), b"token = ", b"\xc5\xbfecret", b"to\xe2\x84\xaaen:",
             b"\xc4\xb1", "pass: x".encode("utf-16-le"), "Key=y".encode("utf-16-be"), b"\n"]  # fmt: skip
    out = bytearray()
    while len(out) < 200_000:
        out += rng.randbytes(rng.randrange(0, 300)) + rng.choice(seeds)
    return bytes(out)


def test_the_c_pass_and_the_python_pass_agree_on_the_bytes_and_both_views() -> None:
    # The C pass reads the even and odd bytes in place (a 32-byte loop, then a checked
    # one at the edges); the Python pass copies the views out. Any [lo, hi) agrees.
    pf = secretwindows.default()
    rng = random.Random(7)
    for seed in range(3):
        data = _planted(seed)
        for lo, hi in [(0, len(data)), *((rng.randrange(0, 999), rng.randrange(1000, len(data)))
                                         for _ in range(4))]:  # fmt: skip
            plain, even, odd = secretwindows.view_hits(data, lo, hi, True)
            assert plain == secretwindows._python_hits(data, lo, hi, pf)
            assert even == secretwindows._python_hits(data[0::2], lo // 2, hi // 2, pf)
            assert odd == secretwindows._python_hits(data[1::2], lo // 2, hi // 2, pf)
            assert plain == secretwindows.view_hits(data, lo, hi, False)[0]


def test_more_candidates_than_one_call_returns_are_all_found() -> None:
    data = b"AKIA" * 5000 + "xAKIA".encode("utf-16-le") * 3000
    plain, even, odd = secretwindows.view_hits(data, 0, len(data), True)
    assert len(plain) == 5000 and plain[-1] == 4 * 4999
    assert len(even) + len(odd) >= 3000


def test_fold_traps_count_where_they_spell_a_needle_only() -> None:
    # IGNORECASE takes the long s for an s (and the Kelvin sign for a k): "\u017fecret"
    # is a candidate; the same two bytes in binary noise are not (they used to be, with
    # a letter beside them: a window of Python regexes per trap, the bulk of the cost).
    assert secretwindows.hits("a \u017fecret".encode(), 0, 10) == [2]
    assert secretwindows.hits("to\u212aen = 1".encode(), 0, 10) == [0]
    assert secretwindows.hits(b"ab\xc5\xbfcd\xe2\x84\xaaey\xc4\xb1x", 0, 14) == []


def test_a_keyword_spelled_with_a_fold_trap_is_still_found(tmp_path: Path) -> None:
    secret = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYzQ9kPm2LsT"
    (tmp_path / "creds").write_text(f"x\naws_\u017fecret_access_key = {secret}\n")
    assert list(only(tmp_path, "creds")) == [Finding("creds", 2, AWS)]


def test_random_data_gives_the_detectors_almost_nothing_to_run_on() -> None:
    # What keeps the scan of binaries near the speed of reading them: on noise the C
    # pass hands Python a handful of places per MiB, not one per fold trap.
    noise = random.Random(21).randbytes(1 << 20)
    assert sum(map(len, secretwindows.view_hits(noise, 0, len(noise), True))) < 40


def test_a_secret_at_the_end_of_a_20_mib_log(tmp_path: Path) -> None:
    line = b"2026-12-02 INFO request served in 3 ms\n"
    (tmp_path / "app.log").write_bytes(
        line * (20 * 1024**2 // len(line)) + f"k={AWS_ID}\n".encode()
    )
    lines = 20 * 1024**2 // len(line) + 1
    assert list(only(tmp_path, "app.log")) == [Finding("app.log", lines, AWS)]


def test_a_secret_after_a_nul_at_offset_0(tmp_path: Path) -> None:
    (tmp_path / "blob").write_bytes(
        b"\0\x01\x02 binary\n" + os.urandom(3000).replace(b"\n", b"") + f"\n{GITHUB}\n".encode()
    )
    assert [f.kind for f in only(tmp_path, "blob")] == ["GitHub Token"]


def test_a_secret_inside_a_sqlite_database(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "app.db") as db:
        db.execute("CREATE TABLE settings (name TEXT, value TEXT)")
        db.executemany(
            "INSERT INTO settings VALUES (?, ?)", [(f"n{i}", "x" * 200) for i in range(500)]
        )
        db.execute("INSERT INTO settings VALUES ('aws', ?)", (AWS_ID,))
    db.close()
    assert [f.kind for f in only(tmp_path, "app.db")] == [AWS]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_secret_in_utf16(tmp_path: Path, encoding: str) -> None:
    (tmp_path / "notes.txt").write_bytes(f"first line\nkey = {AWS_ID}\n".encode(encoding))
    assert list(only(tmp_path, "notes.txt")) == [Finding("notes.txt", 2, AWS)]


def test_utf16_embedded_at_an_odd_offset_of_a_binary(tmp_path: Path) -> None:
    (tmp_path / "core").write_bytes(
        b"\x7fELF\0" + f"token {GITHUB}".encode("utf-16-le") + b"\0" * 9
    )
    assert [f.kind for f in only(tmp_path, "core")] == ["GitHub Token"]


@pytest.mark.parametrize("cut", [1, 10, 19, 39])
def test_a_secret_across_the_chunk_boundary(tmp_path: Path, cut: int) -> None:
    secret = f"x {GITHUB} y\n".encode()
    head = b"a" * 100 + b"\n"
    filler = head * ((CHUNK - cut) // len(head))
    data = filler + b"b" * (CHUNK - cut - len(filler)) + secret
    assert data.index(GITHUB.encode()) + cut - 2 == CHUNK  # the value straddles it
    (tmp_path / "f").write_bytes(data + head * 20_000)
    assert [f.kind for f in only(tmp_path, "f")] == ["GitHub Token"]


def test_utf16_across_the_chunk_boundary(tmp_path: Path) -> None:
    text = "y" * ((CHUNK - 20) // 2) + f" {AWS_ID} " + "z" * 5000
    (tmp_path / "w.txt").write_bytes(text.encode("utf-16-le"))
    assert [f.kind for f in only(tmp_path, "w.txt")] == [AWS]


def test_a_secret_after_a_huge_hole(tmp_path: Path) -> None:
    path = tmp_path / "sparse.img"
    with path.open("wb") as f:
        f.seek(50 * 1024**3)
        f.write(f"password leaked: {AWS_ID}\n".encode())
    result = only(tmp_path, "sparse.img")
    assert [f.kind for f in result] == [AWS]
    if _holes_supported(tmp_path):
        assert result.scanned_bytes < 2 * CHUNK  # the hole is not read


def test_a_sparse_bomb_costs_only_what_it_stores(tmp_path: Path) -> None:
    if not _holes_supported(tmp_path):
        pytest.skip("this filesystem does not report holes (the budget bounds it instead)")
    with (tmp_path / "bomb").open("wb") as f:
        f.truncate(10 * 1024**3)
    result = only(tmp_path, "bomb")
    assert list(result) == [] and result.scanned_bytes == 0


def test_what_the_budget_does_not_cover_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a-big").write_bytes(b"q" * (3 * CHUNK))
    (tmp_path / "b-key").write_text(f"k={AWS_ID}\n")
    result = scan_tree(tmp_path, max_scan_bytes=2 * CHUNK)
    assert result.scanned_bytes == 2 * CHUNK
    assert result.unscanned() == [
        {"path": "a-big", "reason": "over the scan budget"},
        {"path": "b-key", "reason": "over the scan budget"},
    ]


@pytest.fixture
def sandbox(runtime: Runtime, agentbox_home: Path) -> Iterator[Sandbox]:
    sb = Sandbox.create(memory="256MiB", disk="256MiB", network="none", home=agentbox_home)
    yield sb
    if runtime.store.get(sb.id) is not None:
        sb.kill()


def test_a_snapshot_refuses_hidden_secrets_and_records_what_it_did_not_scan(
    sandbox: Sandbox, runtime: Runtime
) -> None:
    sandbox.commands.run(
        "head -c 20000000 /dev/zero | tr '\\0' 'l' > /workspace/big.log && "
        f"printf '\\000{AWS_ID}' >> /workspace/big.log && "
        f"printf '\\000\\001{GITHUB}' > /workspace/early-nul.bin"
    )
    with pytest.raises(SecretsFound) as caught:
        sandbox.snapshot()
    found = {(f["path"], f["kind"]) for f in caught.value.details["findings"]}
    assert found == {("/workspace/big.log", AWS), ("/workspace/early-nul.bin", "GitHub Token")}
    sandbox.commands.run("rm /workspace/early-nul.bin && truncate -s 1000000 /workspace/big.log")
    snapshots = runtime.snapshots()
    snapshots.scan_budget = 4096  # too little for big.log: reported, not silently passed
    info = snapshots.create(sandbox.id)
    assert {"path": "/workspace/big.log", "reason": "over the scan budget"} in info.unscanned
    assert snapshots.get(info.id).unscanned == info.unscanned
    snapshots.delete(info.id)


def test_the_gateway_audits_what_its_scan_budget_left_unscanned(
    tmp_path: Path, agentbox_home: Path, host_ready: None
) -> None:
    extra = "snapshots:\n  scan_budget: 4KiB\n"
    env = {"AGENTBOX_STORE": f"file://{tmp_path / 'store'}"}
    with running_gateway(agentbox_home, tmp_path, extra_yaml=extra, env=env) as gw:
        with gw.operator() as op:
            made = op.post(
                "/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB", "network": "none"}
            )
            sid = made.json()["id"]
            try:
                op.put(f"/v1/sandboxes/{sid}/files", json={"path": "big", "content": "x" * 9000})
                r = op.post(f"/v1/sandboxes/{sid}/snapshots", json={})
                assert r.status_code == 201, r.text
                unscanned = {"path": "/workspace/big", "reason": "over the scan budget"}
                assert unscanned in r.json()["unscanned"]
            finally:
                op.delete(f"/v1/sandboxes/{sid}")
        records = [json.loads(line) for line in gw.audit_path.read_text().splitlines()]
    created = [r for r in records if r.get("decision") == "snapshot_created"]
    assert created and created[-1]["unscanned_count"] >= 1
    assert unscanned in created[-1]["unscanned"]


def test_pw_is_a_candidate_only_where_cloudant_s_detector_could_have_it() -> None:
    # Two random bytes spell "pw" (either case) often: it was most of the windows noise
    # gave the detectors. Alone it is in Cloudant's detector only, after cl, clou,
    # cloudant, a separator or "api"; "pwd" (IBM's, SoftLayer's) after anything.
    for noise in (b"\x93pw=", b"zpW:", b"9PW ", b"\x00pw'"):
        assert secretwindows.hits(noise, 0, len(noise)) == [], noise
    for prefix in ("cl", "clou", "cloudant", "CL", "Cloudant"):
        for sep in ("", "_", "-"):
            for api in ("", "api", "API"):
                for after in ('"', "'", "]", " ", "=", ":"):
                    text = f"x {prefix}{sep}{api}pw{after}".encode()
                    assert secretwindows.hits(text, 0, len(text)), text
    for text in (b"pwd = x", b"xPWD: y", b"ibm_pwd='z'"):
        assert secretwindows.hits(text, 0, len(text)), text


@pytest.mark.parametrize(
    ("spelling", "value"),
    [
        ("cloudant_pw", "abcdefghijklmnopqrstuvwx"),
        ("cl-apipw", "abcdefghijklmnopqrstuvwx"),
        ("CLOUPW", "abcdefghijklmnopqrstuvwx"),
        ("ibm_cloud_pwd", "A1b2" * 11),
    ],
)
def test_pw_credentials_are_still_found(tmp_path: Path, spelling: str, value: str) -> None:
    (tmp_path / "conf").write_bytes(os.urandom(5000) + f"\n{spelling} = '{value}'\n".encode())
    assert [f.kind for f in only(tmp_path, "conf")], spelling


SLACK = "xoxb-" + "123456789012-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx"


def test_xox_is_a_candidate_only_with_its_letter_and_dash() -> None:
    # "xox" either case is ~1 place a MiB of noise; every Slack token goes on with one
    # of a, b, p, o, s, r and "-" (a long s is an s to the detector, which ignores case).
    for noise in (b"\x93xox\x00", b"XOX9-", b"xoxz-", b"xoxb_"):
        assert secretwindows.hits(noise, 0, len(noise)) == [], noise
    for text in ("xoxb-1", "XOXP-2", "xOxa-3", "xoxo-4", "xoxr-5", "xoxs-6"):
        data = f"t {text}".encode()
        assert secretwindows.hits(data, 0, len(data)), text
        wide = f"t {text}".encode("utf-16-le")
        assert any(secretwindows.view_hits(wide, 0, len(wide), True)[1:]), text
    data = "t xox\u017f-7".encode()  # UTF-8 only: the views hold ASCII of UTF-16
    assert secretwindows.hits(data, 0, len(data))


@pytest.mark.parametrize(
    ("token", "encoding"),
    [
        *((t, e) for t in (SLACK, SLACK.upper(), "xoxp-1-2-abc123", "XOXA-7-Z9")
          for e in ("utf-8", "utf-16-le")),
        ("xox\u017f-99-x1", "utf-8"),
    ],
)  # fmt: skip
def test_slack_tokens_are_still_found(tmp_path: Path, token: str, encoding: str) -> None:
    (tmp_path / "conf").write_bytes(os.urandom(5000) + f"\nslack = {token}\n".encode(encoding))
    assert "Slack Token" in {f.kind for f in only(tmp_path, "conf")}, token


def test_the_detectors_see_the_same_in_a_window_s_bytes_as_in_its_text() -> None:
    # A window's literals are looked for in its bytes (Latin-1, one byte a character):
    # the same detectors must run as on its decoded text, fold traps and escapes included.
    rng = random.Random(22)
    samples = [
        _planted(3)[:4000],
        rng.randbytes(3000) + f"\naws_secret_access_key = {'A1b2' * 10}\n".encode(),
        b"\xff\xfe" + "to\u212aen = 'x'\n\u017fecret: y\n".encode() + rng.randbytes(500),
        "caf\u00e9 key = 'z' \u0131 pass: \xe9t\u00e9".encode() + b"\x80\xc4",
        f"{SLACK} {GITHUB} {AWS_ID}\n".encode("utf-16-le") + SLACK.encode(),
    ]
    for raw in samples:
        text = raw.decode("utf-8", "surrogateescape")
        assert secretscan._matches(text, raw) == secretscan._matches(text), raw[:40]
    assert secretscan._matches(samples[1].decode("utf-8", "surrogateescape"), samples[1])

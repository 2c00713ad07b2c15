"""The `agentbox` command line, run as a real process against real sandboxes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

AGENTBOX = str(Path(sys.executable).parent / "agentbox")


def run(home: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "AGENTBOX_HOME": str(home)}
    return subprocess.run(
        [AGENTBOX, *args], input=stdin, capture_output=True, env=env, timeout=120, check=False
    )


@pytest.fixture
def sandbox_id(agentbox_home: Path, host_ready: None) -> object:
    created = run(agentbox_home, "sandbox", "create", "--memory", "128MiB", "--disk", "64MiB")
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.decode().strip()
    assert sandbox_id.startswith("sb-") and "\n" not in sandbox_id  # the id alone
    yield sandbox_id
    run(agentbox_home, "sandbox", "rm", sandbox_id)


def test_exec_passes_streams_and_exit_code(agentbox_home: Path, sandbox_id: str) -> None:
    r = run(
        agentbox_home, "sandbox", "exec", sandbox_id, "--", "sh", "-c", "echo o; echo e >&2; exit 3"
    )
    assert (r.stdout, r.stderr, r.returncode) == (b"o\n", b"e\n", 3)


def test_exec_stdin_cwd_and_timeout(agentbox_home: Path, sandbox_id: str) -> None:
    r = run(agentbox_home, "sandbox", "exec", sandbox_id, "--cwd", "/tmp", "--", "sh", "-c",
            "pwd; wc -c", stdin=b"12345")  # fmt: skip
    assert r.stdout.split() == [b"/tmp", b"5"]
    r = run(agentbox_home, "sandbox", "exec", sandbox_id, "--timeout", "0.3", "--", "sleep", "30")
    assert r.returncode == 124 and b"timed out" in r.stderr


def test_files_write_and_read_binary(agentbox_home: Path, sandbox_id: str) -> None:
    payload = bytes(range(256)) * 1000
    w = run(agentbox_home, "files", "write", sandbox_id, "/workspace/blob.bin", stdin=payload)
    assert w.returncode == 0, w.stderr
    r = run(agentbox_home, "files", "read", sandbox_id, "/workspace/blob.bin")
    assert r.returncode == 0 and r.stdout == payload
    listing = json.loads(run(agentbox_home, "files", "ls", sandbox_id, "--json").stdout)
    assert {"path": "/workspace/blob.bin", "size": len(payload)}.items() <= listing[0].items()


def test_create_json_ls_json_rm(agentbox_home: Path, host_ready: None) -> None:
    created = run(agentbox_home, "sandbox", "create", "--disk", "64MiB", "--json")
    sandbox_id = json.loads(created.stdout)["id"]
    listed = json.loads(run(agentbox_home, "sandbox", "ls", "--json").stdout)
    assert any(s["id"] == sandbox_id and s["state"] == "running" for s in listed)
    assert run(agentbox_home, "sandbox", "rm", sandbox_id).returncode == 0
    gone = run(agentbox_home, "sandbox", "exec", sandbox_id, "--", "true")
    assert gone.returncode == 125
    assert b"error[sandbox_not_found]" in gone.stderr


def test_exec_plain_form_behaves_as_through_click(agentbox_home: Path, sandbox_id: str) -> None:
    """`sandbox exec ID -- ARGV` runs without click (cli.execute); an option before the id
    sends the same call through click: streams, exit codes and errors must not differ."""
    script = ["sh", "-c", "read x; echo out $x; echo err >&2; exit 7"]
    plain = run(agentbox_home, "sandbox", "exec", sandbox_id, "--", *script, stdin=b"in\n")
    clicked = run(
        agentbox_home, "sandbox", "exec", "--cwd", "/workspace", sandbox_id, "--", *script,
        stdin=b"in\n",
    )  # fmt: skip
    assert (plain.stdout, plain.stderr, plain.returncode) == (b"out in\n", b"err\n", 7)
    assert (clicked.stdout, clicked.stderr, clicked.returncode) == (b"out in\n", b"err\n", 7)
    for args in (
        ["sb-000000000000", "--", "true"],
        ["--cwd", "/", "sb-000000000000", "--", "true"],
    ):
        gone = run(agentbox_home, "sandbox", "exec", *args)
        assert gone.returncode == 125, gone.stderr
        assert gone.stderr.startswith(b"error[sandbox_not_found]: sandbox sb-000000000000 ")
        assert gone.stdout == b""


def test_bad_input_is_one_clear_line(agentbox_home: Path, host_ready: None) -> None:
    r = run(agentbox_home, "sandbox", "create", "--memory", "lots")
    assert r.returncode == 1
    assert r.stderr.decode().startswith("error[invalid_request]: ")
    assert b"Traceback" not in r.stderr
    r = run(agentbox_home, "sandbox", "create", "--template", "nope")
    assert r.returncode == 1 and b"template_not_found" in r.stderr


def test_doctor_json(agentbox_home: Path) -> None:
    r = run(agentbox_home, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert {
        "bubblewrap",
        "user namespaces",
        "cgroups",
        "seccomp",
        "sandbox network",
    } <= checks.keys()
    assert checks["sandbox network"]["ok"], checks["sandbox network"]  # this host has veth + nft
    assert r.returncode == (0 if all(c["ok"] for c in checks.values() if c["required"]) else 1)


def test_shell_runs_a_script_from_stdin(agentbox_home: Path, sandbox_id: str) -> None:
    r = run(agentbox_home, "sandbox", "shell", sandbox_id, stdin=b"cd /tmp\npwd\nid -u\nexit 4\n")
    assert (r.stdout, r.returncode) == (b"/tmp\n1000\n", 4)


def test_a_mistyped_subcommand_gets_a_suggestion(agentbox_home: Path) -> None:
    for args, near in ((["sandbx", "ls"], "'sandbox'"), (["sandbox", "lss"], "'ls'"),
                       (["snapshot", "prun"], "'prune'"), (["tokn"], "'token'")):  # fmt: skip
        r = run(agentbox_home, *args)
        assert r.returncode == 2 and f"Did you mean {near}" in r.stderr.decode(), r.stderr
    r = run(agentbox_home, "zzzzzz")
    assert r.returncode == 2 and b"Did you mean" not in r.stderr


def test_sandbox_ls_shows_memory_for_people(agentbox_home: Path, sandbox_id: str) -> None:
    r = run(agentbox_home, "sandbox", "ls")
    [row] = [line for line in r.stdout.decode().splitlines() if line.startswith(sandbox_id)]
    assert row.split()[-1] == "128MiB", row


def test_durations_are_parsed_alike_everywhere(agentbox_home: Path, sandbox_id: str,
                                               tmp_path: Path) -> None:  # fmt: skip
    from gateway_harness import running_gateway

    r = run(agentbox_home, "sandbox", "exec", sandbox_id, "--timeout", "300ms", "--", "sleep", "9")
    assert r.returncode == 124, r.stderr
    bad = run(agentbox_home, "sandbox", "exec", sandbox_id, "--timeout", "8x", "--", "true")
    assert bad.returncode == 2 and b"is not a duration" in bad.stderr
    with running_gateway(agentbox_home, tmp_path) as gw:
        env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home), "AGENTBOX_URL": gw.url,
               "AGENTBOX_TOKEN": gw.operator_token}  # fmt: skip
        issued = subprocess.run([AGENTBOX, "token", "issue", "--sandbox", sandbox_id, "--ttl",
                                 "8h"], capture_output=True, env=env, timeout=60, check=False)  # fmt: skip
        assert issued.returncode == 0, issued.stderr
        listed = subprocess.run([AGENTBOX, "token", "ls", "--sandbox", sandbox_id, "--json"], capture_output=True,
                                env=env, timeout=60, check=True)  # fmt: skip
        [mine] = json.loads(listed.stdout)
        assert mine["expires_at"] - mine["created_at"] == 8 * 3600


def test_volume_create_ls_mount_rm(agentbox_home: Path, host_ready: None) -> None:
    made = run(agentbox_home, "volume", "create", "cli-cache", "--size", "32MiB")
    assert made.returncode == 0 and made.stdout == b"cli-cache\n", made.stderr
    again = run(agentbox_home, "volume", "create", "cli-cache", "--size", "32MiB")
    assert again.returncode != 0 and b"exists already" in again.stderr
    created = run(agentbox_home, "sandbox", "create", "--disk", "64MiB", "--network", "none",
                  "--volume", "cli-cache:/home/user/.cache/pip")  # fmt: skip
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.decode().strip()
    try:
        wrote = run(agentbox_home, "sandbox", "exec", sandbox_id, "--", "sh", "-c",
                    "head -c 1048576 /dev/urandom > /home/user/.cache/pip/blob")  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        listed = json.loads(run(agentbox_home, "volume", "ls", "--json").stdout)
        (entry,) = [v for v in listed if v["name"] == "cli-cache"]
        assert entry["used_bytes"] >= 1024**2 and entry["size"] == 32 * 1024**2
        assert entry["mounts"] == [
            {"sandbox": sandbox_id, "path": "/home/user/.cache/pip", "mode": "rw"}
        ]
        assert sandbox_id in run(agentbox_home, "volume", "ls").stdout.decode()
        second = run(agentbox_home, "sandbox", "create", "--network", "none",
                     "--volume", "cli-cache:/home/user/c")  # fmt: skip
        assert second.returncode != 0 and b"one writer" in second.stderr, second.stderr
        busy = run(agentbox_home, "volume", "rm", "cli-cache")
        assert busy.returncode != 0 and sandbox_id.encode() in busy.stderr
        bad = run(agentbox_home, "sandbox", "create", "--volume", "cli-cache:/proc/x")
        assert bad.returncode != 0 and b"/proc" in bad.stderr
    finally:
        run(agentbox_home, "sandbox", "rm", sandbox_id)
    assert run(agentbox_home, "volume", "rm", "cli-cache").returncode == 0
    assert b"cli-cache" not in run(agentbox_home, "volume", "ls").stdout

"""The seccomp profile is data, compiles with libseccomp, and covers what the issue lists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyseccomp
import pytest

from agentbox.isolation import seccomp

REQUIRED = {
    "mount", "umount2", "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "keyctl",
    "add_key", "request_key", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "unshare", "setns", "open_by_handle_at",
}  # fmt: skip


def test_profile_denies_every_required_syscall() -> None:
    profile = seccomp.load_profile()
    denied = {
        name
        for rule in profile["rules"]
        if not rule.get("args") and "arg_not_in" not in rule
        for name in rule["syscalls"]
    }
    assert denied >= REQUIRED


def test_tty_injection_rules_mask_the_argument() -> None:
    rules = [r for r in seccomp.load_profile()["rules"] if r["syscalls"] == ["ioctl"]]
    values = {a["value"] for r in rules for a in r["args"]}
    assert values == {0x5412, 0x541C}  # TIOCSTI, TIOCLINUX
    assert all(a["op"] == "masked_eq" and a["mask"] == 0xFFFFFFFF for r in rules for a in r["args"])


def test_every_named_syscall_exists_on_this_architecture() -> None:
    arch = pyseccomp.system_arch()
    for rule in seccomp.load_profile()["rules"]:
        for name in rule["syscalls"]:
            if name in ("umount",):  # i386-only name, absent on x86_64 by design
                continue
            assert pyseccomp.resolve_syscall(arch, name) >= 0, name


def test_compiles_to_bpf_and_is_cached_by_content(tmp_path) -> None:  # type: ignore[no-untyped-def]
    program = seccomp.compile_profile(seccomp.load_profile())
    assert len(program) % 8 == 0 and len(program) > 8 * 20
    path = seccomp.compiled_filter_path(tmp_path)
    assert path.read_bytes() == program
    assert seccomp.compiled_filter_path(tmp_path) == path


def test_a_cached_filter_is_not_compiled_again_until_the_profile_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = seccomp.compiled_filter_path(tmp_path)
    real_compile = seccomp.compile_profile
    compiled: list[int] = []

    def counting(profile: dict[str, Any]) -> bytes:
        compiled.append(1)
        return real_compile(profile)

    monkeypatch.setattr(seccomp, "compile_profile", counting)
    assert seccomp.compiled_filter_path(tmp_path) == first  # a later process: a stat only
    assert compiled == []
    profile = json.loads(seccomp._profile_bytes())
    profile["rules"] = profile["rules"][1:]
    monkeypatch.setattr(seccomp, "_profile_bytes", lambda: json.dumps(profile).encode())
    changed = seccomp.compiled_filter_path(tmp_path)
    assert compiled == [1] and changed != first
    assert changed.read_bytes() == real_compile(profile)

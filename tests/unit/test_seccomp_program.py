"""The compiled seccomp program, run the way the kernel runs it when a command loads it.

At every load the kernel evaluates the program once per syscall number (its cache of
numbers that are always allowed, ``seccomp_cache_prepare``), emulating it with nothing
but the number and the architecture known. That is per-command CPU: the program must
decide a number in a few instructions (a binary search), and decide it as the profile
says.
"""

from __future__ import annotations

import errno
import os
import struct

import pyseccomp
import pytest

from agentbox.isolation import seccomp

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 numbers")

AUDIT_ARCH_X86_64 = 0xC000003E
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
NUMBERS = range(0, 512)  # beyond the last x86_64 syscall


def emulate(program: bytes, nr: int) -> tuple[int | None, int]:
    """(the action, or None where it depends on more than the number; instructions run),
    as the kernel's ``seccomp_is_const_allow`` emulates it."""
    insns = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc, steps = 0, 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        steps += 1
        pc += 1
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            if k == 0:
                acc = nr
            elif k == 4:
                acc = AUDIT_ARCH_X86_64
            else:
                return None, steps  # an argument or the instruction pointer
        elif code == 0x05:  # BPF_JMP | BPF_JA
            pc += k
        elif code in (0x15, 0x25, 0x35, 0x45):  # JEQ, JGT, JGE, JSET with K
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        elif code == 0x54:  # BPF_ALU | BPF_AND | BPF_K
            acc &= k
        elif code == 0x06:  # BPF_RET | BPF_K
            return k, steps
        else:
            return None, steps


def expected(nr: int) -> int | None:
    """What the profile says of a syscall number alone."""
    arch = pyseccomp.system_arch()
    action = RET_ALLOW
    for rule in seccomp.load_profile()["rules"]:
        numbers = set()
        for name in rule["syscalls"]:
            try:
                numbers.add(pyseccomp.resolve_syscall(arch, name))
            except Exception:  # not on this architecture
                continue
        if nr not in numbers:
            continue
        if rule.get("args") or "arg_not_in" in rule:
            return None  # decided by its arguments
        action = RET_ERRNO | getattr(errno, rule["errno"])
    return action


@pytest.fixture(scope="module")
def program() -> bytes:
    return seccomp.compile_profile(seccomp.load_profile())


def test_each_syscall_number_is_decided_as_the_profile_says(program: bytes) -> None:
    for nr in NUMBERS:
        assert emulate(program, nr)[0] == expected(nr), nr


def test_a_syscall_number_is_decided_in_a_few_instructions(program: bytes) -> None:
    # A chain of comparisons took ~60 for most numbers; a binary search takes ~log2(rules).
    steps = [emulate(program, nr)[1] for nr in NUMBERS]
    assert max(steps) <= 24, max(steps)

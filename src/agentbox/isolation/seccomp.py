"""Compile the seccomp profile (a JSON data file) to a BPF program with libseccomp.

The same compiled bytes confine a sandbox's first process (handed to bubblewrap with
``--seccomp FD``) and every later command (loaded by ``agentbox-nsexec`` before exec),
so both get an identical filter.

Compiling costs tens of milliseconds (importing pyseccomp alone runs ``ldconfig`` to find
libseccomp), so the program is cached on disk, keyed by what it is made from, and a
process that only launches sandboxes never imports pyseccomp.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from agentbox.digest import sha256_hex

PROFILE_RESOURCE = "seccomp_profile.json"
_BINARY_TREE = 2  # libseccomp's SCMP_FLTATR_CTL_OPTIMIZE level (2.5+)
_OPS = {
    op: op.upper() for op in ("eq", "ne", "lt", "le", "gt", "ge", "masked_eq")
}  # -> pyseccomp constant


def load_profile(path: Path | None = None) -> dict[str, Any]:
    """The profile shipped with the package, or one from ``path``."""
    text = _profile_bytes() if path is None else path.read_bytes()
    profile: dict[str, Any] = json.loads(text)
    return profile


def _profile_bytes() -> bytes:
    # Beside this module (as isolation/launcher.py reads its sources: no importlib.resources).
    return Path(__file__).with_name(PROFILE_RESOURCE).read_bytes()


def _action(rule: dict[str, Any]) -> Any:
    import pyseccomp

    kind = rule["action"]
    if kind == "errno":
        return pyseccomp.ERRNO(getattr(errno, rule["errno"]))
    if kind == "kill":
        return pyseccomp.KILL_PROCESS
    if kind == "allow":
        return pyseccomp.ALLOW
    raise ValueError(f"unknown seccomp action {kind!r}")


def _arg(a: dict[str, Any]) -> Any:
    import pyseccomp

    op = getattr(pyseccomp, _OPS[a["op"]])
    if a["op"] == "masked_eq":
        return pyseccomp.Arg(a["index"], op, a["mask"], a["value"])
    return pyseccomp.Arg(a["index"], op, a["value"])


def _conditions(rule: dict[str, Any]) -> list[list[Any]]:
    """The rule as alternatives (ORed), each a list of comparisons (ANDed).

    ``arg_not_in`` (an allowlist of one argument's values) needs more than one rule:
    libseccomp refuses two comparisons on the same argument in one rule, so the
    complement becomes one ``eq`` per refused value below the largest allowed one plus
    ``gt`` that value. The comparisons are on all 64 bits, so a value with upper bits set
    (which the kernel might truncate to an allowed int) is refused too.
    """
    import pyseccomp

    args = [_arg(a) for a in rule.get("args", [])]
    not_in = rule.get("arg_not_in")
    if not_in is None:
        return [args]
    index, allowed = not_in["index"], set(not_in["values"])
    top = max(allowed)
    refused = [pyseccomp.Arg(index, pyseccomp.EQ, v) for v in range(top) if v not in allowed]
    return [[*args, c] for c in [*refused, pyseccomp.Arg(index, pyseccomp.GT, top)]]


def compile_profile(profile: dict[str, Any]) -> bytes:
    """Return the BPF program for ``profile`` for this machine's architecture."""
    import pyseccomp

    default = profile.get("default_action", "allow")
    filt = pyseccomp.SyscallFilter(_action({"action": default}))
    # A binary search on the syscall number, not a chain of comparisons: the kernel runs
    # the program for every syscall number when it loads it (its cache of what is always
    # allowed), per command: ~40 us less CPU per command here, the same decisions.
    filt.set_attr(pyseccomp.Attr.CTL_OPTIMIZE, _BINARY_TREE)
    for rule in profile["rules"]:
        action = _action(rule)
        for name in rule["syscalls"]:
            try:
                pyseccomp.resolve_syscall(pyseccomp.system_arch(), name)
            except Exception:  # noqa: S112 - a syscall this architecture lacks needs no rule
                continue
            for args in _conditions(rule):
                filt.add_rule(action, name, *args)
    import tempfile  # here: compiling is once per host and profile; creates read the cache

    with tempfile.TemporaryFile() as out:
        filt.export_bpf(out)
        out.seek(0)
        return out.read()


def compiled_filter_path(cache_dir: Path) -> Path:
    """The default profile compiled, kept in ``cache_dir`` under a hash of its inputs: the
    profile, this compiler's source and the architecture, so a change to any of them
    compiles anew (libseccomp's version is not in the key: it changes how the program is
    laid out, not what it refuses). Later calls, in any process, cost a stat."""
    inputs = b"\0".join(
        [_profile_bytes(), Path(__file__).read_bytes(), os.uname().machine.encode()]
    )
    path = cache_dir / f"seccomp-{sha256_hex(inputs)[:16]}.bpf"
    if not path.exists():
        program = compile_profile(load_profile())
        cache_dir.mkdir(parents=True, exist_ok=True)
        import tempfile

        fd, tmp = tempfile.mkstemp(dir=cache_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(program)
        Path(tmp).rename(path)  # atomic: concurrent compilers agree on the result
    return path

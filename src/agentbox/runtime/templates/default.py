"""The ``default`` template, synthesised on first use with nothing downloaded: an empty
``usr/`` (the sandbox bind-mounts the host's), usr-merge symlinks, a few directories and a
synthesised ``/etc`` with the host's public CA bundle, ``/etc/alternatives`` links and
``ld.so.cache``. Its digest hashes that content (see :mod:`.store` for why)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agentbox.digest import sha256_hex
from agentbox.runtime.templates.harden import _HOSTS, USER_NAME, USER_UID

_DEFAULT_FORMAT = 2  # bump when the synthesis changes shape
_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
_HOST_ALTERNATIVES = Path("/etc/alternatives")
_LD_SO_CACHE = Path("/etc/ld.so.cache")


def _sha256_json(doc: object) -> str:
    return sha256_hex(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


@dataclass(frozen=True)
class _Entry:
    """One directory, file or symlink of the synthesised tree."""

    path: str
    kind: Literal["dir", "file", "symlink"]
    mode: int = 0o755
    data: bytes = b""
    target: str = ""


_PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\n"
    f"{USER_NAME}:x:{USER_UID}:{USER_UID}::/home/{USER_NAME}:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
_GROUP = f"root:x:0:\n{USER_NAME}:x:{USER_UID}:\nnogroup:x:65534:\n"
_NSSWITCH = (
    "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"
    "networks: files\nprotocols: files\nservices: files\n"
)
_OS_RELEASE = (
    'PRETTY_NAME="agentbox sandbox"\nNAME="agentbox"\nID=agentbox\nVERSION_ID="1"\n'
    'HOME_URL="https://github.com/agentbox"\n'
)
_PROFILE = (
    "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
    "export LANG=C.UTF-8\n"
    'export HOME="${HOME:-/home/user}"\n'
)
_default_cache: tuple[tuple[object, ...], list[_Entry], str] | None = None


def _default_synthesis() -> tuple[list[_Entry], str]:
    """The default template's entries and digest, recomputed only when a host input changed.

    Every sandbox creation asks for the default template: re-reading the CA bundle and the
    alternatives each time would cost milliseconds.
    """
    global _default_cache
    key = tuple(_stat_key(p) for p in (_CA_BUNDLE, _HOST_ALTERNATIVES, _LD_SO_CACHE))
    if _default_cache is None or _default_cache[0] != key:
        entries = _default_entries()
        _default_cache = (key, entries, "sha256:" + _digest_entries(entries))
    return _default_cache[1], _default_cache[2]


def _default_inputs_key() -> str:
    """What the default template is made from, cheaply: the host files' stat keys and the
    source of this module (which holds the rest of its content)."""
    stats = [_stat_key(p) for p in (_CA_BUNDLE, _HOST_ALTERNATIVES, _LD_SO_CACHE)]
    source = sha256_hex(Path(__file__).read_bytes())
    return _sha256_json([_DEFAULT_FORMAT, source, stats])


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _default_entries() -> list[_Entry]:
    """The default rootfs as data; its hash is the default template's digest."""
    dirs = ["usr", "proc", "dev", "tmp", "run", "home", "var", "var/tmp", "etc", ".agentbox"]
    out = [_Entry(d, "dir") for d in dirs]
    # Mount points and the read-only base of $HOME: the sandbox's own disk makes them writable.
    out += [
        _Entry("root", "dir", 0o700),
        _Entry(f"home/{USER_NAME}", "dir"),
        _Entry("workspace", "dir"),
    ]
    out += [_Entry(n, "symlink", target=f"usr/{n}") for n in ("bin", "sbin", "lib", "lib64")]
    files = {
        "etc/passwd": _PASSWD,
        "etc/group": _GROUP,
        "etc/hosts": _HOSTS,
        "etc/hostname": "agentbox\n",
        "etc/nsswitch.conf": _NSSWITCH,
        "etc/resolv.conf": "",  # the sandbox's network setup provides its own resolver
        "etc/os-release": _OS_RELEASE,
        "etc/profile": _PROFILE,
    }
    # Where the sandbox's init is bind-mounted (runtime.host.INIT_PATH): in the template,
    # a create need not write it into each sandbox's upper layer.
    out.append(_Entry(".agentbox/init", "file", 0o644, data=b""))
    out += [_Entry(p, "file", 0o644, data=text.encode()) for p, text in files.items()]
    if _CA_BUNDLE.is_file():  # public data; without it nothing can verify https
        out += [_Entry("etc/ssl", "dir"), _Entry("etc/ssl/certs", "dir")]
        out.append(
            _Entry("etc/ssl/certs/ca-certificates.crt", "file", 0o644, data=_CA_BUNDLE.read_bytes())
        )
    if _LD_SO_CACHE.is_file():
        out.append(_Entry("etc/ld.so.cache", "file", 0o644, data=_LD_SO_CACHE.read_bytes()))
    alternatives = _host_alternatives()
    if alternatives:
        out.append(_Entry("etc/alternatives", "dir"))
        out += [_Entry(f"etc/alternatives/{n}", "symlink", target=t) for n, t in alternatives]
    return out


def _host_alternatives() -> list[tuple[str, str]]:
    """Host /etc/alternatives links that point into /usr: names only, no host file content."""
    try:
        links = sorted(_HOST_ALTERNATIVES.iterdir())
    except OSError:
        return []
    out = []
    for link in links:
        try:
            target = str(link.readlink())
        except OSError:
            continue
        if target.startswith("/usr/") and ".." not in target.split("/"):
            out.append((link.name, target))
    return out


def _digest_entries(entries: list[_Entry]) -> str:
    doc = [_DEFAULT_FORMAT] + [
        [e.path, e.kind, e.mode, sha256_hex(e.data), e.target] for e in entries
    ]
    return _sha256_json(doc)


def _materialize(entries: list[_Entry], rootfs: Path) -> None:
    rootfs.mkdir(mode=0o755)
    for e in entries:
        path = rootfs / e.path
        if e.kind == "dir":
            path.mkdir(mode=e.mode)
        elif e.kind == "symlink":
            path.symlink_to(e.target)
        else:
            path.write_bytes(e.data)
        if e.kind != "symlink":
            path.chmod(e.mode)  # not subject to umask
        if os.geteuid() == 0:
            os.lchown(path, 0, 0)

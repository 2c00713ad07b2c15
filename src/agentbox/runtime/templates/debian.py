"""Debian templates: ``mmdebstrap`` recipes (suite, packages, mirror) checked, the host's
own apt sources and proxy settings read when no mirror is given, and the build run with
its output streamed as progress (the build itself: ``TemplateStore.build``)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

from agentbox.errors import (
    InvalidRequest,
    SandboxError,
)
from agentbox.runtime.templates.harden import Progress

DEFAULT_SUITE = "bookworm"
MMDEBSTRAP = "mmdebstrap"  # looked up on PATH at build time; tests point it at a fake
_RECIPE_FORMAT = 1  # bump when the build or finishing steps change what a recipe makes
_VARIANT = "apt"
_HOST_APT_DIR = Path("/etc/apt")
_HOST_OS_RELEASE = Path("/etc/os-release")
_TAIL_LINES = 25
_SUITE_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,40}$")
# A Debian package name, optionally pinned: python3, libc6=2.36-9, git/bookworm-backports.
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+|/[a-z0-9.-]+)?$")


_MIRROR_RE = re.compile(r"^https?://[^\s\"'\[\]]+$")


def _check_packages(packages: list[str]) -> list[str]:
    pkgs = sorted({p.strip() for p in packages if p.strip()})
    for p in pkgs:
        # Refuses apt patterns and paths: --include=./x.deb would read host files.
        if not _PACKAGE_RE.match(p):
            raise InvalidRequest(
                f"{p!r} is not a Debian package name (like python3, git=1:2.39.5-0+deb12u2 "
                "or git/bookworm-backports)"
            )
    return pkgs


def host_debian_sources(
    suite: str, apt_dir: Path = _HOST_APT_DIR, os_release: Path = _HOST_OS_RELEASE
) -> str | None:
    """The host's Debian apt sources, as deb822 text for ``suite``; None if there are none.

    A source counts when its suites are the host's codename or ``CODENAME-*`` (updates,
    security, backports): third-party repositories never enter a template. For the host's
    own suite every such source is kept; for another suite only the main archive's URI is
    reused, since ``-updates``/``-security`` do not exist for every suite.
    """
    codename = _os_release_codename(os_release)
    if codename is None:
        return None
    stanzas = []
    for src in _read_apt_sources(apt_dir):
        if "deb" not in src["types"] or not src["suites"]:
            continue
        if not all(s == codename or s.startswith(codename + "-") for s in src["suites"]):
            continue
        if suite == codename:
            suites = src["suites"]
        elif codename in src["suites"]:
            suites = [suite]
        else:
            continue
        lines = [
            "Types: deb",
            f"URIs: {' '.join(src['uris'])}",
            f"Suites: {' '.join(suites)}",
            f"Components: {' '.join(src['components'] or ['main'])}",
        ]
        signed_by = src["signed_by"]
        if signed_by and "\n" not in signed_by and Path(signed_by).is_file():
            lines.append(f"Signed-By: {signed_by}")
        stanzas.append("\n".join(lines) + "\n")
    return "\n".join(stanzas) if stanzas else None


def _os_release_codename(path: Path) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "VERSION_CODENAME":
            value = value.strip().strip("\"'")
            return value if _SUITE_RE.match(value) else None
    return None


def _read_apt_sources(apt_dir: Path) -> list[dict[str, Any]]:
    """Entries of sources.list (one-line) and sources.list.d/*.list, *.sources (deb822)."""
    files = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    out: list[dict[str, Any]] = []
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        out += _parse_deb822(text) if f.suffix == ".sources" else _parse_one_line(text)
    return out


def _parse_one_line(text: str) -> list[dict[str, Any]]:
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        options: dict[str, str] = {}
        opts = re.match(r"^(\S+)\s+\[([^\]]*)\]\s+(.*)$", line)
        if opts:
            for item in opts.group(2).split():
                key, _, value = item.partition("=")
                options[key.lower()] = value
            words = [opts.group(1), *opts.group(3).split()]
        else:
            words = line.split()
        if len(words) < 3:
            continue
        out.append(
            {
                "types": [words[0]],
                "uris": [words[1]],
                "suites": [words[2]],
                "components": words[3:],
                "signed_by": options.get("signed-by", ""),
            }
        )
    return out


def _parse_deb822(text: str) -> list[dict[str, Any]]:
    out = []
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if not fields or fields.get("enabled", "yes").lower() == "no":
            continue
        out.append(
            {
                "types": fields.get("types", "").split(),
                "uris": fields.get("uris", "").split(),
                "suites": fields.get("suites", "").split(),
                "components": fields.get("components", "").split(),
                "signed_by": fields.get("signed-by", ""),
            }
        )
    return out


def _host_apt_options() -> list[str]:
    """How the host's apt reaches the archive (proxy, snapshot validity), for mmdebstrap.

    mmdebstrap runs apt with its own configuration, so without these a host behind an apt
    proxy or on a snapshot mirror could not build.
    """
    keys = {
        "HTTP_PROXY": "Acquire::http::Proxy",
        "HTTPS_PROXY": "Acquire::https::Proxy",
        "VALID_UNTIL": "Acquire::Check-Valid-Until",
        "CHECK_DATE": "Acquire::Check-Date",
    }
    import shutil  # here: a build's, never a create's (shutil brings bz2 and lzma)

    exe = shutil.which("apt-config")
    if exe is None:
        return []
    args = [exe, "shell"]
    for var, key in keys.items():
        args += [var, key]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    options = []
    for line in out.splitlines():
        var, _, quoted = line.partition("=")
        words = shlex.split(quoted) if quoted else []
        value = words[0] if words else ""
        if var in keys and value and '"' not in value:
            options.append(f'{keys[var]} "{value}"')
    return options


def _run_streaming(cmd: list[str], staging: Path, say: Progress) -> None:
    """Run mmdebstrap, each output line to ``say``; a failure quotes the output's tail."""
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    env = {**os.environ, "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    env["TMPDIR"] = str(staging)  # any scratch space stays inside what we clean up
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group, so we can stop all of it
    )
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            for line in raw.rstrip("\n").split("\r"):
                if line.strip():
                    tail.append(line)
                    say(line)
        code = proc.wait()
    except BaseException:
        _stop_group(proc)
        raise
    finally:
        proc.stdout.close()
    if code != 0:
        output = "\n".join(f"  {line}" for line in tail) or "  (no output)"
        raise SandboxError(
            f"mmdebstrap failed with exit code {code}; nothing was kept. Check the suite, "
            f"the package names and that the Debian archive is reachable. Last output:\n{output}",
            exit_code=code,
            command=shlex.join(cmd),
        )


def _stop_group(proc: subprocess.Popen[str]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue

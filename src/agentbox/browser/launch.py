"""The browser launcher: what Playwright runs as "chromium" (``executable_path``).

Playwright (on the host, in the gateway) starts ``$AGENTBOX_HOME/lib/agentbox-browser-*``,
a generated shell script that execs ``python -I .../browser/launch.py`` (this file) with
chromium's arguments; fds 3 and 4 are Playwright's ``--remote-debugging-pipe``. This
module turns that into ``agentbox-nsexec enter --keep-fds 2 ... -- chromium ARGS`` and
execs it (exec, never spawn: Playwright's process handling and the pipe stay intact), so
Chromium runs inside the sandbox: its namespaces, cgroup, seccomp, uid and network.

On the gVisor tier no fd can be handed past ``runsc exec`` but its stdio, so the pipe
rides on those: this module makes fd 3 its stdin and fd 4 its stdout and execs ``runsc
exec``, whose process (a root-only file written here) is a shell inside the sandbox that
moves stdin to fd 3 and stdout to fd 4 again (stdout itself then goes to stderr) and
execs Chromium. Chromium sees the same two pipes it would on the default tier.

What to run is decided by the gateway, which built the launch (``nsexec_argv``, or
``runsc_argv`` with ``process`` and ``process_file``) with the sandbox's
``CommandRunner`` and hands it over in ``AGENTBOX_BROWSER_SPEC`` (JSON) through
``launch(env=...)``: the only environment this process gets. Chromium itself gets the
sandbox's environment, never this one. Only the standard library is imported here: the
launcher is on the browser's start-up path.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

SPEC_ENV = "AGENTBOX_BROWSER_SPEC"
# Chromium otherwise calls Google services on its own (and QUIC would bypass the proxy's
# TCP path). Enforced here whatever Playwright passes.
# Port 9 is on Chromium's list of unsafe ports: a request there fails before connecting.
_NOWHERE = "http://127.0.0.1:9"
# User namespaces are disabled in the namespaces tier's sandboxes: Chromium's own sandbox
# cannot start there, and the sandbox is the boundary. On gVisor it can (see own_sandbox).
NO_SANDBOX = "--no-sandbox"
REQUIRED_FLAGS = (
    NO_SANDBOX,
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-gpu",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    # Measured with Chromium 156: even with the flags above it asks accounts.google.com
    # (ListAccounts, at every start) and update.googleapis.com (an on-demand component).
    # No switch turns those off; pointing their base URLs at nowhere does.
    f"--gaia-url={_NOWHERE}",
    f"--component-updater=url-source={_NOWHERE}/",
)
DISABLED_FEATURES = (
    "MediaRouter",
    "OptimizationHints",
    "Translate",
    "DialMediaRouteProvider",
    "InterestFeedContentSuggestions",
    "CertificateTransparencyComponentUpdater",
    "AutofillServerCommunication",
    "NetworkTimeServiceQuerying",
)
# Flags Playwright may pass that must not survive: ours replace them.
_DROPPED_PREFIXES = (
    "--user-data-dir=",
    "--proxy-server=",
    "--proxy-pac-url=",
    "--proxy-bypass-list=",
    "--remote-debugging-port=",
    "--remote-debugging-address=",
    "--gaia-url=",
    "--component-updater=",
    "--ignore-certificate-errors-spki-list=",
)
_DROPPED = ("--no-proxy-server", "--proxy-auto-detect")


def chromium_args(
    given: Sequence[str],
    user_data_dir: str,
    proxy: str | None,
    trusted_spki: str | None = None,
    own_sandbox: bool = False,
) -> list[str]:
    """Playwright's arguments, with our profile directory, proxy and required flags;
    ``trusted_spki``: the egress CA's key, for sandboxes whose egress injects credentials
    (chains the proxy presents include that CA, and only those chains match).

    Chromium keeps only the last ``--disable-features``, so every list is merged into one.
    """
    out: list[str] = []
    disabled: list[str] = []
    for arg in given:
        if arg.startswith("--disable-features="):
            disabled += [f for f in arg.partition("=")[2].split(",") if f]
        elif arg in _DROPPED or arg.startswith(_DROPPED_PREFIXES) or arg in REQUIRED_FLAGS:
            continue
        else:
            out.append(arg)
    disabled += [f for f in DISABLED_FEATURES if f not in disabled]
    required = [f for f in REQUIRED_FLAGS if not (own_sandbox and f == NO_SANDBOX)]
    out += [*required, f"--disable-features={','.join(_unique(disabled))}"]
    out.append(f"--user-data-dir={user_data_dir}")
    if proxy:
        out.append(f"--proxy-server={proxy}")
    if trusted_spki:
        out.append(f"--ignore-certificate-errors-spki-list={trusted_spki}")
    return out


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def build_argv(spec: dict[str, Any], given: Sequence[str]) -> list[str]:
    """The nsexec argv (ends with ``--``), chromium, and its arguments; for a ``runsc``
    spec, the process's argv (the relay shell's, then chromium's)."""
    prefix = [str(a) for a in spec.get("nsexec_argv") or spec["process"]["args"]]
    if "nsexec_argv" in spec and prefix[-1] != "--":
        raise ValueError("nsexec_argv must end with --")
    args = chromium_args(
        given,
        str(spec["user_data_dir"]),
        spec.get("proxy"),
        spec.get("trusted_spki"),
        own_sandbox=bool(spec.get("own_sandbox")),
    )
    return [*prefix, str(spec["chromium"]), *args]


def _exec_in_gvisor(spec: dict[str, Any], full: list[str]) -> None:
    """Write runsc's process file (root-only: it holds the sandbox's environment) and
    exec ``runsc exec`` with the DevTools pipe (fds 3, 4) as its stdin and stdout."""
    process = {**spec["process"], "args": full}
    path = str(spec["process_file"])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(process, f)
    os.dup2(3, 0)
    os.dup2(4, 1)
    os.close(3)
    os.close(4)
    argv = [str(a) for a in spec["runsc_argv"]]
    env = {str(k): str(v) for k, v in spec["env"].items()}
    os.execve(argv[0], argv, env)  # noqa: S606 - an argv, no shell


def launcher_script(lib_dir: Path) -> Path:
    """The executable Playwright is given: a script that runs this file (the gateway's
    own code: it imports only the standard library) with the gateway's interpreter
    (``-I``: no PYTHON* variables, no user site, no cwd or script directory)."""
    here = _sh_quote(str(Path(__file__).resolve()))
    text = f'#!/bin/sh\nexec {_sh_quote(sys.executable)} -I {here} "$@"\n'
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    script = lib_dir / f"agentbox-browser-{digest}"
    if script.exists():
        return script
    lib_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=lib_dir, prefix=".browser-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)  # noqa: S103 - root-owned, executable by Playwright
        os.replace(tmp, script)  # atomic: concurrent writers agree on the result
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return script


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def main(argv: Sequence[str]) -> None:
    raw = os.environ.get(SPEC_ENV)
    if not raw:
        sys.stderr.write(f"agentbox-browser: {SPEC_ENV} is not set; only the gateway runs this\n")
        raise SystemExit(125)
    spec = json.loads(raw)
    full = build_argv(spec, argv)
    if "runsc_argv" in spec:
        _exec_in_gvisor(spec, full)
    env = {str(k): str(v) for k, v in spec["env"].items()}
    os.execve(full[0], full, env)  # noqa: S606 - an argv, no shell


if __name__ == "__main__":
    main(sys.argv[1:])

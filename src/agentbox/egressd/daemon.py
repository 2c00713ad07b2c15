"""The egress daemon: the filtering proxy every networked sandbox talks to.

One per AGENTBOX_HOME, started on demand by whoever creates the first networked sandbox
(``egress_start.ensure_running``), detached from it, so sandboxes keep their network when
their creator — or the gateway — exits or restarts. It exits by itself once no networked
sandbox has been running for ``IDLE_EXIT`` seconds.

It knows a client by its source address (nftables drops spoofed ones), finds the sandbox
that owns that address in the state database, and applies that sandbox's network spec.
Every decision is appended to its own hash-chained audit log, ``audit/egress.jsonl``
(same format and ``agentbox audit verify``/``tail`` as the gateway's trail).

Mode ``ask``: a connection to a name on neither list is held while a person decides
(:mod:`egress_ask`); the request and the decision go through the gateway's approval table:
this home's ``gateway.db``, or the shared state database (PostgreSQL) the gateway or
node serving the home named in ``egress-state.url`` when it started (cluster mode: a
person approving through any replica decides for this node's sandboxes).

Credentials: the daemon inherits the environment of the process that started it (the
gateway in production, which holds the secrets) and reads a credential's variable when a
request to its host is forwarded. ``AGENTBOX_EGRESS_UPSTREAM_CA`` (a PEM file), if set
in that environment, is trusted for upstream TLS in addition to the system store
(private deployments, tests). Its CA for credential hosts is ``egressca`` in the home.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentbox.audit.log import AuditLog
from agentbox.egressd.ask import EgressAsk
from agentbox.errors import AgentboxError
from agentbox.network import egressca, plane
from agentbox.network.egress_start import SPAWN_LOCK, lock_path
from agentbox.network.proxy import EgressDecision, EgressPolicy, EgressProxy, upstream_context
from agentbox.policy.approvals import ApprovalStore
from agentbox.runtime.store import SandboxRecord, Store

log = logging.getLogger("agentbox.egress")
IDLE_EXIT = 60.0
PID_FILE = "egress.pid"  # the serving daemon's pid (valid while egress.lock is held)
UPSTREAM_CA_ENV = "AGENTBOX_EGRESS_UPSTREAM_CA"


def audit_path(home: Path) -> Path:
    return home / "audit" / "egress.jsonl"


def state_path(home: Path) -> Path:
    """Where the gateway (or node) serving ``home`` names its state database, when that
    is not the home's SQLite: the daemon files egress approvals there, so a person deciding
    through any gateway replica decides for this home's sandboxes (cluster mode)."""
    return home / "egress-state.url"


def publish_state(home: Path, url: str) -> None:
    """Called by the gateway at start: ``url`` (``gateway.state``) for the daemons it
    starts from now on; ``sqlite`` removes the file (the home's ``gateway.db``)."""
    target = state_path(home)
    if url == "sqlite":
        target.unlink(missing_ok=True)
        return
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:  # 0600: the URL may hold the database's password
        f.write(url + "\n")
    os.replace(tmp, target)


class ServingApprovals:
    """The approval table of the gateway serving ``home`` *now* (state_path), for a
    daemon that outlives gateways: one restarted on another state database (SQLite <->
    PostgreSQL, or another PostgreSQL) republishes the file, and the next approval must go
    where a person deciding through that gateway will see it, not where the daemon's first
    gateway kept them. The file is read per approval filed (a few bytes); the table is
    opened again only when it names another database."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._url: str | None = None
        self._store: ApprovalStore | None = None

    def __call__(self) -> ApprovalStore:
        try:
            url = state_path(self.home).read_text().strip()
        except FileNotFoundError:
            url = "sqlite"
        if self._store is None or url != self._url:
            from agentbox.state import open_shared

            shared = open_shared(url)
            # An approval being waited for keeps the table it was filed in (its own reference).
            self._url, self._store = (
                url,
                ApprovalStore(shared if shared is not None else self.home / "gateway.db"),
            )
        return self._store


def host_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every network the host has an address on: a sandbox may reach neither the host
    nor its LAN neighbours, whatever range the LAN uses."""
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True)
    return [
        ipaddress.ip_interface(f"{info['local']}/{info['prefixlen']}").network
        for link in json.loads(out.stdout)
        for info in link.get("addr_info", [])
        if "local" in info
    ]


class PolicyBook:
    """Source address -> the network spec of the sandbox that owns it, from the store."""

    def __init__(self, store: Store, net: plane.HomeNet) -> None:
        self.store = store
        self.net = net
        # A sandbox's spec never changes: its policy (validated, names normalised) is
        # built once. The slot is looked up every time: slots are reused by new sandboxes.
        self._policies: dict[str, EgressPolicy] = {}

    def policy_for(self, peer: str) -> EgressPolicy | None:
        link = plane.link_for_address(peer)
        if link is None or link.home != self.net:
            return None  # not a sandbox of this home (nftables keeps others away anyway)
        sandbox_id = self.store.running_in_slot(link.slot)
        if sandbox_id is None:
            return None
        policy = self._policies.get(sandbox_id)
        if policy is None:
            record = self.store.get(sandbox_id)
            if record is None:
                return None  # destroyed in between
            if len(self._policies) >= 4 * plane.MAX_SLOTS:
                self._policies.clear()  # ids of destroyed sandboxes pile up otherwise
            policy = self._policies[sandbox_id] = self._build(record)
        return policy

    @staticmethod
    def _build(record: SandboxRecord) -> EgressPolicy:
        """The policy of a record. Create validated its spec (``NetworkSpec``, the checks
        the policy runs too); one that fails anyway (a record written by an older version,
        an edited database) is logged once and its sandbox gets no egress: the proxy
        never meets a spec it cannot parse on a connection."""
        try:
            spec = record.spec
            policy = EgressPolicy.from_spec(record.id, spec.network)
        except AgentboxError as e:
            log.warning("sandbox %s: its network spec is refused, no egress: %s", record.id, e)
            return EgressPolicy(record.id, "none")
        # Mode ask: whose persistent allowlist applies.
        return dataclasses.replace(policy, project=spec.project)

    def networked_alive(self) -> bool:
        # The mode alone, read without validating: this runs every few seconds.
        return any(
            r.state in ("creating", "running") and r.network_mode != "none"
            for r in self.store.list()
        )


def _note(audit: AuditLog, decision: str, sandbox: str, extra: Mapping[str, Any]) -> None:
    """A step of mode ask (held, requested, decided) into the egress audit log."""
    audit.append(decision=decision, actor="egress", sandbox=sandbox, tool="egress", extra=extra)


def _record(audit: AuditLog, d: EgressDecision) -> None:
    audit.append(
        decision="egress_allowed" if d.allowed else "egress_denied",
        actor="egress",
        sandbox=d.sandbox_id,
        tool="egress",
        duration_ms=round(d.duration_ms, 3),
        bytes_out=d.bytes_down,
        error=None if d.allowed else d.reason,
        extra={
            "host": d.host,
            "port": d.port,
            "address": d.address,
            "reason": d.reason,
            "kind": d.kind,
            "bytes_up": d.bytes_up,
        },
    )


async def serve(home: Path, ready_fd: int | None) -> None:
    store = Store(home / "state.db")
    net = plane.home_net(home)
    book = PolicyBook(store, net)
    extra = [*host_networks(), plane.SUBNETS, plane.PROXIES]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        ca: egressca.EgressCA | None = egressca.EgressCA.load_or_create(egressca.ca_dir(home))
    except (OSError, ValueError) as e:
        log.error("egress CA unavailable, HTTPS credential injection is refused: %s", e)
        ca = None
    upstream = upstream_context(os.environ.get(UPSTREAM_CA_ENV) or None)
    with AuditLog(audit_path(home), fsync="batch") as audit:
        ask = EgressAsk(ServingApprovals(home), lambda *step: _note(audit, *step))
        proxy = EgressProxy(
            book.policy_for,
            lambda d: _record(audit, d),
            extra_denied=extra,
            ca=ca,
            upstream_tls=upstream,
            ask=ask,
        )
        servers = [
            await proxy.serve_explicit(net.proxy_address, plane.EXPLICIT_PORT),
            await proxy.serve_transparent(net.proxy_address, plane.TRANSPARENT_PORT),
        ]
        if ready_fd is not None:
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)
        idle_since: float | None = None
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5)
            if not home.is_dir():
                break  # the home was removed: nothing left to serve
            if book.networked_alive():
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_EXIT:
                # Spawners hold the spawn lock while they check for us: take it so that
                # none can count on this daemon between the last check and the exit.
                spawn = os.open(home / SPAWN_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                await asyncio.to_thread(fcntl.flock, spawn, fcntl.LOCK_EX)
                if not book.networked_alive():
                    break  # exiting releases the locks
                os.close(spawn)
                idle_since = None
        for server in servers:
            server.close()
        ask.close()
        # the audit log is closed (fsynced, head written) on leaving the with-block


def _lock_for_life(path: Path) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    return True  # the fd stays open (and locked) until the process exits


def main() -> None:
    parser = argparse.ArgumentParser(prog="agentbox-egress")
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args()
    if os.fork():
        os._exit(0)  # the spawner waits for this parent only; the child is the daemon
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s egress %(message)s")
    # Locks are taken before listening and held for life: holding them means "serving".
    if not _lock_for_life(lock_path(args.home)):
        sys.exit(0)
    if not _lock_for_life(plane.number_lock(plane.home_net(args.home).index)):
        sys.exit("the egress daemon of a removed home still holds this home's number")
    (args.home / PID_FILE).write_text(f"{os.getpid()}\n")
    import uvloop

    uvloop.run(serve(args.home, args.ready_fd))


if __name__ == "__main__":
    main()

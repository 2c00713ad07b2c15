"""The host side of sandbox networking: one veth per sandbox, nftables, the proxy address.

Topology (IPv4 only; every IPv6 packet from a sandbox is dropped), for home number k::

    sandbox netns                        host
    eth0 <subnet_k>+2s+1/31 ──veth── abh<k>x<s> <subnet_k>+2s/31
    default via 2s                       lo: 10.204.0.<k+1>/32 = the home's egress proxy
                                             :3128 explicit HTTP proxy (HTTP(S)_PROXY)
                                             :3129 transparent (nft redirects other TCP)

Several homes (AGENTBOX_HOME) on one host each get a number k (0..31) from a host-wide
registry (``/run/agentbox/net-homes.json``), a /19 of 10.200.0.0/14 for their sandboxes
(slot s owns a point-to-point /31, RFC 3021: 4096 slots need 8192 addresses) and their
own proxy address; their egress daemons are independent. A number is in use while a
process holds its use lock (shared, from the first lookup to the process's end), its
egress daemon holds ``egress-<k>.lock``, or an ``abh<k>x*`` link exists (a live
sandbox); one that is none of these is reclaimed when the numbers run out.

The sandbox's only reachable peer is its home's proxy. nftables (table ``inet agentbox``,
the same for every home: all 32 are written out) does the rest, keyed on the interface
name and loaded *before* any veth exists:

* a filter chain at prerouting priority -150 drops, from any ``abh*`` interface: IPv6, a
  source address not routed back through that interface (strict reverse-path check:
  only the sandbox's own address is, so nothing per sandbox needs loading), every
  always-denied range (loopback, RFC 1918, link-local / metadata, CGNAT, multicast, ...,
  which includes other homes' proxies), any address of the host itself, and everything
  that is not TCP (UDP, so DNS, and ICMP); each drop has a named counter
  (``nft list counters table inet agentbox``);
* a nat chain sends the TCP that is left to the transparent port of the home's proxy, so
  a program that ignores the proxy variables is filtered by name all the same;
* the forward chain drops anything from or to ``abh*``, and forwarding is off on every
  sandbox link (nothing from a sandbox may be routed out unfiltered).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import json
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agentbox.errors import HostUnsupported, SandboxError
from agentbox.network import nftgen, sandbox_env
from agentbox.network.addresses import DENIED_NETWORKS
from agentbox.network.sandbox_env import SANDBOX_CA_BUNDLE as SANDBOX_CA_BUNDLE
from agentbox.network.sandbox_env import ca_env as ca_env

TABLE = "agentbox"
SUBNETS = ipaddress.IPv4Network("10.200.0.0/14")  # 32 homes x a /19 each
PROXIES = ipaddress.IPv4Network("10.204.0.0/24")  # home k's proxy: .k+1
EXPLICIT_PORT = sandbox_env.EXPLICIT_PORT
TRANSPARENT_PORT = 3129
MAX_SLOTS = 4096
MAX_HOMES = 32
_HOME_BITS = 13  # a /19: MAX_SLOTS point-to-point /31 links
REGISTRY = Path("/run/agentbox/net-homes.json")
NET_DEVICES = Path("/sys/class/net")
_IFNAME_PREFIX = "abh"
_setup_lock = threading.Lock()
_set_up: set[int] = set()  # per process: checking costs a netlink round trip or two
_homes: dict[str, HomeNet] = {}
_held: dict[Path, int] = {}  # use lock -> its fd, shared-locked for this process's life


@dataclass(frozen=True)
class HomeNet:
    """The network numbers of one AGENTBOX_HOME on this host."""

    index: int

    @property
    def proxy_address(self) -> str:
        return str(PROXIES.network_address + self.index + 1)

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        base = int(SUBNETS.network_address) + (self.index << _HOME_BITS)
        return ipaddress.IPv4Network((base, 32 - _HOME_BITS))

    @property
    def ifname_prefix(self) -> str:
        return f"{_IFNAME_PREFIX}{self.index}x"

    def link(self, slot: int) -> Link:
        return Link(self, slot)

    def proxy_env(self) -> dict[str, str]:
        """What a networked sandbox's processes see (``network.sandbox_env``)."""
        return sandbox_env.proxy_env(self.proxy_address)


@dataclass(frozen=True)
class Link:
    """The addresses of one sandbox's veth pair."""

    home: HomeNet
    slot: int

    @property
    def host_ifname(self) -> str:
        return f"{self.home.ifname_prefix}{self.slot}"

    @property
    def host_address(self) -> str:
        return str(self.home.subnet.network_address + 2 * self.slot)

    @property
    def sandbox_address(self) -> str:
        return str(self.home.subnet.network_address + 2 * self.slot + 1)


def link_for_address(address: str) -> Link | None:
    """The link whose sandbox side has ``address`` (how a proxy knows its client)."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    if ip not in SUBNETS:
        return None
    offset = int(ip) - int(SUBNETS.network_address)
    home, rest = divmod(offset, 1 << _HOME_BITS)
    if rest % 2 != 1:
        return None
    return Link(HomeNet(home), rest // 2)


@contextlib.contextmanager
def _registry_locked() -> Iterator[None]:
    REGISTRY.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(REGISTRY.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def number_lock(index: int) -> Path:
    """Held for life by the egress daemon serving home number ``index``."""
    return REGISTRY.parent / f"egress-{index}.lock"


def use_lock(index: int) -> Path:
    """Shared-locked by every process that may use number ``index`` (it caches it)."""
    return REGISTRY.parent / f"net-{index}.lock"


def flock_held(path: Path) -> bool:
    """Whether some process holds a flock on ``path``, as ``/proc/locks`` says: probing by
    taking the lock would make a daemon that takes it (non-blocking) that instant fail."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    # "1: FLOCK  ADVISORY  WRITE 26917 fe:00:2155525 0 EOF"; waiters ("1: -> FLOCK") hold none
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == key:
            return True
    return False


def _has_links(index: int) -> bool:
    prefix = HomeNet(index).ifname_prefix
    return any(name.startswith(prefix) for name in os.listdir(NET_DEVICES))


def _idle(index: int) -> bool:
    """Nobody uses number ``index``: no process has it, no egress daemon serves it, no
    sandbox has a link of it. Only meaningful under the registry lock (a process takes
    the use lock under it, before it can make a link or start a daemon)."""
    return not (flock_held(use_lock(index)) or flock_held(number_lock(index)) or _has_links(index))


def _hold(index: int, key: str) -> None:
    """Take number ``index``'s use lock for the rest of this process (registry locked).
    The file names the home it was taken for, and its mtime says when it last was."""
    path = use_lock(index)
    if path not in _held:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _held[path] = fd
        if _lock_owner(index) != key:
            os.truncate(fd, 0)
            os.pwrite(fd, key.encode(), 0)
        os.utime(fd)


def _lock_owner(index: int) -> str | None:
    try:
        return use_lock(index).read_text()
    except OSError:
        return None


def registered_home_net(home: Path) -> HomeNet | None:
    """This home's number if it has one (no allocation: for tearing down)."""
    key = str(home.resolve())
    if key not in _homes:
        with _registry_locked():
            number = _read_registry().get(key)
            if number is None:
                return None
            _hold(number, key)
        _homes[key] = HomeNet(number)
    return _homes[key]


def _read_registry() -> dict[str, int]:
    try:
        homes: dict[str, int] = json.loads(REGISTRY.read_text())
    except (OSError, ValueError):
        return {}
    return homes


def home_net(home: Path) -> HomeNet:
    """This home's number on this host, allocated on first use and held by this process
    from then on. Numbers of homes whose directory is gone are reused, and when none is
    free, the number of a home nobody uses (see ``_idle``) is reclaimed: that home gets a
    new number when it is next used. /run is emptied at boot, with every sandbox."""
    key = str(home.resolve())
    if key in _homes:
        return _homes[key]
    with _registry_locked():
        homes = _read_registry()
        if key not in homes:
            homes = {h: k for h, k in homes.items() if Path(h).is_dir()}
            # A gone home's number is free once nothing uses it any more (its egress
            # daemon may outlive the directory for a moment).
            free = (k for k in range(MAX_HOMES) if k not in homes.values() and _idle(k))
            number = next(free, None)
            if number is None:
                number = _reclaim(homes)
            homes[key] = number
            tmp = REGISTRY.with_suffix(".tmp")
            tmp.write_text(json.dumps(homes, indent=1))
            os.replace(tmp, REGISTRY)
        _hold(homes[key], key)
    _homes[key] = HomeNet(homes[key])
    return _homes[key]


def _reclaim(homes: dict[str, int]) -> int:
    """Take the number of a registered home nobody uses, the one used longest ago
    (registry locked, ``homes`` updated). A home registered by an agentbox without use
    locks (its number's ``net-<k>.lock`` names no home or another one) may have a
    process that still holds its number: those are reclaimed last."""

    def order(home: str) -> tuple[bool, float]:
        if _lock_owner(homes[home]) != home:
            return (True, 0.0)
        return (False, use_lock(homes[home]).stat().st_mtime)

    idle = sorted((order(h), h) for h, k in homes.items() if _idle(k))
    if not idle:
        raise HostUnsupported(
            f"{MAX_HOMES} AGENTBOX_HOMEs on this host already have networking in use "
            f"(see {REGISTRY}): destroy their sandboxes and stop their gateways, "
            "or use network none"
        )
    return homes.pop(idle[0][1])


# Where a sandbox that holds credentials finds the egress CA (written at create, in its
# writable layer) and the trust bundle (the host's CAs + the egress CA).
SANDBOX_CA = "/etc/agentbox/egress-ca.pem"


def _run(argv: list[str], stdin: str | None = None) -> None:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise HostUnsupported(
            f"{argv[0]} is not installed: apt-get install -y nftables iproute2 util-linux"
        ) from None
    if done.returncode != 0:
        raise SandboxError(
            f"network setup failed: `{' '.join(argv)}`: {done.stderr.strip() or done.stdout}"
        )


def ruleset() -> str:
    """The nftables table, replaced whole (``nft -f``): idempotent and atomic, and the
    same whichever home loads it (every home's rules are written out)."""
    denied = ", ".join(str(n) for n in DENIED_NETWORKS if n.version == 4)
    sandbox = f'iifname "{_IFNAME_PREFIX}*"'
    ports = f"{{ {EXPLICIT_PORT}, {TRANSPARENT_PORT} }}"
    homes = [HomeNet(k) for k in range(MAX_HOMES)]
    own_proxy = "\n        ".join(
        f'iifname "{h.ifname_prefix}*" ip daddr {h.proxy_address} tcp dport {ports} accept'
        for h in homes
    )
    intercept = "\n        ".join(
        f'iifname "{h.ifname_prefix}*" ip daddr != {h.proxy_address} meta l4proto tcp '
        f"dnat ip to {h.proxy_address}:{TRANSPARENT_PORT}"
        for h in homes
    )
    return f"""
table inet {TABLE}
delete table inet {TABLE}
table inet {TABLE} {{
    counter spoofed {{ }}
    counter ipv6 {{ }}
    counter denied_range {{ }}
    counter host_address {{ }}
    counter not_tcp {{ }}
    counter forwarded {{ }}
    chain guard {{
        type filter hook prerouting priority -150; policy accept;
        {sandbox} jump from_sandbox
    }}
    chain from_sandbox {{
        meta nfproto ipv6 counter name ipv6 drop
        fib saddr . iif oif missing counter name spoofed drop
        {own_proxy}
        ip daddr {{ {denied} }} counter name denied_range drop
        fib daddr type local counter name host_address drop
        meta l4proto != tcp counter name not_tcp drop
    }}
    chain intercept {{
        type nat hook prerouting priority dstnat; policy accept;
        {intercept}
    }}
    chain forward_guard {{
        type filter hook forward priority -150; policy accept;
        {sandbox} counter name forwarded drop
        oifname "{_IFNAME_PREFIX}*" counter name forwarded drop
    }}
}}
"""


def ensure_host_setup(net: HomeNet) -> None:
    """The nft table and this home's proxy address. Safe to call again; rules first.
    Cheap in a new process too (a one-shot script's first create paid an ``nft`` and an
    ``ip`` process here): the table is listed only when the ruleset changed since the last
    check (``nftgen``), and the address is added over rtnetlink, present or not."""
    with _setup_lock:
        if net.index in _set_up:
            return
        # Read before the check: a change during it makes a newer one, checked next time.
        gen = nftgen.generation()
        if gen is None or gen != nftgen.read_checked(str(REGISTRY.parent)):
            if _table_loaded():
                if gen is not None:
                    REGISTRY.parent.mkdir(parents=True, exist_ok=True)
                    nftgen.note_checked(str(REGISTRY.parent), gen)
            else:
                _run(["nft", "-f", "-"], ruleset())  # noted once a later check finds it
        # On lo, not a dummy link: these kernels may lack the dummy driver, and an
        # address on lo is local to the host and routed nowhere.
        _add_proxy_address(net)
        _set_up.add(net.index)


def _add_proxy_address(net: HomeNet) -> None:
    from agentbox.network import rtnetlink

    try:
        with rtnetlink.Route.here() as route:
            route.add_address(route.index("lo"), net.proxy_address, 32)
    except FileExistsError:
        pass  # there already (an earlier create, another process)
    except OSError as e:
        raise SandboxError(
            f"network setup failed: adding {net.proxy_address}/32 to lo: {e.strerror}"
        ) from None


def _table_loaded() -> bool:
    done = subprocess.run(
        ["nft", "list", "chain", "inet", TABLE, "intercept"],
        capture_output=True,
        text=True,
        check=False,
    )
    # An older table (one home only) lacks the per-home rules: reload it.
    return done.returncode == 0 and f"{HomeNet(MAX_HOMES - 1).proxy_address}:" in done.stdout


def attach(link: Link, netns: int | Path) -> None:
    """Give a sandbox its veth: ``netns`` is its init's pid (the default tier) or a path
    that pins its network namespace (the gVisor tier, wired before runsc starts). The
    rules already hold for every ``abh*`` name, so it is filtered from its first packet."""
    from agentbox.network import ports, rtnetlink

    try:
        with rtnetlink.Route.here() as host:
            host.add_veth(link.host_ifname, "eth0", netns)
            index = host.index(link.host_ifname)
            host.add_address(index, link.host_address, 31)
            host.set_up(index)
        # Defence in depth, before the sandbox end comes up (no packet can flow until
        # then): with forwarding off on its host end, the kernel routes nothing arriving
        # from the sandbox anywhere, even if the nft table were flushed on a host that
        # forwards. (The interception still works: DNAT makes the destination local
        # before routing.)
        conf = Path("/proc/sys/net")
        (conf / "ipv4" / "conf" / link.host_ifname / "forwarding").write_text("0")
        ipv6 = conf / "ipv6" / "conf" / link.host_ifname / "disable_ipv6"
        if ipv6.exists():
            ipv6.write_text("1")
        inside = ports.socket_in_netns(
            netns, socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE
        )
        with rtnetlink.Route(inside) as sandbox:
            index = sandbox.index("eth0")
            sandbox.add_address(index, link.sandbox_address, 31)
            sandbox.set_up(index)
            sandbox.add_default_route(link.host_address, index)
    except OSError as e:
        raise SandboxError(f"network setup failed for {link.host_ifname}: {e.strerror or e}") from e


DETACH_TIMEOUT_S = 10.0
NETNS_GRACE_S = 0.2  # how long a destroy lets the kernel remove the pair with the netns


def detach(link: Link) -> None:
    """Remove a sandbox's veth pair unless it is gone already; returns once both ends are
    gone (the deleting call returned), raises SandboxError if it could not be removed."""
    detaching(link, whole=True)()


def detaching(link: Link, *, netns_ending: bool = False, whole: bool = False) -> Callable[[], None]:
    """Watch a sandbox's veth pair from now on; the returned call waits (at most
    DETACH_TIMEOUT_S) until its host end is gone and raises SandboxError if the kernel
    refused to remove it.

    ``netns_ending``: the caller is about to end the sandbox's last process (a destroy
    calls this before the kill and waits after unmounting the disk). The kernel then
    removes the pair itself with the network namespace, ~1 ms after the last process
    ends, and the wait sees it announced (``rtnetlink.LinkWatch``). Deleting it instead
    cost a destroy 13-18 ms: the deleting request returns only after an RCU barrier.
    If it is still there after NETNS_GRACE_S (something else holds the namespace, such
    as a socket the host opened in it), or at once without ``netns_ending``, it is
    deleted on a thread, and the wait still ends with the announcement (name, addresses
    and routes gone: the slot is free), not with the barrier (``whole``: with it, and
    the peer gone too). Over rtnetlink, not `ip`."""
    from agentbox.network import rtnetlink

    device = NET_DEVICES / link.host_ifname
    watch = rtnetlink.LinkWatch()  # before the look: a removal in between is announced
    try:
        index = int((device / "ifindex").read_text())
    except (OSError, ValueError):  # gone already (with its netns, or an earlier destroy)
        watch.close()
        return lambda: None

    def gone(until: float, done: int | None = None) -> bool:
        """Whether the removal was announced by ``until`` (monotonic), or by the time the
        deleting call (``done`` readable: it returned) failed or succeeded."""
        while True:
            seen = watch.deleted(index)
            if seen or (seen is None and not device.exists()):
                return True
            fds: list[socket.socket | int] = [watch.sock] if done is None else [watch.sock, done]
            ready, _, _ = select.select(fds, [], [], max(until - time.monotonic(), 0))
            if not ready or (done is not None and done in ready):
                return not device.exists()

    def wait() -> None:
        deadline = time.monotonic() + DETACH_TIMEOUT_S
        done: int | None = None
        try:
            if gone(time.monotonic() + (NETNS_GRACE_S if netns_ending else 0.0)):
                return
            done, refused = _delete_in_background(link.host_ifname)
            if gone(deadline, done):
                if whole:  # until the deleting call returned: the peer is gone as well
                    select.select([done], [], [], max(deadline - time.monotonic(), 0))
                return
            error = refused()
            why = (
                (error.strerror or str(error))
                if error
                else f"still there after {DETACH_TIMEOUT_S:g} s"
            )
            raise SandboxError(
                f"could not remove the sandbox's network link {link.host_ifname}: {why}"
            )
        finally:
            watch.close()
            if done is not None:
                os.close(done)

    return wait


def _delete_in_background(name: str) -> tuple[int, Callable[[], OSError | None]]:
    """Send the request deleting link ``name`` from a thread of its own (it returns only
    after an RCU barrier, long after the link is gone). Returns a pipe's read end that
    polls readable once the request returned (the caller closes it), and what the kernel
    refused with (None: nothing yet, deleted, or gone meanwhile)."""
    from agentbox.network import rtnetlink

    refused: list[OSError] = []
    done_r, done_w = os.pipe()

    def delete() -> None:
        try:
            with rtnetlink.Route.here() as route:
                route.delete_link(name)
        except OSError as e:
            if e.errno != errno.ENODEV:  # ENODEV: gone meanwhile (its netns went first)
                refused.append(e)
        finally:
            os.close(done_w)

    threading.Thread(target=delete, name="veth-detach", daemon=True).start()
    return done_r, lambda: refused[0] if refused else None

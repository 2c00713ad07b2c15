"""The host side of sandbox networking: one veth per sandbox, nftables, the proxy address.

Topology (IPv4 only; every IPv6 packet from a sandbox is dropped)::

    sandbox netns                        host
    eth0 10.201.A.B+2/30 ──veth── abh<slot> 10.201.A.B+1/30
    default via B+1                      lo: 10.201.255.254/32 = the egress proxy
                                             :3128 explicit HTTP proxy (HTTP(S)_PROXY)
                                             :3129 transparent (nft redirects all other TCP)

The sandbox's only reachable peer is the proxy. nftables (table ``inet agentbox``) does
the rest, keyed on the interface name and loaded *before* any veth exists:

* a filter chain at prerouting priority -150 drops, from any ``abh*`` interface: IPv6, a
  source address not routed back through that interface (strict reverse-path check:
  only the sandbox's own address is, so nothing per sandbox needs loading), every
  always-denied range (loopback, RFC 1918, link-local / metadata, CGNAT, multicast, ...),
  any address of the host itself, and everything that is not TCP (UDP, so DNS, and ICMP);
  each drop has a named counter (``nft list counters table inet agentbox``);
* a nat chain sends the TCP that is left to the transparent port of the proxy, so a
  program that ignores the proxy variables is filtered by name all the same;
* the forward chain drops anything from or to ``abh*`` (IP forwarding is on on these
  hosts: nothing from a sandbox may be routed out unfiltered).

Addresses: sandbox slot ``s`` (0..4095) owns ``10.201.0.0 + 4*s``/30. One AGENTBOX_HOME
per host may use networking (slots, and so interfaces and addresses, are per home).
"""

from __future__ import annotations

import ipaddress
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from agentbox.errors import HostUnsupported, SandboxError
from agentbox.network.addresses import DENIED_NETWORKS

TABLE = "agentbox"
SUBNET = ipaddress.IPv4Network("10.201.0.0/16")
PROXY_ADDRESS = "10.201.255.254"
EXPLICIT_PORT = 3128
TRANSPARENT_PORT = 3129
MAX_SLOTS = 4096
_IFNAME_PREFIX = "abh"
_setup_lock = threading.Lock()
_set_up = False  # per process: checking costs two subprocesses (~5 ms) per create


@dataclass(frozen=True)
class Link:
    """The addresses of one sandbox's veth pair."""

    slot: int

    @property
    def host_ifname(self) -> str:
        return f"{_IFNAME_PREFIX}{self.slot}"

    @property
    def host_address(self) -> str:
        return str(SUBNET.network_address + 4 * self.slot + 1)

    @property
    def sandbox_address(self) -> str:
        return str(SUBNET.network_address + 4 * self.slot + 2)


def link_for_address(address: str) -> Link | None:
    """The link whose sandbox side has ``address`` (how the proxy knows its client)."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    offset = int(ip) - int(SUBNET.network_address)
    if not 0 <= offset < 4 * MAX_SLOTS or offset % 4 != 2:
        return None
    return Link(offset // 4)


def proxy_env() -> dict[str, str]:
    """What a networked sandbox's processes see: both spellings, as tools read either."""
    url = f"http://{PROXY_ADDRESS}:{EXPLICIT_PORT}"
    no_proxy = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


# Where a sandbox that holds credentials finds the egress CA (written at create, in its
# writable layer) and the trust bundle (the host's CAs + the egress CA).
SANDBOX_CA = "/etc/agentbox/egress-ca.pem"
SANDBOX_CA_BUNDLE = "/etc/agentbox/ca-bundle.pem"


def ca_env() -> dict[str, str]:
    """The variables common TLS clients read for their trust store, all pointing to the
    bundle that includes the egress CA (only for sandboxes with credentials)."""
    names = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
    return dict.fromkeys((*names, "PIP_CERT", "GIT_SSL_CAINFO"), SANDBOX_CA_BUNDLE)


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
    """The nftables table, replaced whole (``nft -f``): idempotent and atomic."""
    denied = ", ".join(str(n) for n in DENIED_NETWORKS if n.version == 4)
    sandbox = f'iifname "{_IFNAME_PREFIX}*"'
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
        ip daddr {PROXY_ADDRESS} tcp dport {{ {EXPLICIT_PORT}, {TRANSPARENT_PORT} }} accept
        ip daddr {{ {denied} }} counter name denied_range drop
        fib daddr type local counter name host_address drop
        meta l4proto != tcp counter name not_tcp drop
    }}
    chain intercept {{
        type nat hook prerouting priority dstnat; policy accept;
        {sandbox} ip daddr != {PROXY_ADDRESS} meta l4proto tcp dnat ip to {PROXY_ADDRESS}:{TRANSPARENT_PORT}
    }}
    chain forward_guard {{
        type filter hook forward priority -150; policy accept;
        {sandbox} counter name forwarded drop
        oifname "{_IFNAME_PREFIX}*" counter name forwarded drop
    }}
}}
"""  # noqa: E501


def ensure_host_setup() -> None:
    """The nft table and the proxy's address. Safe to call again; rules come first."""
    global _set_up
    with _setup_lock:
        if _set_up:
            return
        if not _table_loaded():
            _run(["nft", "-f", "-"], ruleset())
        if not _proxy_address_present():
            # On lo, not a dummy link: these kernels may lack the dummy driver, and an
            # address on lo is local to the host and routed nowhere.
            _run(["ip", "addr", "add", f"{PROXY_ADDRESS}/32", "dev", "lo"])
        _set_up = True


def _proxy_address_present() -> bool:
    done = subprocess.run(
        ["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True, check=False
    )
    return f" {PROXY_ADDRESS}/32 " in done.stdout


def _table_loaded() -> bool:
    done = subprocess.run(
        ["nft", "list", "chain", "inet", TABLE, "from_sandbox"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def attach(slot: int, init_pid: int) -> Link:
    """Give the sandbox whose init is ``init_pid`` its veth (the rules already hold for
    every ``abh*`` name, so it is filtered from its first packet)."""
    link = Link(slot)
    _run(
        ["ip", "-batch", "-"],
        f"link add {link.host_ifname} type veth peer name eth0 netns {init_pid}\n"
        f"addr add {link.host_address}/30 dev {link.host_ifname}\n"
        f"link set {link.host_ifname} up\n",
    )
    # Defence in depth, before the sandbox end comes up (no packet can flow until then):
    # with forwarding off on its host end, the kernel routes nothing arriving from the
    # sandbox anywhere, even if the nft table were flushed on a host that forwards.
    # (The interception still works: DNAT makes the destination local before routing.)
    conf = Path("/proc/sys/net")
    (conf / "ipv4" / "conf" / link.host_ifname / "forwarding").write_text("0")
    ipv6 = conf / "ipv6" / "conf" / link.host_ifname / "disable_ipv6"
    if ipv6.exists():
        ipv6.write_text("1")
    _run(
        ["nsenter", f"--net=/proc/{init_pid}/ns/net", "ip", "-batch", "-"],
        f"addr add {link.sandbox_address}/30 dev eth0\n"
        "link set eth0 up\n"
        f"route add default via {link.host_address}\n",
    )
    return link


def detach(slot: int) -> None:
    """Remove the host end of the veth if it outlived the sandbox's netns (deleting the
    netns, when its last process exits, normally takes the pair with it)."""
    link = Link(slot)
    if Path(f"/sys/class/net/{link.host_ifname}").exists():
        subprocess.run(["ip", "link", "del", link.host_ifname], capture_output=True, check=False)

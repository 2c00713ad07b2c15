"""What a networked sandbox's processes are told: where the egress proxy is, which trust
store holds the egress CA.

Standard library free on purpose: the CLI's light ``sandbox exec`` path
(``runtime.quick_exec``) builds a command's environment from it without loading the
network plane (tests/unit/test_import_weight.py)."""

from __future__ import annotations

EXPLICIT_PORT = 3128  # the egress proxy's port for HTTP_PROXY clients
PROXY_PREFIX = "10.204.0."  # network.plane.PROXIES (10.204.0.0/24): home k's proxy is .k+1


def proxy_address(home_index: int) -> str:
    """The egress proxy's address for the home numbered ``home_index`` on this host."""
    return f"{PROXY_PREFIX}{home_index + 1}"


def proxy_env(address: str) -> dict[str, str]:
    """What a networked sandbox's processes see: both spellings, as tools read either."""
    url = f"http://{address}:{EXPLICIT_PORT}"
    no_proxy = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


SANDBOX_CA_BUNDLE = "/etc/agentbox/ca-bundle.pem"


def ca_env() -> dict[str, str]:
    """The variables common TLS clients read for their trust store, all pointing to the
    bundle that includes the egress CA (only for sandboxes with credentials)."""
    names = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
    return dict.fromkeys((*names, "PIP_CERT", "GIT_SSL_CAINFO"), SANDBOX_CA_BUNDLE)

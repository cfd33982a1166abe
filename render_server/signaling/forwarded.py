"""The client behind trusted proxies: who sent a request, for per-client limits and the audit.

Only a proxy the operator trusts (`--trusted-proxy CIDR`) may say who its client was; anyone
else's `X-Forwarded-For` is a claim the client wrote itself. Each proxy appends the address it
got the request from, so the header is read from the right: the first address that is not a
trusted proxy is the client. Whatever lies left of it was written by the client and is ignored.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=16)
def networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    """The trusted networks (validated by the config: `ServerConfig.trusted_proxies`)."""
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def _address(text: str) -> Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[v6]" or "[v6]:port"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "v4:port"
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
    return address


def _trusted(address: Address, trusted: tuple[Network, ...]) -> bool:
    return any(address.version == net.version and address in net for net in trusted)


def forwarded_client(
    peer: str, forwarded_for: Iterable[str], trusted_cidrs: tuple[str, ...]
) -> str:
    """The client's address: `peer` (the TCP peer) unless it is a trusted proxy, then the
    rightmost address of `forwarded_for` (the X-Forwarded-For headers, in order) that is not."""
    trusted = networks(trusted_cidrs)
    address = _address(peer)
    if address is None or not trusted or not _trusted(address, trusted):
        return peer
    hops = [hop for header in forwarded_for for hop in header.split(",")]
    for hop in reversed(hops):
        hop_address = _address(hop)
        if hop_address is None:  # garbage where a trusted proxy should have written: stop here
            break
        address = hop_address
        if not _trusted(address, trusted):
            break
    return str(address)

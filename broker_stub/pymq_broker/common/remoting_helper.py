"""RemotingHelper: a gRPC peer's address, as RocketMQ's ``RemotingHelper.parseChannelRemoteAddr``."""

from __future__ import annotations

from urllib.parse import unquote

__all__ = ["parse_peer_address"]


def parse_peer_address(peer: str) -> str:
    """The ``host:port`` of a gRPC peer (``ipv4:10.0.0.7:5123``, ``ipv6:%5B::1%5D:5123``): an IPv6
    host in brackets, as the proxy's HeaderInterceptor writes it; "" when it is not an IP address
    (a Unix socket).

    gRPC writes the peer as a URI, its IPv6 brackets (and a zone's ``%``) percent-encoded: they
    are decoded (an undecoded ``%5B::1%5D`` is no address).
    """
    kind, _, address = peer.partition(":")
    return unquote(address) if kind in ("ipv4", "ipv6") else ""

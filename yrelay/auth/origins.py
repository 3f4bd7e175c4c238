"""The Origin allowlist for browser connections.

Browsers send ``Origin`` with every websocket handshake and let any page open
a socket to any server, so without this check a page on another site could
use a visitor's network position (or cookies, for a custom authenticator).
Non-browser clients send no Origin and are not affected.

The server's own origin (the demo page it serves) comes from configuration
(``public_url``, else the address it listens on), never from the request's
``Host`` header: a DNS-rebinding page on ``rebind.evil.example`` that
resolves to this server sends ``Host`` and ``Origin`` that agree with each
other, so agreeing proves nothing. Origins compare by scheme, host and port
(defaults filled in, case folded): ``https://`` is not ``http://``.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
#: Names of this machine a browser on it may use for a loopback server.
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def normalize_origin(text: str) -> str | None:
    """``scheme://host:port`` in lower case with the port spelled out, or
    None for anything that is not an http(s) origin (``null``, garbage)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host or port is None:
        return None
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


@functools.lru_cache(maxsize=16)
def own_origins(public_url: str | None, host: str, port: int) -> frozenset[str]:
    """The origins of this server's own pages: ``public_url``'s, or, without
    one, ``http://<host>:<port>``, and for a loopback or wildcard address the
    names a browser on this machine uses for it (``localhost``, ``127.0.0.1``,
    ``[::1]``)."""
    if public_url:
        origin = normalize_origin(public_url)
        if origin is None:
            raise ValueError(f"public_url must be an http(s) URL, got {public_url!r}")
        return frozenset({origin})
    names = {host if ":" not in host else f"[{host}]"}
    if _is_loopback_or_wildcard(host):
        names.update(_LOOPBACK_NAMES)
    return frozenset(origin for name in names if (origin := normalize_origin(f"http://{name}:{port}")))


def origin_allowed(origin: str | None, own: Iterable[str], allowed: Iterable[str]) -> bool:
    """No Origin (not a browser), one of the server's own origins, an origin
    on the allowlist, or ``*`` on the allowlist."""
    if origin is None:
        return True
    allowed = tuple(allowed)
    if "*" in allowed:
        return True
    normalized = normalize_origin(origin)
    return normalized is not None and (normalized in own or normalized in {normalize_origin(a) for a in allowed})


def _is_loopback_or_wildcard(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified

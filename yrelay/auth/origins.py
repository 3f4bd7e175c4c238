"""The Origin allowlist for browser connections.

Browsers send ``Origin`` with every websocket handshake and let any page open
a socket to any server, so without this check a page on another site could
use a visitor's network position (or cookies, for a custom authenticator).
Non-browser clients send no Origin and are not affected.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit


def origin_allowed(origin: str | None, host: str | None, allowed: Iterable[str]) -> bool:
    """No Origin (not a browser), the server's own origin (the demo page it
    serves), an origin on the allowlist, or ``*`` on the allowlist."""
    if origin is None:
        return True
    allowed = tuple(allowed)
    if "*" in allowed or origin in allowed:
        return True
    return host is not None and urlsplit(origin).netloc == host

"""Webhook signatures: what the sender signs and what a receiver checks.

``X-Yrelay-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``
(Stripe's scheme): the timestamp is signed with the body, so a captured
request cannot be replayed later than ``tolerance`` seconds. This module
needs nothing beyond the standard library, so a receiver can use it
without the webhooks extra (docs/consumers.md, "Webhooks").
"""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "X-Yrelay-Signature"
DELIVERY_HEADER = "X-Yrelay-Delivery"
#: Seconds a receiver accepts a signature's timestamp away from its own clock.
DEFAULT_TOLERANCE = 300.0


def _digest(secret: str | bytes, timestamp: int, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """The signature header's value for ``body``, signed now (or at ``timestamp``)."""
    stamp = int(time.time()) if timestamp is None else timestamp
    return f"t={stamp},v1={_digest(secret, stamp, body)}"


def verify_signature(
    secret: str | bytes, header: str | None, body: bytes, tolerance: float = DEFAULT_TOLERANCE, now: float | None = None
) -> bool:
    """True only if ``header`` (the ``X-Yrelay-Signature`` value) signs
    ``body`` (the raw request body, before any JSON parsing) with ``secret``
    and its timestamp is within ``tolerance`` seconds of ``now``. Several
    ``v1=`` values are accepted (one per secret while a secret is rotated).
    Compared in constant time."""
    if not header:
        return False
    stamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isascii() and value.isdigit():  # int() takes "²" and "١" too
            stamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if stamp is None or not candidates:
        return False
    if abs((time.time() if now is None else now) - stamp) > tolerance:
        return False
    expected = _digest(secret, stamp, body)
    # As bytes: compare_digest raises on str with non-ASCII characters.
    return any(hmac.compare_digest(expected.encode(), candidate.encode(errors="replace")) for candidate in candidates)


__all__ = ["DEFAULT_TOLERANCE", "DELIVERY_HEADER", "HEADER", "sign", "verify_signature"]

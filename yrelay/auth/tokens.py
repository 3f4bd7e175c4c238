"""Issuing tokens the built-in JWT authenticator accepts (``yrelay token``,
tests, and apps that mint tokens with the same secret)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable

import jwt

from yrelay.auth.principal import DocumentGrant, Permission


def issue_token(
    secret: str,
    subject: str,
    docs: Iterable[str],
    permission: Permission | str = Permission.WRITE,
    ttl: float = 3600.0,
    *,
    token_id: str | None = None,
    algorithm: str = "HS256",
    now: float | None = None,
) -> str:
    """A signed token for ``subject`` on ``docs`` (ids or ``prefix*``), valid ``ttl`` seconds."""
    grants = [DocumentGrant.parse(doc).pattern for doc in docs]
    issued = time.time() if now is None else now
    claims = {
        "sub": subject,
        "docs": grants,
        "perm": Permission(permission).value,
        "iat": int(issued),
        "exp": int(issued + ttl),
        "jti": token_id or secrets.token_urlsafe(12),
    }
    return jwt.encode(claims, secret, algorithm=algorithm)

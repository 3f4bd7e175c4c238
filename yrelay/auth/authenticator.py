"""Turning what a connection presents into a :class:`Principal`.

The hook for apps with their own user system is the :class:`Authenticator`
protocol: one async method that gets the token the client sent (first frame
or websocket subprotocol) and the connection's headers, and returns a
Principal or raises :class:`AuthError`. Pass an instance to
``create_app(..., authenticator=...)`` or ``Relay(..., authenticator=...)``
(an embedding app may pass a plain function instead: :mod:`.host`), or name a factory with
``yrelay serve --auth-hook package.module:factory`` (called with the
Settings). The built-in default, :class:`JwtAuthenticator`, verifies tokens
signed with the server secret.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jwt

from yrelay.auth.principal import ANYONE, InvalidGrant, Principal
from yrelay.config import Settings

#: Longest ``jti`` accepted (the revocation endpoint takes ids up to this long).
MAX_TOKEN_ID_LENGTH = 200


class AuthError(Exception):
    """The client could not be authenticated; the message is safe to show it."""


class Authenticator(Protocol):
    async def authenticate(self, token: str | None, headers: Mapping[str, str]) -> Principal: ...


class NoAuthenticator:
    """``--insecure-no-auth``: everyone may read and write everything."""

    async def authenticate(self, token: str | None, headers: Mapping[str, str]) -> Principal:
        return ANYONE


class JwtAuthenticator:
    """Tokens signed by the server secret (HS256 by default) with claims:

    - ``sub``: the subject (a user id);
    - ``docs``: the documents allowed, exact ids or ``prefix*``;
    - ``perm``: ``read`` or ``write``;
    - ``exp``: expiry (required), accepted ``leeway`` seconds past it (clock skew);
    - ``jti``: an id to revoke the token by (required: a token that cannot be
      revoked is refused, since revocation is always on).
    """

    def __init__(
        self,
        secret: str,
        algorithms: tuple[str, ...] = ("HS256",),
        *,
        audience: str | None = None,
        issuer: str | None = None,
        leeway: float = 5.0,
    ):
        self._secret = secret
        self.algorithms = list(algorithms)
        self.audience = audience
        self.issuer = issuer
        self.leeway = leeway

    async def authenticate(self, token: str | None, headers: Mapping[str, str]) -> Principal:
        if not token:
            raise AuthError("a token is required: send it in 'hello' or the websocket subprotocol")
        try:
            claims = jwt.decode(
                token,
                self._secret,
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "sub", "jti"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("the token has expired") from None
        except jwt.InvalidTokenError as exc:
            raise AuthError(f"invalid token: {_reason(exc)}") from None
        return principal_of(claims)


def principal_of(claims: Mapping[str, Any]) -> Principal:
    """The principal a verified token's claims describe."""
    docs, perm, jti = claims.get("docs"), claims.get("perm", "read"), claims.get("jti")
    if not isinstance(docs, list) or perm not in ("read", "write") or not isinstance(claims.get("sub"), str):
        raise AuthError("invalid token: needs 'sub', 'docs' (a list) and 'perm' (read or write)")
    if not isinstance(jti, str) or not 0 < len(jti) <= MAX_TOKEN_ID_LENGTH:
        raise AuthError(f"invalid token: 'jti' must be a string of 1 to {MAX_TOKEN_ID_LENGTH} characters")
    try:
        return Principal.of(claims["sub"], docs, perm, expires_at=float(claims["exp"]), token_id=jti)
    except InvalidGrant as exc:
        raise AuthError(f"invalid token: {exc}") from None


def _reason(exc: Exception) -> str:
    """PyJWT's message, short; it never contains the token itself."""
    return str(exc)[:120] or type(exc).__name__


def authenticator_for(settings: Settings) -> Authenticator:
    """The authenticator a server's settings ask for; refuses to guess."""
    if settings.auth_hook:
        return load_hook(settings.auth_hook)(settings)
    if settings.insecure_no_auth:
        return NoAuthenticator()
    if settings.auth_secret:
        return JwtAuthenticator(
            settings.auth_secret,
            settings.auth_algorithms,
            audience=settings.auth_audience,
            issuer=settings.auth_issuer,
            leeway=settings.auth_leeway,
        )
    raise AuthConfigurationError(
        "no authentication configured: set YRELAY_AUTH_SECRET (JWT), an --auth-hook (embedded: "
        "Relay(authenticate=...)), or --insecure-no-auth for development"
    )


class AuthConfigurationError(RuntimeError):
    pass


def load_hook(spec: str) -> Callable[[Settings], Authenticator]:
    """``package.module:factory`` -> the factory."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AuthConfigurationError(f"auth hook must be 'package.module:factory', got {spec!r}")
    factory: Callable[[Settings], Authenticator] = getattr(importlib.import_module(module_name), attribute)
    return factory  # the operator's hook: called as documented, its result checked where it is used

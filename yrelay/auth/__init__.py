"""Authentication and authorization of websocket clients: who is connecting
(:mod:`.authenticator`, pluggable; :mod:`.host` wraps an embedding app's
own function), what they may read and write
(:mod:`.principal`), revoked tokens (:mod:`.revocation`), browser origins
(:mod:`.origins`) and issuing tokens (:mod:`.tokens`). See docs/security.md."""

from yrelay.auth.authenticator import (
    AuthConfigurationError,
    Authenticator,
    AuthError,
    JwtAuthenticator,
    NoAuthenticator,
    authenticator_for,
)
from yrelay.auth.host import AuthenticateFn, HostAuthenticator
from yrelay.auth.origins import origin_allowed, own_origins
from yrelay.auth.principal import ANYONE, DocumentGrant, InvalidGrant, Permission, Principal
from yrelay.auth.revocation import AlreadyExpired, Revocations
from yrelay.auth.tokens import issue_token

__all__ = [
    "ANYONE",
    "AlreadyExpired",
    "AuthConfigurationError",
    "AuthError",
    "AuthenticateFn",
    "Authenticator",
    "DocumentGrant",
    "HostAuthenticator",
    "InvalidGrant",
    "JwtAuthenticator",
    "NoAuthenticator",
    "Permission",
    "Principal",
    "Revocations",
    "authenticator_for",
    "issue_token",
    "origin_allowed",
    "own_origins",
]

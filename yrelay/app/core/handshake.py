"""A connection's credentials, from the websocket upgrade to the cut-off.

A socket over a connection limit is accepted only to say why not, then
closed. The upgrade is refused (HTTP 403) to a browser from a foreign origin; the
client offers ``yrelay.v1`` and may carry its token in a subprotocol
(browsers cannot set headers). Its first frame must be ``hello`` within
``hello_timeout``; the token is authenticated (the pluggable hook, JWT by
default) and checked against the revoked list, and the session opened. Later
the connection's timer asks again: past the token's expiry (plus
``auth_leeway``) or once it is revoked, the connection is cut off
(docs/security.md). This module decides; the connection sends and closes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from starlette.datastructures import Headers

from yrelay.app.core.services import HandshakeServices
from yrelay.auth import AuthError, Principal, origin_allowed
from yrelay.auth.origins import own_origins
from yrelay.observability import logs
from yrelay.protocol import ErrorCode

log = logging.getLogger(__name__)

#: The websocket subprotocol of this protocol; a client that offers it gets it back.
SUBPROTOCOL = "yrelay.v1"
#: A subprotocol ``yrelay.auth.<token>`` carries the token (browsers cannot set headers).
TOKEN_SUBPROTOCOL_PREFIX = "yrelay.auth."
#: Close code of a connection refused or ended for its credentials (missing,
#: invalid, expired or revoked token): get a new token before reconnecting.
CLOSE_UNAUTHORIZED = 4401
#: Close code of a connection that sent no ``hello`` within ``hello_timeout``.
CLOSE_HELLO_TIMEOUT = 4408
#: Close code of a browser connection from an origin not allowed (before
#: accept: the upgrade gets HTTP 403).
CLOSE_FORBIDDEN_ORIGIN = 4403


@dataclass(frozen=True)
class CutOff:
    """Why the connection ends: an ``error`` frame, then this close code."""

    reason: str
    code: ErrorCode = ErrorCode.UNAUTHORIZED
    close_code: int = CLOSE_UNAUTHORIZED
    #: When the client may come back (in the ``error`` frame), if it matters.
    retry_after_ms: int | None = None


@dataclass(frozen=True)
class Opened:
    """A ``hello`` accepted: who it is, and the session it opened or resumed."""

    principal: Principal
    session: str
    resumed: bool


class Handshake:
    """One connection's handshake and the later checks of its token."""

    __slots__ = ("_services", "_headers", "subprotocol", "_token", "_hello_by", "principal")

    def __init__(self, services: HandshakeServices, headers: Headers, subprotocol: str = SUBPROTOCOL):
        self._services = services
        self._headers = headers
        offered = offered_subprotocols(headers)
        #: What the upgrade answers with (None: the client did not offer it).
        self.subprotocol = subprotocol if subprotocol in offered else None
        self._token = token_in(offered)
        self._hello_by = 0.0
        self.principal: Principal | None = None

    def origin_refused(self) -> bool:
        """A browser page from another site may not open the socket (logged)."""
        settings, origin = self._services.settings, self._headers.get("origin")
        own = own_origins(settings.public_url, settings.host, settings.port)
        if origin_allowed(origin, own, settings.allowed_origins):
            return False
        log.warning(
            "refused a browser connection from origin %s (allowed: %s and YRELAY_ALLOWED_ORIGINS; "
            "set YRELAY_PUBLIC_URL if that is this server's own address)",
            logs.untrusted(origin or ""),
            ", ".join(sorted(own)),
        )
        return True

    def accepted(self) -> None:
        """The socket is open: the ``hello`` deadline starts."""
        self._hello_by = time.monotonic() + self._services.settings.hello_timeout

    def hello_overdue(self) -> CutOff | None:
        """No ``hello`` yet, past ``hello_timeout`` (0: no deadline)."""
        timeout = self._services.settings.hello_timeout
        if timeout > 0 and time.monotonic() >= self._hello_by:
            return CutOff(f"no 'hello' within {timeout:g} s", ErrorCode.HANDSHAKE_REQUIRED, CLOSE_HELLO_TIMEOUT)
        return None

    async def hello(self, session: str | None, token: str | None) -> Opened | CutOff:
        """Authenticate a ``hello`` and open its session (``session``: the one
        the client resumes, if any); a bad token ends the connection."""
        services = self._services
        principal = await self.authenticate(token)
        if isinstance(principal, CutOff):
            return principal
        session, resumed = await services.sessions.open(session, owner=principal.subject)
        logs.session.set(session)  # the connection's context: every later line and task carries it
        return Opened(principal, session, resumed)

    async def authenticate(self, token: str | None) -> Principal | CutOff:
        """Who ``token`` (else the subprotocol's) is, unless it is invalid or revoked."""
        services = self._services
        try:
            principal = await services.authenticator.authenticate(token or self._token, self._headers)
        except AuthError as exc:
            return CutOff(str(exc))
        if services.revocations.is_revoked(principal.token_id):
            return CutOff("the token was revoked")
        self.principal = principal
        return principal

    def token_lapsed(self) -> CutOff | None:
        """The token expired (``auth_leeway`` past its expiry, as ``hello``
        allows) or was revoked (the revoked list itself is refreshed every
        ``revocation_refresh``)."""
        principal = self.principal
        if principal is None:
            return None
        if (
            principal.expires_at is not None
            and time.time() > principal.expires_at + self._services.settings.auth_leeway
        ):
            return CutOff("the token has expired")
        if self._services.revocations.is_revoked(principal.token_id):
            return CutOff("the token was revoked")
        return None


def offered_subprotocols(headers: Headers) -> list[str]:
    raw = headers.get("sec-websocket-protocol", "")
    return [part.strip() for part in raw.split(",") if part.strip()]


def token_in(offered: list[str]) -> str | None:
    for protocol_name in offered:
        if protocol_name.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return protocol_name[len(TOKEN_SUBPROTOCOL_PREFIX) :] or None
    return None

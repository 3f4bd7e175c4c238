"""The host app's own authentication as an :class:`Authenticator`: for an
app that embeds yrelay (``Relay(..., authenticate=fn)``) and already knows
its users from a session cookie or a bearer header.

``fn`` is a function ``(connection, token) -> Principal``, async or plain
(a plain one runs in the thread pool, as FastAPI runs sync dependencies):
``connection`` is the websocket's :class:`starlette.requests.HTTPConnection`
(headers, cookies, query parameters, client address, and ``session`` or
``user`` when the host's middleware sets them), ``token`` what the client
sent in ``hello`` or the websocket subprotocol (``None`` when nothing). It
raises :class:`AuthError`, or ``HTTPException`` (401/403) as a FastAPI
dependency would; both refuse the connection with the usual
``unauthorized`` error frame and close code 4401. It runs once per
connection, at ``hello``.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import cast

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection

from yrelay.auth.authenticator import AuthError
from yrelay.auth.principal import Principal

#: ``(connection, token) -> Principal``, the host's function (async or plain).
AuthenticateFn = Callable[[HTTPConnection, "str | None"], Awaitable[Principal] | Principal]

#: The websocket being served, set by the relay's endpoint for this
#: connection's task: the Authenticator protocol passes only the headers.
current_connection: contextvars.ContextVar[HTTPConnection] = contextvars.ContextVar("yrelay_connection")


class HostAuthenticator:
    """Wraps the host's ``authenticate`` function into the Authenticator protocol."""

    def __init__(self, authenticate: AuthenticateFn):
        self.authenticate_fn = authenticate
        self._is_async = inspect.iscoroutinefunction(authenticate) or inspect.iscoroutinefunction(
            getattr(authenticate, "__call__", None)  # noqa: B004 - not a callability test: is a callable object's __call__ async
        )

    async def authenticate(self, token: str | None, headers: Mapping[str, str]) -> Principal:
        connection = current_connection.get(None) or _connection_of(headers)
        try:
            if self._is_async:
                answer = self.authenticate_fn(connection, token)
                principal = await cast("Awaitable[Principal]", answer)  # _is_async: a coroutine function
            else:  # a blocking lookup must not stall every other connection
                blocking = cast("Callable[[HTTPConnection, str | None], Principal]", self.authenticate_fn)
                principal = await run_in_threadpool(blocking, connection, token)
        except HTTPException as exc:  # what a FastAPI dependency raises
            if exc.status_code not in (401, 403):
                raise
            raise AuthError(str(exc.detail)[:200]) from None
        if not isinstance(principal, Principal):
            raise TypeError(f"authenticate must return a yrelay.auth.Principal, not {type(principal).__name__}")
        return principal


def _connection_of(headers: Mapping[str, str]) -> HTTPConnection:
    """A connection carrying only ``headers``: for a call from outside the
    relay's endpoint (a test, another server)."""
    raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    return HTTPConnection({"type": "websocket", "headers": raw, "path": "/", "query_string": b""})

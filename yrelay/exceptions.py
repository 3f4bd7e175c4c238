"""The exceptions a host application may catch by name.

The server's: :class:`StartupError`. The Python client's (:mod:`yrelay.client`
exports them too) all derive from :class:`ClientError`; the ones about an
answer of the server carry its error frame (docs/protocol.md#error-codes):
``code``, ``reason`` (the server's message, for humans) and ``doc``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any


class StartupError(RuntimeError):
    """The server cannot start, for a reason its operator can fix (Redis not
    reachable, a port taken): the message is one plain sentence that says
    what and how. ``yrelay serve`` prints it as one line and exits 1;
    ``Relay.lifespan()`` raises it in a host application."""


class ClientError(Exception):
    """Something the Python client cannot do for the application: catch it
    to handle every failure of :class:`~yrelay.client.YrelayClient` at once."""


class Refused(ClientError):
    """The server refused something and said why (its ``error`` frame):
    resending the same thing cannot help."""

    #: The message of a subclass that says one frame, from its ``code``,
    #: ``message`` and ``doc`` (when no ``summary`` is given).
    template = "{message} ({code})"

    def __init__(self, frame: Mapping[str, Any], summary: str | None = None):
        self.frame = dict(frame)
        self.code = str(frame.get("code"))
        #: The server's message (plain words, never a stack trace).
        self.reason = str(frame.get("message") or "")
        self.doc: str | None = frame.get("doc")
        fields = {"code": frame.get("code"), "message": frame.get("message"), "doc": frame.get("doc")}
        super().__init__(summary if summary is not None else self.template.format(**fields))


class Unauthorized(Refused):
    """The server refused the client's token (``unauthorized``, close 4401):
    missing, invalid, expired or revoked. Raised by ``connect()`` at once,
    and, when a token lapses later and the reconnect's token is refused too,
    by whatever the application waits on next; the client then stops (its
    documents and unacked updates are kept: set a new ``token`` and
    ``connect()`` again)."""

    template = "the server refused the token: {message} (unauthorized; get a new token, then connect again)"


class SubscribeRefused(Refused):
    """The server refused to subscribe the client to a document (for example
    ``too_many_subscriptions``): ``subscribe()`` raises it, and the document
    is no longer bound (its edits are not sent)."""

    template = "subscribe to {doc!r} refused: {message} ({code})"


class Forbidden(SubscribeRefused):
    """The token does not cover the document (``forbidden``): nothing of it
    was read."""


class UpdatesRefused(Refused):
    """Local updates the server refused and will never store (a read-only
    token: ``forbidden``; ``invalid_update``, ``update_too_large``, a
    deleted document, ...): ``wait_idle()`` raises it once nothing else is
    pending, or every one still pending waits for a resend. The local
    documents keep the changes; ``refusals`` holds one error frame per
    refused update (``doc``, ``clock``, ``code``, ``message``),
    ``code``/``reason``/``doc`` are the first one's; ``pending`` counts the
    updates not stored *yet* (still queued, resent by the client)."""

    def __init__(self, refusals: Sequence[Mapping[str, Any]], total: int | None = None, pending: int = 0):
        self.refusals = [dict(frame) for frame in refusals]
        #: Every refusal counted, also those past the list's bound.
        self.total = total if total is not None else len(self.refusals)
        self.pending = pending
        kinds = Counter((frame.get("code"), frame.get("doc"), frame.get("message")) for frame in self.refusals)
        said = "; ".join(f"{count} to {doc!r}: {code} ({message})" for (code, doc, message), count in kinds.items())
        plural = "update was" if self.total == 1 else "updates were"
        waiting = f"; {pending} other{'s' if pending != 1 else ''} not stored yet (still queued)" if pending else ""
        super().__init__(
            self.refusals[0], f"{self.total} local {plural} refused and will not be stored: {said}{waiting}"
        )


class ServerUnreachable(ClientError, ConnectionError):
    """``connect()`` opened no session within its timeout: the server is
    down, the URL is wrong, or it kept saying "later" (``overloaded``).
    ``reason`` is the last attempt's failure."""

    def __init__(self, urls: Sequence[str], timeout: float, reason: str):
        self.urls = list(urls)
        self.reason = reason
        super().__init__(f"no connection to {' or '.join(self.urls)} within {timeout:g} s; last attempt: {reason}")


__all__ = [
    "ClientError",
    "Forbidden",
    "Refused",
    "ServerUnreachable",
    "StartupError",
    "SubscribeRefused",
    "Unauthorized",
    "UpdatesRefused",
]

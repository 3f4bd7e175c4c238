"""The session's set of subscribed documents, checked against the client's
(docs/reconciliation.md, docs/protocol.md#subscription-set): the set's digest
in one round trip (``check_subscriptions``), and on a mismatch range-based
reconciliation rounds (``reconcile``), stateless on this side: the client
drives them.
"""

from __future__ import annotations

from typing import Any

from yrelay import protocol
from yrelay.app.wire.payloads import decode_b64
from yrelay.protocol import CheckSubscriptions, ErrorCode, ProtocolError, Reconcile
from yrelay.reconciliation import MalformedMessage, respond
from yrelay.tracker import Tracker


async def check(tracker: Tracker, session: str, frame: CheckSubscriptions) -> dict[str, Any]:
    """The ``subscriptions`` frame: the digest of the documents that track ``session``."""
    digest = await tracker.session_documents(session).digest()
    return protocol.subscriptions(digest.to_wire(), frame.ref)


async def reconcile(tracker: Tracker, session: str, frame: Reconcile) -> dict[str, Any]:
    """Answer one range-reconciliation request over the documents that
    track ``session``."""
    request = decode_b64(frame.payload, None, None)
    try:
        reply = await respond(tracker.session_documents(session), request)
    except MalformedMessage as exc:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"reconcile payload: {str(exc)[:200]}") from None
    return protocol.reconcile_reply(reply, frame.ref)

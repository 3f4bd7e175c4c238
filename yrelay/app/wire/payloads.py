"""The base64 payloads of client frames, decoded within their limits.

Every flow that reads a payload (an update, an awareness update, a state
vector, a reconciliation message) decodes it here, so a bad one is always the
same ``error`` frame naming the document and clock it came with.
"""

from __future__ import annotations

from yrelay import protocol
from yrelay.protocol import ErrorCode, ProtocolError


def decode_limited(text: str, limit: int, code: ErrorCode, doc: str, clock: int | None) -> bytes:
    """Base64 of at most ``limit`` bytes; the length is checked before decoding."""
    what = code.value.removesuffix("_too_large")
    too_large = ProtocolError(code, f"{what} exceeds {limit} bytes", doc=doc, clock=clock)
    if len(text) > (limit + 2) // 3 * 4:  # base64 length of `limit` bytes
        raise too_large
    data = decode_b64(text, doc, clock)
    if len(data) > limit:
        raise too_large
    return data


def decode_b64(text: str, doc: str | None, clock: int | None) -> bytes:
    try:
        return protocol.b64decode(text)
    except ValueError:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "payload is not valid base64", doc=doc, clock=clock) from None

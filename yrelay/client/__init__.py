"""The asyncio Python client (binds pycrdt or y-py documents to a yrelay
server), and what it raises when the server says no (docs/protocol.md)."""

from yrelay.backoff import Backoff
from yrelay.client.client import AckedUpdate, ClientDocument, YrelayClient
from yrelay.exceptions import (
    ClientError,
    Forbidden,
    Refused,
    ServerUnreachable,
    SubscribeRefused,
    Unauthorized,
    UpdatesRefused,
)

__all__ = [
    "AckedUpdate",
    "Backoff",
    "ClientDocument",
    "ClientError",
    "Forbidden",
    "Refused",
    "ServerUnreachable",
    "SubscribeRefused",
    "Unauthorized",
    "UpdatesRefused",
    "YrelayClient",
]

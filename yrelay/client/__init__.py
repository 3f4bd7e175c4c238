"""The asyncio Python client (binds pycrdt or y-py documents to a yrelay
server), and what it raises when the server says no (docs/protocol.md)."""

from ..backoff import Backoff
from ..exceptions import (
    ClientError,
    Forbidden,
    Refused,
    ServerUnreachable,
    SubscribeRefused,
    Unauthorized,
    UpdatesRefused,
)
from .client import AckedUpdate, ClientDocument, YrelayClient

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

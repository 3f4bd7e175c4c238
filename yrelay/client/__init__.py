"""The asyncio Python client (binds y-py documents to a yrelay server)."""

from .backoff import Backoff
from .client import AckedUpdate, ClientDocument, YrelayClient

__all__ = ["AckedUpdate", "Backoff", "ClientDocument", "YrelayClient"]

"""The Python client as of 2455dc5 (before issue 15), imports made absolute; do not change it."""

from .backoff import Backoff
from .client import AckedUpdate, ClientDocument, YrelayClient

__all__ = ["AckedUpdate", "Backoff", "ClientDocument", "YrelayClient"]

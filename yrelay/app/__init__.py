"""The server: FastAPI websockets over per-document Redis streams."""

from .relay import Relay
from .server import create_app

__all__ = ["Relay", "create_app"]

"""The server: FastAPI websockets over per-document Redis streams."""

from yrelay.app.relay import Relay
from yrelay.app.server import create_app

__all__ = ["Relay", "create_app"]

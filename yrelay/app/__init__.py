"""The server: FastAPI websockets over per-document Redis streams."""

from .server import create_app

__all__ = ["create_app"]

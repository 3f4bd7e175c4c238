"""yrelay: reliable-delivery backend for Yjs CRDT sync over Redis streams."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from yrelay.exceptions import StartupError

if TYPE_CHECKING:
    from yrelay.app.relay import Relay

__all__ = ["Relay", "StartupError", "__version__"]


def __getattr__(name: str) -> Any:
    """``yrelay.Relay`` on first use: importing ``yrelay.client`` (or any
    part) does not load the server and FastAPI."""
    if name == "Relay":
        from yrelay.app.relay import Relay

        return Relay
    raise AttributeError(f"module 'yrelay' has no attribute {name!r}")

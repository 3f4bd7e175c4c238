"""The exceptions a host application may catch by name."""

from __future__ import annotations


class StartupError(RuntimeError):
    """The server cannot start, for a reason its operator can fix (Redis not
    reachable, a port taken): the message is one plain sentence that says
    what and how. ``yrelay serve`` prints it as one line and exits 1;
    ``Relay.lifespan()`` raises it in a host application."""


__all__ = ["StartupError"]

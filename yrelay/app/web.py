"""The browser client, served by the server itself: the demo editor at ``/``
and the built bundle under ``/static`` (``yrelay-client.js`` for apps
without a bundler).

The bundle is built from ``web/`` by ``make install`` (npm + esbuild) into
``yrelay/app/static``. A server installed without it still serves sync; its
``/`` then says how to build the page instead of failing.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from yrelay.auth.origins import origin_allowed, own_origins
from yrelay.config import Settings

STATIC_DIR = Path(__file__).parent / "static"

NOT_BUILT = (
    "The yrelay web client is not built. Run `make install` (it needs Node.js and npm), "
    "or `cd web && npm ci && npm run build`. The websocket endpoint /ws works without it.\n"
)


class _PageOrigins(CORSMiddleware):
    """Starlette's CORS answers, to the origins the websocket accepts
    (:func:`~yrelay.auth.origins.origin_allowed`: one rule for both, whatever
    form the setting spells an origin in)."""

    def __init__(self, app: ASGIApp, own: frozenset[str], allowed: tuple[str, ...]):
        super().__init__(app, allow_origins=(), allow_methods=["GET", "HEAD"])
        self._own, self._allowed = own, allowed

    def is_allowed_origin(self, origin: str) -> bool:
        return origin_allowed(origin, self._own, self._allowed)


def mount_web_client(app: FastAPI, static_dir: Path = STATIC_DIR, settings: Settings | None = None) -> None:
    """Serve the demo page and the bundle (when built: without it, ``/``
    explains and ``/static`` answers 404).

    ``/static`` answers CORS to the origins a page may connect from (the
    server's own, ``YRELAY_ALLOWED_ORIGINS``): a page on another origin
    imports the bundle as a module script (``<script type="module">``),
    which a browser fetches in CORS mode and refuses without the header.
    Only GET and HEAD, never credentials: the bundle is public."""
    if static_dir.is_dir():
        files: ASGIApp = StaticFiles(directory=static_dir)
        if settings is not None:
            files = _PageOrigins(
                files, own_origins(settings.public_url, settings.host, settings.port), settings.allowed_origins
            )
        app.mount("/static", files, name="static")

    @app.get("/", include_in_schema=False)
    async def demo_page() -> Response:
        index = static_dir / "index.html"
        if not index.is_file():
            return PlainTextResponse(NOT_BUILT, status_code=503)
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

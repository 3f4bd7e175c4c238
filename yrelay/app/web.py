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

STATIC_DIR = Path(__file__).parent / "static"

NOT_BUILT = (
    "The yrelay web client is not built. Run `make install` (it needs Node.js and npm), "
    "or `cd web && npm ci && npm run build`. The websocket endpoint /ws works without it.\n"
)


def mount_web_client(app: FastAPI, static_dir: Path = STATIC_DIR) -> None:
    """Serve the demo page and the bundle (when built: without it, ``/``
    explains and ``/static`` answers 404)."""
    if static_dir.is_dir():
        app.mount("/static", StaticFiles(directory=static_dir), name="static")

    @app.get("/", include_in_schema=False)
    async def demo_page() -> Response:
        index = static_dir / "index.html"
        if not index.is_file():
            return PlainTextResponse(NOT_BUILT, status_code=503)
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

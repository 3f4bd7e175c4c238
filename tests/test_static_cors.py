"""The served bundle (``/static``) answers CORS to the origins a page may
connect from: a page on another origin imports it as a module script, which
the browser fetches in CORS mode (issue 38: it failed even with
``YRELAY_ALLOWED_ORIGINS`` set). Other origins get no header, so their page
cannot use it, as they cannot open the websocket."""

from __future__ import annotations

import httpx

from yrelay.app.server import create_app
from yrelay.config import Settings


def client(**settings: object) -> httpx.AsyncClient:
    app = create_app(Settings.from_env(insecure_no_auth=True, port=8000, **settings), "redis://127.0.0.1:1/0")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000")


async def test_an_allowed_origin_may_import_the_bundle_and_another_may_not():
    async with client(allowed_origins=("https://app.example/",)) as http:
        allowed = await http.get("/static/yrelay-client.js", headers={"Origin": "https://app.example"})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "https://app.example"
        own = await http.get("/static/yrelay-client.js", headers={"Origin": "http://localhost:8000"})
        assert own.headers["access-control-allow-origin"] == "http://localhost:8000"
        other = await http.get("/static/yrelay-client.js", headers={"Origin": "https://evil.example"})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
        assert "access-control-allow-credentials" not in allowed.headers

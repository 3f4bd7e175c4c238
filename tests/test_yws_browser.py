"""The demo editor on the stock y-websocket provider (/yws, `?provider=y-websocket`)
and on yrelay's provider (/ws), side by side in real headless Chromium on one
document: edits and presence both ways (issue 19)."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, Page

from conftest import running_server
from test_browser import chromium, converged, http_of, new_doc, type_into  # noqa: F401 (chromium: a fixture)

pytestmark = pytest.mark.timeout(180)


async def open_page(browser: Browser, base: str, doc: str, user: str, provider: str = "") -> Page:
    context = await browser.new_context(viewport={"width": 1100, "height": 600})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors  # type: ignore[attr-defined]
    await page.goto(f"{base}/?doc={doc}&user={user}&persist=0" + (f"&provider={provider}" if provider else ""))
    await page.wait_for_function("window.yrelay && window.yrelay.provider.synced", timeout=15_000)
    return page


async def test_stock_provider_page_and_yrelay_page_converge(redis_url, chromium):  # noqa: F811
    doc = new_doc()
    async with running_server(redis_url) as url:
        stock = await open_page(chromium, http_of(url), doc, "stock", "y-websocket")
        assert (await stock.evaluate("window.yrelay.provider.url")).endswith(f"/yws/{doc}")
        ours = await open_page(chromium, http_of(url), doc, "ours")
        await type_into(stock, "typed on y-websocket. ")
        await converged([stock, ours], ["typed on y-websocket."])
        await type_into(ours, "typed on yrelay. ")
        text = await converged([stock, ours], ["typed on y-websocket.", "typed on yrelay."])
        assert len(text) == len("typed on y-websocket. typed on yrelay. ")
        for page, other in ((stock, "ours"), (ours, "stock")):
            await page.wait_for_function(
                f"[...window.yrelay.awareness.getStates().values()].some(s => s.user && s.user.name === '{other}')",
                timeout=10_000,
            )
        await ours.click(".cm-content")
        await stock.wait_for_selector(".cm-ySelectionCaret", timeout=10_000)  # yrelay's caret on the stock page
        assert await stock.inner_text("#status") == "connected"
        assert stock.errors == [] and ours.errors == []  # type: ignore[attr-defined]

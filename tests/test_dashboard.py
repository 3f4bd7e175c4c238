"""The dashboard of a real analysis renders in headless Chromium from file://,
offline: no console errors, every chart drawn. A screenshot is kept in
test-artifacts/ for a human look."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS
from playwright.sync_api import sync_playwright

from yrelay.spark_analytics.analysis import Options
from yrelay.spark_analytics.dashboard import DASHBOARD
from yrelay.spark_analytics.generator import Scenario, generate
from yrelay.spark_analytics.job import JobConfig, run



@pytest.fixture(scope="module")
def dashboard(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dashboard")
    generate(root / "events", Scenario(docs=3, readers=2, seconds=40))
    run(spark, JobConfig(root / "events", root / "out", options=Options(bucket_seconds=5)))
    return root / "out" / DASHBOARD


def test_the_page_is_self_contained(dashboard):
    page = dashboard.read_text()
    assert "<script src=" not in page and "<link" not in page  # plotly.js is inlined, nothing is fetched
    assert "Plotly.newPlot" in page and len(page) > 3_000_000  # plotly.min.js itself is ~4.6 MB


def test_the_dashboard_renders_in_headless_chromium(dashboard, tmp_path):
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900}, offline=True,
        )
        try:
            page = browser.new_page()
            page.on("console", lambda message: message.type == "error" and errors.append(message.text))
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(dashboard.as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('div[id^=chart-] svg.main-svg').length >= 5")
            drawn = page.eval_on_selector_all(
                "div[id^=chart-]", "divs => divs.map(d => [d.id, d.querySelectorAll('svg.main-svg').length, "
                "d.querySelectorAll('.trace').length])")
            tables = page.eval_on_selector_all("table", "ts => ts.map(t => t.rows.length)")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert len(drawn) == 5 and all(svgs >= 1 and traces >= 1 for _, svgs, traces in drawn), drawn
    assert len(tables) == 3 and all(rows > 1 for rows in tables)  # summary, top lagging, hottest documents

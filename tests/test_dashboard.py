"""The dashboard of a real analysis renders in headless Chromium from file://,
offline: no console errors, every chart drawn. A screenshot is kept in
test-artifacts/ for a human look."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS
from playwright.sync_api import sync_playwright

from yrelay.spark_analytics.analysis import Options
from yrelay.spark_analytics.dashboard import DASHBOARD
from yrelay.spark_analytics.generator import Scenario, generate
from yrelay.spark_analytics.tables import SEVERITY, Status
from yrelay.spark_analytics.job import JobConfig, run



@pytest.fixture(scope="module")
def dashboard(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dashboard")
    scenario = Scenario(docs=3, readers=2, seconds=40)
    generate(root / "events", scenario)
    _never_acking_session(root / "events", scenario.start_ms + 20_000)
    run(spark, JobConfig(root / "events", root / "out", options=Options(bucket_seconds=5)))
    return root / "out" / DASHBOARD


NEVER_ACKS = "never-acks"


def _never_acking_session(events: Path, ts: int) -> None:
    """A reader of d0 that was delivered to, evicted and told to resync, and
    never acked: it has no lag, so it is in no lag chart or top-N table."""
    lines = [{"v": 1, "ts": ts, "type": "connect", "process": "p-extra", "session": NEVER_ACKS, "resumed": False},
             {"v": 1, "ts": ts + 5, "type": "evict", "process": "p-extra", "doc": "d0", "session": NEVER_ACKS,
              "mode": "relative"},
             {"v": 1, "ts": ts + 10, "type": "resync", "process": "p-extra", "doc": "d0", "session": NEVER_ACKS,
              "reason": "evicted", "offset": "0-0"}]
    (events / "events-extra-0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_every_session_not_ok_is_named_with_its_status(dashboard):
    rows = table_rows(dashboard.read_text(), "troubled")
    named = {row["session"]: row for row in rows}
    assert named[NEVER_ACKS]["status"] == str(Status.ERR)  # never acked: no lag, still listed
    assert (named[NEVER_ACKS]["acks"], named[NEVER_ACKS]["last ack (UTC)"]) == ("0", "-")  # no acks, no last ack
    statuses = [row["status"] for row in rows]
    assert {str(Status.WARN), str(Status.STALL), str(Status.STOP), str(Status.REWIND),
            str(Status.LEFT_UNACKED)} <= set(statuses)
    assert str(Status.OK) not in statuses and str(Status.LEFT) not in statuses  # a clean leave is no trouble
    assert statuses == sorted(statuses, key=lambda s: SEVERITY.index(Status(s)))  # worst first
    assert named["d0-stop"]["last ack (UTC)"].startswith("2026-01-01T")  # the last ack, as a UTC time


def table_rows(page: str, table_id: str) -> list[dict[str, str]]:
    """The rows of the page's table ``table_id``, by column title (cells as text)."""
    table = page[page.index(f"<table id='{table_id}'>"):]
    table = table[:table.index("</table>")]
    head, body = table.split("</thead>")
    titles = [html.unescape(cell.split("</th>")[0]) for cell in head.split("<th>")[1:]]
    return [dict(zip(titles, cells(row))) for row in body.split("</tr>") if "<td" in row]


def cells(row: str) -> list[str]:
    """The text of each cell of a row (markup inside a cell removed)."""
    texts = []
    for cell in row.split("<td")[1:]:
        inner = cell.split(">", 1)[1].split("</td>")[0]
        texts.append(html.unescape(re.sub("<[^>]+>", "", inner)).strip())
    return texts


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
    # sessions not OK, top lagging, hottest documents, all figures
    assert len(tables) == 4 and all(rows > 1 for rows in tables)

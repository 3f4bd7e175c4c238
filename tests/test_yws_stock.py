"""The stock y-websocket 2.1.0 client (npm, web/ devDependency) against
/yws, next to yrelay's provider on /ws: web/test-stock, run by node against a
live server and redis-server (issue 19)."""

from __future__ import annotations

import json
import shutil

import pytest
from browser import WEB_DIR, require_web_build, run_node
from conftest import running_server

from yrelay.auth import issue_token

SECRET = "yws-stock-secret-0123456789abcdef012345"


@pytest.mark.timeout(180)
async def test_stock_y_websocket_client_suite(redis_url):
    require_web_build()
    assert shutil.which("node"), "Node.js is needed"
    assert (WEB_DIR / "node_modules" / "y-websocket").exists(), "run `cd web && npm ci` (y-websocket devDependency)"
    tokens = {"write": issue_token(SECRET, "writer", ["ro-*"], "write"),
              "read": issue_token(SECRET, "reader", ["ro-*"], "read")}
    async with running_server(redis_url) as url, \
            running_server(redis_url, insecure_no_auth=False, auth_secret=SECRET) as auth_url:
        returncode, report, _ = await run_node(
            "--test", "--test-reporter=tap", "test-stock/y-websocket.test.js", cwd=WEB_DIR, timeout=150,
            env={"YRELAY_WS_URL": url, "YRELAY_AUTH_WS_URL": auth_url, "YRELAY_AUTH_TOKENS": json.dumps(tokens),
                 "YRELAY_REDIS_URL": redis_url}, merge_stderr=True)
    assert returncode == 0, report[-6000:]
    assert "# fail 0" in report and "# pass 4" in report, report[-3000:]

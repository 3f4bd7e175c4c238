"""The stock y-websocket client against /yws, next to yrelay's provider on
/ws: web/test-stock, run by node against a live server and redis-server
(issue 19), with each major version (issue 36): 2.1.0 is web/'s
devDependency; 1.5.4 and 3.1.0 come from tests/stock's lockfile, put in its
place by tests/stock/version.mjs."""

from __future__ import annotations

import json
import shutil

import pytest

from browser import REPO, WEB_DIR, require_web_build, run_node
from conftest import running_server
from yrelay.auth import issue_token

SECRET = "yws-stock-secret-0123456789abcdef012345"
STOCK_DIR = REPO / "tests" / "stock"
#: Each version's alias in tests/stock/package.json (None: web/'s own y-websocket).
VERSIONS = {"1.5.4": "y-websocket-1", "2.1.0": None, "3.1.0": "y-websocket-3"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("version", VERSIONS)
async def test_stock_y_websocket_client_suite(redis_url, version):
    require_web_build()
    assert shutil.which("node"), "Node.js is needed"
    assert (WEB_DIR / "node_modules" / "y-websocket").exists(), "run `cd web && npm ci` (y-websocket devDependency)"
    alias = VERSIONS[version]
    assert alias is None or (STOCK_DIR / "node_modules" / alias).exists(), "run `make stock-clients`"
    tokens = {
        "write": issue_token(SECRET, "writer", ["ro-*"], "write"),
        "read": issue_token(SECRET, "reader", ["ro-*"], "read"),
    }
    async with (
        running_server(redis_url) as url,
        running_server(redis_url, insecure_no_auth=False, auth_secret=SECRET) as auth_url,
    ):
        returncode, report, _ = await run_node(
            "--import",
            str(STOCK_DIR / "version.mjs"),
            "--test",
            "--test-reporter=tap",
            "test-stock/y-websocket.test.js",
            cwd=WEB_DIR,
            timeout=150,
            env={
                "YRELAY_WS_URL": url,
                "YRELAY_AUTH_WS_URL": auth_url,
                "YRELAY_AUTH_TOKENS": json.dumps(tokens),
                "YRELAY_REDIS_URL": redis_url,
                "YRELAY_Y_WEBSOCKET": alias or "",
            },
            merge_stderr=True,
        )
    assert returncode == 0, report[-6000:]
    assert "# fail 0" in report and "# pass 4" in report, report[-3000:]
    assert f"stock y-websocket {version}" in report, report[:3000]


@pytest.mark.timeout(120)
async def test_stock_client_edits_survive_sigkill_of_server_and_redis(tmp_path):
    """Once another stock client received an edit (so it was stored), a kill -9
    of the server and of Redis (appendonly, appendfsync always) keeps it."""
    from yrelay.storage.embedded import RedisProcess
    from yrelay_tools.testing.processes import ServerProcess

    require_web_build()
    redis = RedisProcess(tmp_path / "redis").start()
    server = ServerProcess(redis.url, tmp_path).start()
    base = f"ws://127.0.0.1:{server.port}"

    async def peer(*args: str) -> str:
        code, out, err = await run_node("test-stock/peer.mjs", *args, cwd=WEB_DIR, env={}, timeout=40)
        assert code == 0, out + err
        return out.strip().splitlines()[-1]

    try:
        assert await peer("write", base, "killed", "first. ") == "stored"
        assert await peer("write", base, "killed", "second.") == "stored"
        server.kill()
        redis.kill()
        redis.start()  # same port, same AOF
        server = ServerProcess(redis.url, tmp_path, port=server.port).start()
        assert json.loads(await peer("read", base, "killed")) == "first. second."
    finally:
        server.stop()
        redis.stop()

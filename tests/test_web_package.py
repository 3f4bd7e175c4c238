"""The browser package as an app installs it (issue 21): `npm pack` of web/,
then a fresh npm app runs `npm install <tarball> yjs ws` (a folder install
would be a symlink still resolving web/node_modules/yjs). Importing the app's
`yjs` and `@yrelay/client` must give one Yjs, so what a second provider
receives from a real server is the app's `Y.Text` with the content. The app's
Yjs is both the newest and the oldest release the peer range admits: with
yjs as a plain dependency, an app on an older Yjs gets a second copy nested
under the package. The declarations must type-check for a TypeScript app, a
bundler must include one Yjs, and docs/web.md's `<script type="module">`
example must sync in Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from browser import CHROMIUM, CHROMIUM_ARGS, WEB_DIR, require_web_build, run_node
from conftest import running_server

HERE = Path(__file__).parent / "web_package"
DOCS = Path(__file__).parent.parent / "docs" / "web.md"
NPM_FLAGS = ["--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"]
# The app's own Yjs: the newest release, and the floor of the package's peer ranges.
APP_DEPENDENCIES = {
    "newest": ["yjs", "ws"],
    "oldest": ["yjs@13.6.0", "y-protocols@1.0.6", "ws"],
}
DOUBLE_YJS = "Yjs was already imported"


def _run(*command: str, cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="session")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """web/ packed exactly as `npm publish` would upload it."""
    npm = shutil.which("npm")
    assert npm, "npm is needed to pack the browser package"
    out = tmp_path_factory.mktemp("pack")
    name = json.loads(_run(npm, "pack", "--json", "--pack-destination", str(out), cwd=WEB_DIR))[0]["filename"]
    return out / name


@pytest.fixture(scope="session")
def npm_app(tmp_path_factory: pytest.TempPathFactory, tarball: Path) -> Callable[[str], Path]:
    """A fresh npm app with the tarball and the app's own dependencies, made once per kind per session."""
    apps: dict[str, Path] = {}

    def app(kind: str) -> Path:
        if kind not in apps:
            path = tmp_path_factory.mktemp(f"app-{kind}")
            _run("npm", "init", "-y", cwd=path)
            _run("npm", "install", *NPM_FLAGS, str(tarball), *APP_DEPENDENCIES[kind], cwd=path)
            for script in HERE.iterdir():
                shutil.copy(script, path / script.name)
            apps[kind] = path
        return apps[kind]

    return app


def test_the_tarball_holds_the_sources_types_and_readme_only(tarball: Path) -> None:
    with tarfile.open(tarball) as packed:
        names = {name.removeprefix("package/") for name in packed.getnames()}
        manifest = json.load(packed.extractfile("package/package.json"))  # type: ignore[arg-type]
    assert {"package.json", "README.md", "src/index.js", "src/index.d.ts", "src/provider.js"} <= names, names
    assert not {name for name in names if name.split("/")[0] in {"test", "demo", "node_modules"}}, names
    assert "src/bundle.js" not in names  # it bundles its own Yjs: the server's prebuilt file only
    assert "private" not in manifest
    assert manifest["exports"]["."]["types"] == "./src/index.d.ts"
    # The app's Yjs is the one used: peers, never a dependency of their own.
    assert {"yjs", "y-protocols"} <= set(manifest["peerDependencies"])
    assert not {"yjs", "y-protocols"} & set(manifest["dependencies"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(APP_DEPENDENCIES))
async def test_an_app_gets_one_yjs_and_the_synced_text(kind: str, npm_app, redis_url: str) -> None:
    app = npm_app(kind)
    async with running_server(redis_url) as url:
        returncode, stdout, errors = await run_node("sync.mjs", cwd=app, env={"YRELAY_WS_URL": url}, timeout=60)
    assert returncode == 0, errors[-3000:]
    assert DOUBLE_YJS not in errors, errors
    seen = json.loads(stdout.strip().splitlines()[-1])
    # What two copies broke: the text arrived empty and remote types were the package's classes.
    assert seen["text"] == "written through the packed client", seen
    assert seen["textIsYText"] and seen["nestedIsYText"], seen
    assert seen["nested"] == "a nested text", seen
    nested = app / "node_modules" / "@yrelay" / "client" / "node_modules" / "yjs"
    assert not nested.exists(), f"a second Yjs was installed under the package: {nested}"


def test_every_declared_export_exists(npm_app) -> None:
    """The declarations are written by hand: they name exactly what src/index.js exports."""
    app = npm_app("newest")
    script = "import * as c from '@yrelay/client'; console.log(JSON.stringify(Object.keys(c).sort()))"
    exported = json.loads(_run("node", "--input-type=module", "-e", script, cwd=app))
    declarations = (app / "node_modules" / "@yrelay" / "client" / "src" / "index.d.ts").read_text()
    declared = re.findall(r"^export (?:class|function|const) (\w+)", declarations, re.MULTILINE)
    assert sorted(declared) == exported


@pytest.mark.timeout(300)
@pytest.mark.parametrize("resolution", ["bundler", "nodenext"])
def test_the_declarations_type_check_in_a_typescript_app(resolution: str, npm_app) -> None:
    require_web_build()  # tsc is web/'s dev dependency (npm ci)
    app = npm_app("newest")
    module = "esnext" if resolution == "bundler" else "nodenext"
    config = {
        "compilerOptions": {
            "strict": True,
            "noEmit": True,
            "target": "es2022",
            "module": module,
            "moduleResolution": resolution,
            "lib": ["es2022", "dom"],
            "types": [],
        },
        "files": ["consumer.ts"],
    }
    (app / f"tsconfig.{resolution}.json").write_text(json.dumps(config))
    _run(str(WEB_DIR / "node_modules" / ".bin" / "tsc"), "-p", f"tsconfig.{resolution}.json", cwd=app)


@pytest.mark.parametrize("kind", sorted(APP_DEPENDENCIES))
def test_a_bundler_includes_one_yjs(kind: str, npm_app) -> None:
    """esbuild resolves `yjs` from the app's node_modules for the app and the provider alike."""
    require_web_build()  # esbuild is web/'s dev dependency
    app = npm_app(kind)
    _run(
        str(WEB_DIR / "node_modules" / ".bin" / "esbuild"),
        "sync.mjs",
        "--bundle",
        "--format=esm",
        "--platform=node",
        "--external:ws",
        "--log-level=warning",
        "--outfile=bundle.mjs",
        cwd=app,
    )
    # Each copy of Yjs carries its double-import check once.
    assert (app / "bundle.mjs").read_text().count(DOUBLE_YJS) == 1


def script_tag_snippet() -> str:
    """The `<script type="module">` example of docs/web.md, as the page's HTML."""
    blocks = re.findall(r"```html\n(.*?)```", DOCS.read_text(), re.DOTALL)
    snippet = next(block for block in blocks if "yrelay-client.js" in block)
    return snippet.replace("</script>", "  Object.assign(window, { Y, doc, provider })\n</script>")


@pytest.mark.timeout(180)
async def test_the_script_tag_example_syncs_in_chromium(redis_url: str) -> None:
    """docs/web.md's page without a bundler, with the server's prebuilt bundle, in real Chromium."""
    require_web_build()
    async with running_server(redis_url) as url, async_playwright() as playwright:
        base = url.replace("ws://", "http://").removesuffix("/ws")
        html = script_tag_snippet().replace("http://127.0.0.1:8000", base).replace("ws://127.0.0.1:8000", url[:-3])
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pages = []
            for _ in range(2):  # two contexts: two "browsers", two sockets
                page = await (await browser.new_context()).new_page()
                messages: list[str] = []
                page.on("console", lambda message, seen=messages: seen.append(message.text))
                page.on("pageerror", lambda error, seen=messages: seen.append(str(error)))
                # The page at the server's origin, as an app's own page would be (a real
                # navigation: Chromium lets only a local page open a socket to 127.0.0.1).
                await page.goto(f"{base}/static/demo.css")
                await page.set_content(html)
                await page.wait_for_function("window.provider && window.provider.synced", timeout=15_000)
                pages.append((page, messages))
            writer, reader = pages[0][0], pages[1][0]
            await writer.evaluate("doc.getText('text').insert(0, 'typed on a page without a bundler')")
            await reader.wait_for_function(
                "doc.getText('text').toString() === 'typed on a page without a bundler'", timeout=15_000
            )
            assert await reader.evaluate("doc.share.get('text') instanceof Y.Text")
            assert not [text for _, seen in pages for text in seen if DOUBLE_YJS in text]
        finally:
            await browser.close()

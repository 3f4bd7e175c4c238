"""The parts of redis-py's internals yrelay's cluster path reaches into
(yrelay/storage/client.py), checked against the installed release.

``ClusterPipeline`` queues Lua scripts on redis-py's cluster pipeline and, on
``NOSCRIPT``, sends the refused commands again: it reads the queued commands
from ``ClusterPipeline._execution_strategy._command_queue`` (an
``AbstractStrategy`` holding ``PipelineCommand``s with ``args`` and
``kwargs``), which redis-py has had since 6.2 and may change in any
release. pyproject.toml bounds redis-py to the releases the suite passed on
(8.1: on 6.2 the cluster path fails, its response callbacks refusing
options; on 7.1 tests/test_cluster.py fails on presence and unclosed nodes,
and the fault tools' ``CLIENT KILL TYPE replica`` is refused); these tests
fail, saying what changed, on a release outside the bound or one whose
internals moved, so a redis-py upgrade is a deliberate step (widen the
bound once they and tests/test_cluster.py pass on the new release).
"""

from __future__ import annotations

import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import redis.asyncio.cluster as redis_cluster_module
from packaging.requirements import Requirement
from redis.commands.core import AsyncScript

from yrelay.storage.client import ClusterPipeline, YrelayCluster, queued_commands

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
UPGRADE = (
    "yrelay/storage/client.py reaches into redis-py's cluster pipeline (see its ClusterPipeline); "
    "check it against this release's redis/asyncio/cluster.py, then move the bound in pyproject.toml"
)


def redis_requirement() -> Requirement:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [requirement] = [Requirement(line) for line in dependencies if Requirement(line).name == "redis"]
    return requirement


def test_the_installed_redis_py_is_a_release_the_bound_allows() -> None:
    requirement = redis_requirement()
    assert not requirement.specifier.contains("6.1.1"), f"{requirement} allows redis-py 6.1, which has no command queue"
    assert requirement.specifier.contains("8.1.0"), f"{requirement} excludes 8.1, the release checked"
    assert requirement.specifier.contains(version("redis")), (
        f"redis-py {version('redis')} is outside pyproject.toml's {requirement}: {UPGRADE}"
    )


def test_the_cluster_pipeline_has_the_signatures_yrelay_calls() -> None:
    base = redis_cluster_module.ClusterPipeline
    init = list(inspect.signature(base.__init__).parameters)
    assert init[:3] == ["self", "client", "transaction"], f"ClusterPipeline.__init__ is now {init}: {UPGRADE}"
    execute = inspect.signature(base.execute).parameters
    assert {"raise_on_error", "allow_redirections"} <= set(execute), (
        f"ClusterPipeline.execute takes {list(execute)}: {UPGRADE}"
    )
    for name in ("AbstractStrategy", "PipelineCommand"):
        assert hasattr(redis_cluster_module, name), f"redis.asyncio.cluster has no {name}: {UPGRADE}"


async def test_the_commands_queued_on_a_cluster_pipeline_are_read_in_order() -> None:
    """No server needed: queuing only fills the pipeline's command queue
    (the cluster client connects on the first command sent)."""
    client = YrelayCluster(host="127.0.0.1", port=1)
    try:
        pipe = client.pipeline()
        assert isinstance(pipe, ClusterPipeline)
        pipe.set("a", "1")
        await AsyncScript(client, "return 1")(keys=["b"], args=[2], client=pipe)  # queued by ClusterPipeline.evalsha
        pipe.execute_command("GET", "a", keys=["a"])
        queued = queued_commands(pipe)
        assert [command.args for command in queued] == [
            ("SET", "a", "1"),
            ("EVALSHA", AsyncScript(client, "return 1").sha, 1, "b", 2),
            ("GET", "a"),
        ], f"the pipeline's queue holds {queued}: {UPGRADE}"
        assert queued[2].kwargs == {"keys": ["a"]}, f"a queued command's kwargs are {queued[2].kwargs}: {UPGRADE}"
    finally:
        await client.aclose()


def test_a_pipeline_without_the_known_strategy_is_refused_with_a_clear_error() -> None:
    client = YrelayCluster(host="127.0.0.1", port=1)
    pipe = client.pipeline()
    pipe._execution_strategy = object()  # type: ignore[assignment]  # as if redis-py changed its strategies
    with pytest.raises(TypeError, match="no command queue yrelay knows"):
        queued_commands(pipe)


async def test_scripts_a_cluster_node_does_not_know_run_once_loaded(redis_cluster) -> None:
    """The path these internals serve, on a real cluster: a pipeline's
    ``EVALSHA`` refused ``NOSCRIPT`` (never loaded; a script cache flushed, as
    on a promoted replica) is sent again once the scripts are loaded, and
    runs exactly once."""
    client = YrelayCluster.from_url(redis_cluster.url)
    try:
        await client.flushall(target_nodes=YrelayCluster.PRIMARIES)
        await client.execute_command("SCRIPT FLUSH", target_nodes=YrelayCluster.PRIMARIES)
        count = client.register_script("return redis.call('INCR', KEYS[1])")
        for expected in (1, 2):
            pipe = client.pipeline()
            pipe.set("{doc}:before", "x")
            await count(keys=["{doc}:count"], client=pipe)
            assert await pipe.execute() == [True, expected]
            await client.execute_command("SCRIPT FLUSH", target_nodes=YrelayCluster.PRIMARIES)
        assert await client.get("{doc}:count") == b"2"
    finally:
        await client.aclose()

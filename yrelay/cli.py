"""The ``yrelay`` command line: thin over library functions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import typer
import uvicorn
from fastapi import FastAPI
from redis.asyncio import Redis
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from yrelay import extras
from yrelay.app import create_app
from yrelay.app.context import open_event_log
from yrelay.auth import AlreadyExpired, AuthConfigurationError, Permission, Revocations, authenticator_for, issue_token
from yrelay.config import Settings
from yrelay.exceptions import StartupError
from yrelay.gc import Collector, DocReport, GcPolicy, PassSummary, collect_documents
from yrelay.observability import logs
from yrelay.observability.eventlog import EventLog, NullEventLog
from yrelay.storage.client import ensure_reachable, open_redis
from yrelay.storage.embedded import RedisProcess, serve_redis_url
from yrelay.storage.listing import fold_unbucketed, registry_counts
from yrelay.supervisor import Supervisor, reuse_port_socket

cli = typer.Typer(help="yrelay: reliable Yjs sync over Redis streams.", no_args_is_help=True)

# Options of the commands that join a running deployment's Redis (one
# definition each, so their names, variables and help cannot drift apart).
_REDIS_URL = typer.Option(
    None, envvar="YRELAY_REDIS_URL", help="Redis of the servers. Default: the embedded one of `yrelay serve`."
)
_DATA_DIR = typer.Option(Path("data"), envvar="YRELAY_DATA_DIR", help="Where `yrelay serve` keeps its embedded Redis.")
_REDIS_CLUSTER = typer.Option(
    False, "--redis-cluster", envvar="YRELAY_REDIS_CLUSTER", help="--redis-url is one seed node of a Redis Cluster."
)
_PREFIX = typer.Option("", "--prefix", help="Only documents whose id starts with this.")
_LEASE = typer.Option(3.0, min=0.3, help="Seconds after which a silent member's documents move to another.")
_LOG_LEVEL = typer.Option("info", help="debug, info, warning or error.")


@cli.callback()
def main() -> None:
    """yrelay command line."""


@cli.command()
def serve(
    # Options that have a setting default to None: absent, YRELAY_* (or the
    # setting's default) decides; given, they win over the environment.
    host: str | None = typer.Option(None, help="Interface to listen on (default: YRELAY_HOST, else 127.0.0.1)."),
    port: int | None = typer.Option(None, help="Port to listen on (default: YRELAY_PORT, else 8000)."),
    redis_url: str | None = typer.Option(
        None, envvar="YRELAY_REDIS_URL", help="Redis to use. Without it an embedded redis-server is started."
    ),
    data_dir: Path | None = typer.Option(
        None, envvar="YRELAY_DATA_DIR", help="Embedded Redis data (AOF; default: data)."
    ),
    redis_cluster: bool = typer.Option(
        False,
        "--redis-cluster",
        help="--redis-url is one seed node of a Redis Cluster (default: YRELAY_REDIS_CLUSTER).",
    ),
    log_level: str = _LOG_LEVEL,
    log_format: str = typer.Option("text", envvar="YRELAY_LOG_FORMAT", help="text or json (one object a line)."),
    verify_digests: bool = typer.Option(
        False, "--verify-digests", help="Recompute every drift digest from the streams at start-up; fix wrong ones."
    ),
    insecure_no_auth: bool = typer.Option(
        False, "--insecure-no-auth", help="DEVELOPMENT ONLY: no authentication, anyone reads and writes everything."
    ),
    auth_hook: str | None = typer.Option(
        None, help="package.module:factory returning an Authenticator (your own user system); see docs/security.md."
    ),
    workers: str | None = typer.Option(
        None, help="Server processes on this port: a number or auto (one per core); default: YRELAY_WORKERS, else 1."
    ),
    reuse_port: bool = typer.Option(
        False, "--reuse-port", hidden=True, help="Bind with SO_REUSEPORT (how --workers starts each worker)."
    ),
) -> None:
    """Serve the websocket endpoint at /ws, the demo at /, /healthz, /readyz, /metrics and /ops.

    Clients authenticate with tokens signed by YRELAY_AUTH_SECRET (see
    `yrelay token issue`), or through --auth-hook."""
    try:
        settings = Settings.from_env(
            host=host,
            port=port,
            redis_url=redis_url,
            data_dir=data_dir,
            verify_digests=verify_digests or None,
            insecure_no_auth=insecure_no_auth or None,
            auth_hook=auth_hook,
            workers=workers,
            redis_cluster=redis_cluster or None,
        )
    except ValueError as exc:  # a bad YRELAY_* value: one line naming it, no traceback
        _refuse(f"yrelay: {exc}")
    if settings.redis_url is None:  # before anything is logged: the refusal is one line
        if settings.redis_cluster:
            _refuse("yrelay: --redis-cluster needs --redis-url (a seed node of the cluster)")
        extras.require_redis_server("serve without --redis-url")
    try:
        authenticator = authenticator_for(settings)  # refuse before anything starts
    except AuthConfigurationError as exc:
        _refuse(f"yrelay: {exc}")
    try:
        logs.configure(log_level, log_format)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-format") from None
    for secret in (settings.ops_token, settings.metrics_token, settings.auth_secret):
        logs.add_secret(secret)
    logs.add_url_secrets(settings.redis_url)
    _raise_open_file_limit()
    if settings.public_url is None and settings.host in ("0.0.0.0", "::", ""):
        logging.getLogger("yrelay").warning(
            "listening on every interface without YRELAY_PUBLIC_URL: browsers are allowed from this server's "
            "loopback origins and YRELAY_ALLOWED_ORIGINS only (set YRELAY_PUBLIC_URL to its public address)"
        )
    if not reuse_port:  # a worker's socket is bound by its supervisor's rules
        _refuse_if_port_taken(settings.host, settings.port)
    embedded: RedisProcess | None = None
    url = settings.redis_url
    if url is None:
        embedded = RedisProcess(settings.data_dir / "redis").start()
        url = embedded.url
        logging.getLogger("yrelay").info(
            "embedded redis-server on %s (appendonly yes, appendfsync always, data in %s)", url, embedded.data_dir
        )
    else:
        try:
            asyncio.run(_ensure_redis(url, settings.redis_cluster))
        except StartupError as exc:
            _refuse(f"yrelay: {exc}", code=1)
        logging.getLogger("yrelay").info("using Redis at %s", url)  # its password is redacted
    if not reuse_port:
        _signposts(settings)
    try:
        if settings.worker_count() > 1 and not reuse_port:
            code = Supervisor(
                _worker_commands(settings, log_level, log_format, verify_digests, insecure_no_auth, auth_hook),
                {
                    **os.environ,
                    "YRELAY_REDIS_URL": url,
                    **({"YRELAY_REDIS_CLUSTER": "1"} if settings.redis_cluster else {}),
                },
            ).run()
            if code:
                raise typer.Exit(code)
            return
        app = create_app(settings, url, authenticator)
        options: dict[str, Any] = {  # uvicorn's keyword arguments
            "host": settings.host,
            "port": settings.port,
            "log_level": log_level,
            "log_config": None,  # uvicorn's lines go through the handler above (format, redaction)
            **settings.uvicorn_options(),
        }
        if reuse_port:
            _serve_on_shared_port(app, options)
        else:
            uvicorn.run(app, **options)
    finally:
        if embedded is not None:
            embedded.stop()


def _refuse(message: str, code: int = 2) -> NoReturn:
    """``message`` as one line on stderr and exit ``code``: no traceback."""
    typer.echo(message, err=True)
    raise typer.Exit(code) from None


def _refuse_if_port_taken(host: str, port: int) -> None:
    """One line and exit 1 when ``host:port`` is taken, before anything
    starts (uvicorn says so in the 5th of 11 log lines, after starting the
    whole server and its embedded Redis)."""
    import errno
    import socket

    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return  # uvicorn says what is wrong with the host
    for family, kind, proto, _, address in addresses:  # bound as asyncio's create_server binds them
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                continue  # not ours to judge (no IPv6 on this host, ...): uvicorn reports it
            _refuse(
                f"yrelay: cannot listen on {host}:{port} ({exc.strerror}): another server uses it? "
                "Stop it, or choose another port with --port / YRELAY_PORT",
                code=1,
            )


async def _ensure_redis(url: str, cluster: bool) -> None:
    redis = open_redis(url, cluster, socket_connect_timeout=5)
    try:
        await ensure_reachable(redis, url)
    finally:
        with contextlib.suppress(Exception):
            await redis.aclose()


def _signposts(settings: Settings) -> None:
    """Where to go next, logged once at start-up."""
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    base = (settings.public_url or f"http://{host}:{settings.port}").rstrip("/")
    command = sys.argv[0]
    if os.path.isabs(command) and not (relative := os.path.relpath(command)).startswith(".."):
        command = relative  # .venv/bin/yrelay, from a checkout
    logging.getLogger("yrelay").info(
        "the demo editor: %s/?doc=notes (open it in two tabs); health: %s/healthz; the command line: "
        "%s --help (e.g. %s gc --dry-run)",
        base,
        base,
        command,
        command,
    )


def _serve_on_shared_port(app: FastAPI, options: dict[str, Any]) -> None:
    """uvicorn on its own ``SO_REUSEPORT`` socket: one of ``--workers``."""
    server = uvicorn.Server(uvicorn.Config(app, **options))
    server.run(sockets=[reuse_port_socket(str(options["host"]), int(options["port"]))])
    if not server.started:  # as uvicorn.run: a server that could not start is a failure
        raise typer.Exit(3)


def _worker_commands(
    settings: Settings,
    log_level: str,
    log_format: str,
    verify_digests: bool,
    insecure_no_auth: bool,
    auth_hook: str | None,
) -> list[list[str]]:
    """Each worker's ``yrelay serve``: one process, the resolved host, port and
    data dir, the command-line switches given (the environment, inherited,
    says the rest; the Redis URL goes there too, out of the process list).
    Only the first worker verifies the digests: once is enough."""
    base = [sys.executable, "-m", "yrelay", "serve", "--workers", "1", "--reuse-port"]
    base += ["--host", settings.host, "--port", str(settings.port), "--data-dir", str(settings.data_dir)]
    base += ["--log-level", log_level, "--log-format", log_format]
    base += ["--insecure-no-auth"] if insecure_no_auth else []
    base += ["--auth-hook", auth_hook] if auth_hook else []
    count = settings.worker_count()
    return [base + (["--verify-digests"] if verify_digests and index == 0 else []) for index in range(count)]


def _raise_open_file_limit() -> None:
    """Every connection is a file descriptor: take the hard limit the system
    grants (a soft limit of 1,024 is common), so the connection caps of
    docs/operations.md, not the descriptor limit, decide who gets in."""
    try:
        import resource
    except ImportError:  # not a Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _redis_url(redis_url: str | None, data_dir: Path) -> str:
    """The given URL, else the one a running ``yrelay serve`` left for its
    embedded Redis under the data dir."""
    if redis_url:
        return redis_url
    if running := serve_redis_url(data_dir):
        return running
    raise typer.BadParameter(
        f"no --redis-url given and no embedded Redis running under {data_dir}", param_hint="--redis-url"
    )


@cli.command()
def gc(
    docs: list[str] | None = typer.Argument(None, help="Documents to collect (all when none are given)."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Report what would be folded, trimmed and evicted; change nothing."
    ),
    redis_url: str | None = _REDIS_URL,
    data_dir: Path = _DATA_DIR,
    redis_cluster: bool = _REDIS_CLUSTER,
    batch_size: int = typer.Option(500, min=1, help="Documents per round trip."),
    rows: int = typer.Option(20, min=0, help="Documents listed in the table (those with most work)."),
) -> None:
    """Collect documents now: evict lagging sessions, fold into snapshots, trim streams.

    Safe while servers run: collections of the same document at the same time
    cannot both store a snapshot, and none can trim what is not folded.
    """
    settings = Settings.from_env()
    policy = GcPolicy.from_settings(settings)
    events = open_event_log(replace(settings, data_dir=data_dir)) if not dry_run else NullEventLog()
    try:
        summary = asyncio.run(
            _gc(_redis_url(redis_url, data_dir), redis_cluster, docs or None, policy, dry_run, batch_size, events)
        )
    finally:
        events.stop()
    _print_summary(summary, dry_run, rows)
    if summary.errors:
        raise typer.Exit(1)


async def _gc(
    url: str,
    cluster: bool,
    docs: list[str] | None,
    policy: GcPolicy,
    dry_run: bool,
    batch_size: int,
    events: EventLog,
) -> PassSummary:
    async with contextlib.aclosing(open_redis(url, cluster)) as redis:
        if not dry_run:
            await fold_unbucketed(redis)
        total = len(docs) if docs is not None else (await registry_counts(redis))[0]
        with Progress(transient=True) as progress:
            task = progress.add_task("dry run" if dry_run else "collecting", total=total)
            return await collect_documents(
                Collector(redis, policy, events=events),
                docs,
                dry_run=dry_run,
                batch_size=batch_size,
                on_batch=lambda reports: progress.advance(task, len(reports)),
            )


def _print_summary(summary: PassSummary, dry_run: bool, rows: int) -> None:
    console = Console()
    verb = "would be" if dry_run else "were"
    table = Table(
        title=f"GC of {summary.documents} documents in {summary.seconds:.2f}s" + (" (dry run)" if dry_run else "")
    )
    for column in ("document", "eviction", "evicted", "folded", "trimmed", "stream", "snapshot offset", "note"):
        table.add_column(column, justify="right" if column in {"evicted", "folded", "trimmed", "stream"} else "left")
    busiest = sorted(summary.reports, key=lambda r: (r.error is None, -(r.evicted + r.folded + r.trimmed)))
    for report in busiest[:rows]:
        counts = (report.evicted, report.folded, report.trimmed, report.stream_length)
        table.add_row(report.doc, report.eviction, *map(str, counts), report.snapshot_offset, _note(report))
    table.add_section()
    totals = (summary.evicted, summary.folded, summary.trimmed)
    errors = f"{summary.blocked} blocked, {summary.conflicts} conflicts, {summary.errors} errors"
    table.add_row("total", "", *map(str, totals), "", "", errors)
    console.print(table)
    console.print(
        f"{summary.evicted} sessions {verb} evicted, {summary.folded} entries {verb} folded, "
        f"{summary.trimmed} {verb} trimmed."
    )


def _note(report: DocReport) -> str:
    if report.error:
        return f"error: {report.error}"
    if report.blocked_at:
        return f"blocked at {report.blocked_at}"
    return "conflict" if report.conflict else ""


@cli.command()
def analyze(
    events: Path = typer.Option(
        ..., "--events", exists=True, file_okay=False, help="Directory of event log files (*.jsonl)."
    ),
    out: Path = typer.Option(..., "--out", help="Directory for the Parquet tables and dashboard.html."),
    redis_url: str | None = typer.Option(
        None, "--redis-url", help="Also read current stream entries and trackers from this Redis."
    ),
    master: str = typer.Option("local[*]", help="Spark master: local[*], local[2], spark://HOST:PORT."),
    bucket: int | None = typer.Option(
        None,
        min=1,
        help="Seconds per time bucket (lag and events over time); "
        "default: chosen from the log's span (at most 120 buckets).",
    ),
    window: int = typer.Option(10, min=2, help="Acks in a session's status window."),
    top: int = typer.Option(20, min=1, help="Rows of the top-lagging and hottest-document tables."),
    spark_log: Path | None = typer.Option(
        None, "--spark-log", help="Where Spark's own log lines go (default OUT/spark.log): never the terminal."
    ),
) -> None:
    """Analyse the event log with Spark: lag, statuses, ack latency, resends, GC; Parquet tables and an HTML dashboard.

    Needs the spark extra: pip install 'yrelay\\[spark]' (and a Java 17+ runtime)."""
    # pyspark is imported here, not at the top: `serve` and `gc` should not pay
    # for it, and a lean install (no spark extra) says what to install.
    extras.require("spark", "analyze")
    from yrelay.spark_analytics.events import event_files
    from yrelay.spark_analytics.report import JobProgress, stderr_to

    if not event_files(events):
        raise typer.BadParameter(f"no *.jsonl event files in {events}", param_hint="--events")
    console = Console()
    with JobProgress(console=console) as progress:  # on screen before the JVM starts
        progress.step("starting Spark", 0, 1)
        from yrelay.spark_analytics.analysis import Options
        from yrelay.spark_analytics.dashboard import DASHBOARD
        from yrelay.spark_analytics.job import JobConfig, run
        from yrelay.spark_analytics.report import summary_table
        from yrelay.spark_analytics.session import spark_session

        config = JobConfig(events, out, redis_url, Options(bucket_seconds=bucket, window=window, top=top))
        with stderr_to(spark_log or out / "spark.log"):
            spark = spark_session(master, "yrelay-analyze", **{"spark.ui.showConsoleProgress": "false"})
            spark.sparkContext.setLogLevel("ERROR")
            progress.context = spark.sparkContext
            try:
                summary = run(spark, config, on_step=progress.step)
            finally:
                progress.context = None
                spark.stop()
    console.print(summary_table(summary, str(out)))
    console.print(f"Tables in {out.resolve()}; Spark's log in {(spark_log or out / 'spark.log').resolve()}.")
    console.print(f"Dashboard: [bold]{(out / DASHBOARD).resolve()}[/bold]")


@cli.command("subject-hash")
def subject_hash(subject: str = typer.Argument(..., help="A subject (a token's sub, a user id).")) -> None:
    """Print how the event log records SUBJECT by default (event_log_subject=hash), to find its sessions
    in `yrelay analyze`'s tables and dashboard."""
    from yrelay.observability.eventlog import subject_for_log

    typer.echo(subject_for_log(subject, "hash"))


@cli.command()
def chaos(
    seed: int = typer.Option(1, help="Seed of the fault schedule and of the edits."),
    duration: float = typer.Option(60.0, min=10, help="Seconds of editing (faults happen inside it)."),
    clients: int = typer.Option(6, min=1, help="Client processes, each behind its own fault proxy."),
    ephemeral_clients: int | None = typer.Option(
        None, min=0, help="Clients without persistence (a killed one restarts as a new client); default half."
    ),
    docs: int = typer.Option(3, min=1, help="Documents every client edits."),
    servers: int = typer.Option(3, min=1, help="yrelay server processes on the one Redis."),
    faults: str = typer.Option("all", help="Comma-separated fault kinds or groups (all, network, server-kill, ...)."),
    fsync: str = typer.Option("always", help="appendfsync of redis-server: always or everysec."),
    replica: bool = typer.Option(True, "--replica/--no-replica", help="Keep a replica (needed by the failover fault)."),
    mean_gap: float = typer.Option(4.0, min=0.5, help="Mean seconds between two faults."),
    edit_interval: float = typer.Option(0.15, min=0.01, help="Mean seconds between two edits of one client."),
    out: Path = typer.Option(Path("data/chaos"), help="Directory for the run's processes, logs and report."),
    cluster: bool = typer.Option(
        False,
        "--cluster",
        help="On a Redis Cluster (3 masters, a replica each): "
        "adds master-kill, cluster-failover and slot-migration to the faults.",
    ),
    ack_replicas: int = typer.Option(
        0, min=0, help="The servers' ack_replicas (1: no acked update lost in a failover)."
    ),
) -> None:
    """Fault injection: prove that no acknowledged update is lost (docs/reliability.md).

    Exits 1 when an acked update is missing anywhere, the replicas did not
    converge, a stored entry can never apply, or a stream did not fold.

    Needs the chaos extra: pip install 'yrelay\\[chaos]'.
    """
    extras.require("chaos", "chaos")
    from datetime import datetime

    from yrelay_tools.chaos.nemesis import SINGLE_REDIS_FAULTS, Fault, parse_faults
    from yrelay_tools.chaos.run import ChaosConfig, run_chaos

    try:
        kinds = tuple(parse_faults(faults, cluster))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--faults") from None
    if not replica and faults.strip() == "all":
        kinds = tuple(kind for kind in kinds if kind is not Fault.FAILOVER)
    if cluster and (shared := set(SINGLE_REDIS_FAULTS) & set(kinds)):
        raise typer.BadParameter(
            f"not on a cluster: {', '.join(sorted(f.value for f in shared))} "
            "(master-kill and cluster-failover are its faults)",
            param_hint="--faults",
        )
    if Fault.FAILOVER in kinds and not replica:
        raise typer.BadParameter("the failover fault needs a replica; leave out --no-replica", param_hint="--faults")
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if ephemeral_clients is not None and ephemeral_clients > clients:
        raise typer.BadParameter(f"at most --clients ({clients})", param_hint="--ephemeral-clients")
    config = ChaosConfig(
        seed=seed,
        duration=duration,
        clients=clients,
        ephemeral_clients=ephemeral_clients,
        docs=docs,
        servers=servers,
        faults=kinds,
        fsync=fsync,
        replica=replica,
        mean_gap=mean_gap,
        edit_interval=edit_interval,
        cluster=cluster,
        ack_replicas=ack_replicas,
    )
    root = out / datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    report = asyncio.run(run_chaos(config, root))
    typer.echo(report.to_markdown())
    typer.echo(f"report: {root / 'report.json'}")
    if not report.ok:
        raise typer.Exit(1)


@cli.command()
def bench(
    scenario: list[str] = typer.Argument(None, help="hot, many, catchup, idle (default: all four)."),
    targets: str = typer.Option("yrelay,pycrdt,node,broadcast", help="Servers to run side by side."),
    hot_rates: str = typer.Option(
        "100,250,500,1000,2000,4000,8000,16000", help="Offered updates/s of scenario hot, ascending."
    ),
    many_rates: str = typer.Option("500,1000,2000,4000,8000,16000", help="Offered updates/s of scenario many."),
    duration: float = typer.Option(5.0, min=0.5, help="Seconds of sending per step."),
    readers: int = typer.Option(50, min=1, help="Readers of the hot document."),
    docs: int = typer.Option(1000, min=1, help="Documents of scenario many (2 clients each)."),
    entries: int = typer.Option(100_000, min=10, help="Entries a reconnecting client is behind (catchup)."),
    connections: int = typer.Option(10_000, min=1, help="Idle connections (idle)."),
    deflate: bool = typer.Option(True, help="Clients offer permessage-deflate as Chromium does (hot, many, idle)."),
    markdown: Path | None = typer.Option(None, help="Also write the tables as markdown here."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write every figure as JSON here."),
) -> None:
    """Benchmark yrelay against pycrdt-websocket, the y-websocket Node server,
    a bare uvicorn broadcast server and pipelined XADD (BENCHMARKS.md).

    Needs the bench extra: pip install 'yrelay\\[bench]'."""
    extras.require("bench", "bench")
    import json
    import sys

    from yrelay_tools.bench import SCENARIOS, BenchConfig, run_bench

    chosen = tuple(scenario or SCENARIOS)
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        raise typer.BadParameter(f"unknown: {', '.join(sorted(unknown))}", param_hint="SCENARIO")
    config = BenchConfig(
        scenarios=chosen,
        targets=tuple(t for t in targets.split(",") if t),
        hot_rates=[float(r) for r in hot_rates.split(",")],
        many_rates=[float(r) for r in many_rates.split(",")],
        duration=duration,
        readers=readers,
        docs=docs,
        entries=entries,
        connections=connections,
        deflate=deflate,
    )
    report = run_bench(config, "yrelay bench " + " ".join(sys.argv[2:]), progress=typer.echo)
    report.print()
    if markdown is not None:
        markdown.write_text(report.markdown() + "\n")
    if json_out is not None:
        json_out.write_text(json.dumps(report.as_dict(), indent=1, default=str))


@cli.command()
def webhook(
    group: str = typer.Option(
        ..., "--group", help="The consumer group's name (shared by every webhook process of it)."
    ),
    url: str | None = typer.Option(
        None, "--url", help="Where each batch is POSTed (JSON). Required unless --retry-dead."
    ),
    secret_env: str = typer.Option(
        "YRELAY_WEBHOOK_SECRET",
        "--secret-env",
        help="The environment variable holding the signing secret (never on the command line).",
    ),
    prefix: str = _PREFIX,
    redis_url: str | None = _REDIS_URL,
    data_dir: Path = _DATA_DIR,
    lease: float = _LEASE,
    redis_cluster: bool = _REDIS_CLUSTER,
    concurrency: int = typer.Option(16, min=1, help="Requests in flight at once (one per document at most)."),
    max_attempts: int = typer.Option(
        8,
        min=0,
        envvar="YRELAY_WEBHOOK_MAX_ATTEMPTS",
        help="Failed attempts of one batch before its document is parked (dead letter); 0: never park.",
    ),
    text: str | None = typer.Option(
        None,
        "--text",
        metavar="NAME",
        help="Add the shared text NAME (the demo editor's is 'text') to each body, "
        "with the batch applied; keeps a copy of each held document.",
    ),
    retry_dead: bool = typer.Option(
        False,
        "--retry-dead",
        help="Unpark every dead letter of --group (delivered again from their last ack "
        "by the running members), then exit.",
    ),
    log_level: str = _LOG_LEVEL,
) -> None:
    """POST every change of every document (or of --prefix) to --url, signed, in order per document, at least once.

    Run several with the same --group to share the documents; SIGTERM leaves
    the group cleanly. See docs/consumers.md, "Webhooks"."""
    if retry_dead:
        asyncio.run(_retry_dead(_redis_url(redis_url, data_dir), redis_cluster, group))
        return
    if not url:
        _refuse("yrelay webhook: --url is required")
    extras.require("webhooks", "webhook")
    secret = os.environ.get(secret_env, "")
    if not secret:
        _refuse(f"yrelay webhook: set the signing secret in ${secret_env}")
    logs.configure(log_level)
    logs.add_secret(secret)
    from yrelay.consumers.webhook import serve as serve_webhook

    member = partial(
        serve_webhook,
        group=group,
        url=url,
        secret=secret,
        prefix=prefix,
        lease=lease,
        concurrency=concurrency,
        max_attempts=max_attempts or None,
        text=text,
    )
    _run_member("webhook", _redis_url(redis_url, data_dir), redis_cluster, group, member)


async def _retry_dead(redis_url: str, cluster: bool, group: str) -> None:
    from yrelay.consumers.dead_letters import DeadLetters

    async with contextlib.aclosing(open_redis(redis_url, cluster)) as redis:
        retried = await DeadLetters(redis, group).retry_all()
    typer.echo(f"retried {retried} dead letter(s) of group {group}")


def _run_member(kind: str, redis_url: str, cluster: bool, group: str, serve: Callable[..., Awaitable[object]]) -> None:
    """Run ``serve(redis, stop=...)``, one member of ``group``, until SIGTERM
    or SIGINT; it leaves the group, and its counts are logged. The Redis URL
    is redacted from every log line first."""
    logs.add_url_secrets(redis_url)

    async def run() -> None:
        stop = _stop_on_signals()
        async with contextlib.aclosing(open_redis(redis_url, cluster)) as redis:
            stats = await serve(redis, stop=stop)
        logging.getLogger(f"yrelay.{kind}").info("left group %s: %s", group, stats)

    asyncio.run(run())


@cli.command(context_settings={"allow_interspersed_args": False})
def consume(
    command: list[str] = typer.Argument(..., help="The command and its arguments, after --."),
    group: str = typer.Option(..., "--group", help="The consumer group's name (shared by every member of it)."),
    prefix: str = _PREFIX,
    ack_on_write: bool = typer.Option(
        False, "--ack-on-write", help="Ack each batch once written to the pipe, without waiting for 'ack <id>'."
    ),
    window: int = typer.Option(16, min=1, help="Batches written and not yet acked, at most."),
    redis_url: str | None = _REDIS_URL,
    data_dir: Path = _DATA_DIR,
    lease: float = _LEASE,
    redis_cluster: bool = _REDIS_CLUSTER,
    log_level: str = _LOG_LEVEL,
) -> None:
    """Pipe every change (of --prefix) to COMMAND's stdin, one JSON line per batch; it acks with 'ack <delivery id>'.

    yrelay consume --group export -- python export.py. The command is
    restarted when it exits; SIGTERM stops it and leaves the group. See
    docs/consumers.md, "yrelay consume"."""
    logs.configure(log_level)
    from yrelay.consumers.pipe import serve as serve_pipe

    member = partial(
        serve_pipe, group=group, command=command, prefix=prefix, lease=lease, ack_on_write=ack_on_write, window=window
    )
    _run_member("consume", _redis_url(redis_url, data_dir), redis_cluster, group, member)


def _stop_on_signals() -> asyncio.Event:
    """An event SIGTERM and SIGINT set (in the running loop)."""
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


token_cli = typer.Typer(
    help="Client tokens for the built-in JWT authentication (YRELAY_AUTH_SECRET).", no_args_is_help=True
)
cli.add_typer(token_cli, name="token")


@token_cli.command("issue")
def token_issue(
    subject: str = typer.Option(..., "--sub", help="Who the token is for (a user id)."),
    docs: list[str] = typer.Option(..., "--doc", help="A document id, or a prefix ending in * (repeatable)."),
    permission: Permission = typer.Option(Permission.WRITE, "--perm", help="read or write."),
    ttl: float = typer.Option(3600.0, help="Seconds until it expires."),
    secret: str = typer.Option(..., envvar="YRELAY_AUTH_SECRET", help="The server's signing secret."),
) -> None:
    """Print a signed token (for development, scripts and tests; apps mint
    their own with any JWT library and the same claims)."""
    typer.echo(issue_token(secret, subject, docs, permission, ttl))


@token_cli.command("revoke")
def token_revoke(
    token_id: str = typer.Argument(..., help="The token's jti."),
    expires_at: float | None = typer.Option(None, help="When the token expires (Unix seconds); kept until then."),
    redis_url: str | None = _REDIS_URL,
    data_dir: Path = _DATA_DIR,
) -> None:
    """Revoke a token everywhere: its connections are cut off within seconds."""

    async def revoke() -> None:
        async with contextlib.aclosing(Redis.from_url(_redis_url(redis_url, data_dir))) as redis:
            await Revocations(redis, leeway=Settings.from_env().auth_leeway).revoke(token_id, expires_at)

    try:
        asyncio.run(revoke())
    except AlreadyExpired as exc:
        raise typer.BadParameter(str(exc), param_hint="--expires-at") from None
    typer.echo(f"revoked {token_id}")


if __name__ == "__main__":  # last, so every subcommand (token too) is registered first
    cli()

"""Issue 30's attacks against real server processes of one or more
checkouts, side by side: what a victim (a writer and a reader on /ws,
/healthz) sees in a quiet phase and under each attack, and what the
server's process does (RSS, CPU, log lines).

    cd /tmp && /work/main/.venv/bin/python /work/main/bench/attack_probe.py \\
        --tree before=/tmp/ap-before --tree after=/work/main \\
        --attacks ping,ping_auth,query_awareness,half_frames,ops_body,burst --seconds 10 --json /tmp/ap.json

Each tree's server is ``python -m yrelay serve --port P --redis-url URL
--log-level warning`` run with cwd=<tree> (so that tree's ``yrelay`` is
imported; checked before it starts), one worker (``YRELAY_WORKERS=1``),
authentication on (a random secret and ops token), against a redis-server
of its own (flushed between attacks). A fresh server per (tree, attack);
the trees take turns attack by attack. Everything connects from 127.0.0.1.
The attacks themselves run in a child process
(``yrelay_tools.testing.attacks``), so their CPU is not the victim's.

Per (tree, attack): a quiet phase of ``--seconds`` with the victim
writing (one update every 50 ms), then the attack with the victim writing
(``--seconds`` for the floods; as long as it takes for the waves, the
requests and the burst). Figures: update-to-delivery latency p50/p99/max
and updates not delivered by the phase's end; /healthz every 100 ms
(p99, max, failures = no answer within 5 s); server RSS and CPU seconds
(its worker processes' CPU apart); lines of the server's log with "No
connection available", "Traceback", " WARNING ", " ERROR " (per phase, and
over the server's whole run); and each attack's own counts. Raw figures
go to ``--json``.

query_awareness sends its rounds of ``--queries`` messages one after the
other once the answers have stopped for ``--query-quiet`` seconds (1 s);
``--query-quiet 0`` sends them back to back (a flood the server reads as
fast as it can: it then answers hardly anything, so its amplification
figure means little, but the victim's figures are the harshest).
ops_body repeats its three requests (128 MiB JSON, 128 MiB malformed,
64 bytes malformed) at most once a second through the phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import queue as queue_module
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # this checkout's yrelay_tools (and its yrelay, for the clients)

from yrelay.storage.embedded import RedisProcess  # noqa: E402
from yrelay_tools.testing import attacks  # noqa: E402
from yrelay_tools.testing.processes import ServerProcess  # noqa: E402

ATTACKS = ("ping", "ping_auth", "query_awareness", "half_frames", "ops_body", "burst")
#: Lines of the server's log counted per phase (``--log-pattern`` adds more).
LOG_PATTERNS = ["No connection available", "Traceback", " WARNING ", " ERROR "]
MiB = 1024 * 1024
STARTED = time.monotonic()


def progress(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:7.1f}s] {message}", flush=True)


# ---------------------------------------------------------------- the attack's own process


def _attack_child(name: str, kwargs: dict[str, Any], out: Any, acks: Any) -> None:
    """Runs in a spawned process: one attack; its events and result to
    ``out``. An event waits (at most 5 s) until the parent has taken its
    samples (``acks``), so that "after wave 1" is not already part of wave 2."""
    import logging

    logging.basicConfig(level=logging.ERROR)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when it ends

    def on_event(event: str, data: dict[str, Any]) -> None:
        out.put(("event", event, data))
        with contextlib.suppress(queue_module.Empty):
            acks.get(timeout=5)

    try:
        if name == "burst":
            result = asyncio.run(attacks.burst(**kwargs, on_event=on_event))
        else:
            function = {
                "ping": attacks.ping_flood,
                "ping_auth": attacks.ping_flood,
                "query_awareness": attacks.query_awareness_flood,
                "half_frames": attacks.half_frames,
                "ops_body": attacks.ops_flood,
            }[name]
            result = function(**kwargs, on_event=on_event)
        out.put(("result", result))
    except BaseException:  # noqa: BLE001 - reported by the parent
        out.put(("failed", traceback.format_exc()))


class Resources:
    """Everything started, stopped in reverse on exit (also on Ctrl-C)."""

    def __init__(self) -> None:
        self.redis: list[RedisProcess] = []
        self.servers: list[ServerProcess] = []
        self.children: list[multiprocessing.process.BaseProcess] = []
        self.dirs: list[Path] = []

    def stop_all(self) -> None:
        for child in self.children:
            if child.is_alive():
                child.terminate()
                child.join(5)
                if child.is_alive():
                    child.kill()
                    child.join(5)
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()
        for redis in self.redis:
            with contextlib.suppress(Exception):
                redis.stop()
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)
        self.children, self.servers, self.redis, self.dirs = [], [], [], []


RESOURCES = Resources()


# ---------------------------------------------------------------- one tree


class Tree:
    def __init__(self, name: str, path: Path, env: dict[str, str], workdir: Path):
        self.name, self.path, self.env = name, path.resolve(), env
        self.workdir = workdir / name
        self.secret = secrets.token_urlsafe(32)
        self.ops_token = secrets.token_urlsafe(24)
        self.redis: RedisProcess | None = None
        self.info: dict[str, Any] = {"path": str(self.path)}

    def check(self) -> None:
        """The tree's ``yrelay`` is what ``python -m yrelay`` imports there."""
        found = subprocess.run(
            [sys.executable, "-c", "import yrelay; print(yrelay.__file__)"],
            cwd=self.path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        imported = Path(found.stdout.strip()).resolve() if found.returncode == 0 else None
        if imported is None or self.path not in imported.parents:
            raise SystemExit(
                f"tree {self.name}: python -m yrelay in {self.path} imports {imported or found.stderr[-300:]}"
            )
        self.info["imports"] = str(imported)
        rev = subprocess.run(
            ["git", "-C", str(self.path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "-C", str(self.path), "status", "--porcelain", "--untracked-files=no", "--", "yrelay"],
            capture_output=True,
            text=True,
        )
        self.info["commit"] = rev.stdout.strip() or None
        self.info["uncommitted_yrelay_files"] = len(dirty.stdout.splitlines()) if dirty.returncode == 0 else None
        self.info["static"] = (self.path / "yrelay" / "app" / "static").is_dir()

    def start_redis(self) -> None:
        self.redis = RedisProcess(self.workdir / "redis")
        RESOURCES.redis.append(self.redis)
        RESOURCES.dirs.append(self.workdir / "redis")
        self.redis.start()

    def server_env(self, attack: str) -> dict[str, str]:
        return {
            "YRELAY_INSECURE_NO_AUTH": "0",
            "YRELAY_AUTH_SECRET": self.secret,
            "YRELAY_OPS_TOKEN": self.ops_token,
            "YRELAY_WORKERS": "1",
            "YRELAY_DATA_DIR": str(self.workdir / f"data-{attack}"),
            **self.env,
        }

    def token(self, subject: str, docs: list[str], permission: str) -> str:
        return attacks.mint_token(self.secret, subject, docs, permission)


async def run_one(tree: Tree, attack: str, args: argparse.Namespace) -> dict[str, Any]:
    """One attack against a fresh server of ``tree``: the quiet phase, then the attack."""
    import redis as redis_py

    assert tree.redis is not None
    redis_py.Redis.from_url(tree.redis.url).flushall()
    server = ServerProcess(tree.redis.url, tree.workdir / "logs", env=tree.server_env(attack), cwd=tree.path)
    RESOURCES.servers.append(server)
    server.start(timeout=60)
    assert server.process is not None
    pid, port = server.process.pid, server.port
    progress(f"{tree.name}/{attack}: server pid {pid} on port {port} (log {server.log_path})")
    sampler = attacks.ProcessSampler(pid)
    sampler.start()
    health = attacks.HealthProbe(port)
    health.start()
    record: dict[str, Any] = {"server_log": str(server.log_path), "port": port}
    victim = attacks.Victim(
        server.ws_url,
        f"victim-{attack}",
        tree.token("victim", ["victim-*"], "write"),
        tree.token("victim", ["victim-*"], "write"),
    )
    crowd: attacks.PresenceCrowd | None = None
    child: multiprocessing.process.BaseProcess | None = None
    try:
        await victim.start()
        record["auth"] = victim.welcome_auth
        progress(f"{tree.name}/{attack}: victim connected, auth {victim.welcome_auth}")
        kwargs: dict[str, Any] = {"host": "127.0.0.1", "port": port}
        attacker = tree.token("attacker", ["*"], "read")
        if attack == "ping":
            kwargs |= {"duration": args.seconds}
        elif attack == "ping_auth":
            kwargs |= {"duration": args.seconds, "token": attacker}
        elif attack == "query_awareness":
            crowd = attacks.PresenceCrowd(
                server.ws_url,
                "presence-doc",
                lambda i: tree.token(f"presence-{i}", ["presence-doc"], "read"),
                total_bytes=args.presence_bytes,
            )
            await crowd.start()
            greeting = await _greeting(port, "presence-doc", attacker, crowd.entries)
            record["presence"] = {
                "connections": crowd.connections,
                "entries": crowd.entries,
                "state_bytes": crowd.state_bytes,
                "greeting": greeting,
                "errors": dict(crowd.errors),
            }
            progress(
                f"{tree.name}/{attack}: presence set up, {crowd.connections} connections, greeting "
                f"{greeting['bytes'] / 1024:.1f} KiB ({greeting['entries']} entries)"
            )
            kwargs |= {
                "doc": "presence-doc",
                "token": attacker,
                "duration": args.seconds,
                "queries": args.queries,
                "answers_quiet": args.query_quiet or None,
            }
        elif attack == "half_frames":
            kwargs |= {
                "waves": args.half_waves,
                "per_wave": args.half_sockets,
                "declared": args.half_declared_mib * MiB,
                "payload": args.half_payload_mib * MiB,
                "hold": args.seconds,
            }
        elif attack == "ops_body":
            kwargs |= {"duration": args.seconds, "size": args.ops_body_mib * MiB}
        elif attack == "burst":
            kwargs = {
                "url": server.ws_url,
                "token": tree.token("burst", ["burst-*"], "write"),
                "doc": "burst-doc",
                "clients": 3,
                "updates": args.burst_updates,
                "timeout": args.burst_timeout,
                "check_token": tree.token("burst-check", ["burst-*"], "read"),
            }
        baseline_connections = sampler.connections(port)

        # quiet
        logs0 = attacks.count_log_lines(server.log_path, LOG_PATTERNS)
        victim.phase = "quiet"
        q0 = time.perf_counter()
        victim.send_updates(True)
        await asyncio.sleep(args.seconds)  # the phase's length, not a wait for readiness
        victim.send_updates(False)
        q1 = time.perf_counter()
        logs1 = attacks.count_log_lines(server.log_path, LOG_PATTERNS)
        await victim.wait_delivered(5)
        progress(f"{tree.name}/{attack}: quiet phase done ({_short(victim.summary('quiet', q1))})")

        # attack
        context = multiprocessing.get_context("spawn")
        out, acks = context.Queue(), context.Queue()
        child = context.Process(target=_attack_child, args=(attack, kwargs, out, acks), daemon=True)
        RESOURCES.children.append(child)
        child.start()
        events: list[dict[str, Any]] = []
        result: dict[str, Any] | None = None
        failure: str | None = None
        a0: float | None = None
        a1: float | None = None
        limit = time.perf_counter() + _child_timeout(attack, args)
        while result is None and failure is None:
            try:
                item = out.get_nowait()
            except queue_module.Empty:
                if not child.is_alive():
                    try:
                        item = out.get(timeout=1)
                    except queue_module.Empty:
                        failure = f"attack process exited with {child.exitcode} without a result"
                        break
                elif time.perf_counter() > limit:
                    failure = "attack process timed out"
                    break
                else:
                    await asyncio.sleep(0.01)
                    continue
            kind = item[0]
            now = time.perf_counter()
            if kind == "event":
                _, event, data = item
                sample = sampler.now()
                if event == "attack_start" and a0 is None:
                    a0 = now
                    victim.phase = "attack"
                    victim.send_updates(True)
                    progress(f"{tree.name}/{attack}: attack started")
                elif event == "attack_end":
                    a1 = now
                    victim.send_updates(False)
                events.append(
                    {
                        "event": event,
                        **data,
                        "at_s": round(now - (a0 or now), 3),
                        "rss_mib": round(sample[1], 1) if sample else None,
                    }
                )
                if event in ("wave", "closing", "closed"):
                    events[-1]["server_connections"] = sampler.connections(port)
                if event in ("wave", "closing") or (event == "request_end" and len(events) <= 8):
                    progress(
                        f"{tree.name}/{attack}: {event} {json.dumps(data)[:160]} "
                        f"rss {sample[1] if sample else float('nan'):.1f} MiB"
                    )
                acks.put(True)
            elif kind == "result":
                result = item[1]
            elif kind == "failed":
                failure = item[1]
        victim.send_updates(False)
        end = time.perf_counter()
        if a0 is None:
            a0 = end
        if a1 is None:
            a1 = end
        logs2 = attacks.count_log_lines(server.log_path, LOG_PATTERNS)
        child.join(10)
        if child.is_alive():
            child.terminate()
            child.join(5)
        RESOURCES.children.remove(child)
        child = None
        delivered_all = await victim.wait_delivered(5)

        after: dict[str, Any] = {}
        if attack == "half_frames":
            after = await _settle(sampler, port, baseline_connections)
        record.update(
            {
                "attack_result": result,
                "attack_failure": failure,
                "events": events,
                "phases": {
                    "quiet": _phase(victim, health, sampler, "quiet", q0, q1, logs0, logs1),
                    "attack": _phase(victim, health, sampler, "attack", a0, a1, logs1, logs2),
                },
                "victim_all_delivered_5s_after": delivered_all,
                "victim_reconnects": dict(victim.reconnects),
                "after": after,
                "server_connections_baseline": baseline_connections,
                "server_exit_code": server.process.poll(),
            }
        )
        if crowd is not None:
            record["presence"]["errors_end"] = dict(crowd.errors)
            record["presence"]["dropped"] = crowd.dropped
        if attack == "ops_body":
            record["ops_requests_rss"] = _request_rss(events, sampler, a0)
        record["log_lines_total"] = attacks.count_log_lines(server.log_path, LOG_PATTERNS)
        progress(
            f"{tree.name}/{attack}: attack done ({_short(victim.summary('attack', a1))})"
            + (f"; FAILED: {failure.strip().splitlines()[-1]}" if failure else "")
        )
        return record
    finally:
        if child is not None and child.is_alive():
            child.terminate()
            child.join(5)
        await victim.stop()
        if crowd is not None:
            await crowd.stop()
        health.stop()
        sampler.stop()
        server.stop()
        RESOURCES.servers.remove(server)


def _child_timeout(attack: str, args: argparse.Namespace) -> float:
    return {
        "burst": args.burst_timeout + 90,
        "half_frames": args.half_waves * 20 + args.seconds + 60,
        "ops_body": args.seconds + 240,
    }.get(attack, args.seconds + 60)


async def _greeting(port: int, doc: str, token: str, expected: int, timeout: float = 10.0) -> dict[str, Any]:
    """The awareness greeting a newcomer gets, once it holds every state the crowd announced (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        greeting = await asyncio.to_thread(attacks.awareness_greeting, "127.0.0.1", port, doc, token)
        if (greeting.get("entries") or 0) >= expected or time.monotonic() > deadline:
            return greeting
        await asyncio.sleep(0.2)


async def _settle(sampler: attacks.ProcessSampler, port: int, baseline: int, timeout: float = 40.0) -> dict[str, Any]:
    """After the half frames closed: until the server holds no more connections
    than before the attack, then until its RSS stops moving (1 s within 1 MiB)."""
    started = time.perf_counter()
    connections = sampler.connections(port)
    while connections > baseline and time.perf_counter() - started < timeout:
        await asyncio.sleep(0.1)
        connections = sampler.connections(port)
    back = time.perf_counter() - started
    recent: list[float] = []
    while time.perf_counter() - started < timeout:
        sample = sampler.now()
        if sample is None:
            break
        recent = (recent + [sample[1]])[-5:]
        if len(recent) == 5 and max(recent) - min(recent) < 1.0:
            break
        await asyncio.sleep(0.25)
    return {
        "connections_back_s": round(back, 2),
        "connections_now": connections,
        "connections_baseline": baseline,
        "rss_after_close_mib": round(recent[-1], 1) if recent else None,
        "settled_s": round(time.perf_counter() - started, 2),
    }


def _request_rss(events: list[dict[str, Any]], sampler: attacks.ProcessSampler, a0: float) -> list[dict[str, Any]]:
    """Peak RSS growth of the server during each ops request (50 ms samples)."""
    out = []
    start: dict[str, Any] | None = None
    for event in events:
        if event["event"] == "request_start":
            start = event
        elif event["event"] == "request_end" and start is not None:
            window = sampler.summary(a0 + start["at_s"], a0 + event["at_s"])
            if window:
                out.append(
                    {
                        "malformed": start.get("malformed"),
                        "size": start.get("size"),
                        "status": event.get("status"),
                        "rss_start_mib": window["rss_start_mib"],
                        "rss_max_mib": window["rss_max_mib"],
                        "growth_mib": round(window["rss_max_mib"] - window["rss_start_mib"], 1),
                    }
                )
            start = None
    return out


def _phase(
    victim: attacks.Victim,
    health: attacks.HealthProbe,
    sampler: attacks.ProcessSampler,
    name: str,
    start: float,
    end: float,
    logs_before: dict[str, int],
    logs_after: dict[str, int],
) -> dict[str, Any]:
    return {
        "seconds": round(end - start, 3),
        "victim": victim.summary(name, end),
        "healthz": health.summary(start, end),
        "server": sampler.summary(start, end),
        "log_lines": {p: logs_after[p] - logs_before[p] for p in LOG_PATTERNS},
    }


def _short(summary: dict[str, Any]) -> str:
    return (
        f"victim sent {summary['sent']}, undelivered {summary['undelivered']}, "
        f"p50 {_fmt(summary['p50_ms'])} p99 {_fmt(summary['p99_ms'])} max {_fmt(summary['max_ms'])} ms"
    )


# ---------------------------------------------------------------- the tables


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def _get(record: dict[str, Any], *path: Any) -> Any:
    value: Any = record
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


COMMON_ROWS = [
    ("victim updates sent", ("victim", "sent")),
    ("victim p50 ms", ("victim", "p50_ms")),
    ("victim p99 ms", ("victim", "p99_ms")),
    ("victim max ms", ("victim", "max_ms")),
    ("victim undelivered in phase", ("victim", "undelivered")),
    ("victim never delivered (+5 s)", ("victim", "never_delivered")),
    ("healthz probes", ("healthz", "probes")),
    ("healthz p99 ms", ("healthz", "p99_ms")),
    ("healthz max ms", ("healthz", "max_ms")),
    ("healthz failures (>5 s)", ("healthz", "failures")),
    ("server RSS start MiB", ("server", "rss_start_mib")),
    ("server RSS max MiB", ("server", "rss_max_mib")),
    ("server CPU s", ("server", "cpu_s")),
    ("server workers' CPU s", ("server", "children_cpu_s")),
    ("phase seconds", ("seconds",)),
]


def attack_rows(attack: str, record: dict[str, Any]) -> list[tuple[str, Any]]:
    """The attack's own figures (one value per tree)."""
    r = record.get("attack_result") or {}
    rows: list[tuple[str, Any]] = []
    if record.get("attack_failure"):
        rows.append(("attack FAILED", record["attack_failure"].strip().splitlines()[-1][:60]))
    if attack in ("ping", "ping_auth", "query_awareness"):
        rows += [
            ("attack connections", r.get("connections")),
            ("attack frames sent", r.get("frames_sent")),
            ("attack KiB sent", _kib(r.get("bytes_sent"))),
            ("attack MiB received", _mib(r.get("bytes_received"))),
            ("attack replies", r.get("replies")),
            ("attack sockets ended", r.get("ended")),
            ("attack handshakes refused", r.get("refused")),
        ]
        if attack == "query_awareness":
            rows[1:1] = [
                ("presence greeting KiB", _kib(_get(record, "presence", "greeting", "bytes"))),
                ("presence greeting entries", _get(record, "presence", "greeting", "entries")),
            ]
            rows += [
                (f"query rounds of {r.get('queries_per_round')}", r.get("rounds")),
                ("amplification (recv/sent)", r.get("amplification")),
            ]
        else:
            rows.insert(2, ("attack frames/s", r.get("frames_per_second")))
    elif attack == "half_frames":
        waves = [e for e in record.get("events", []) if e["event"] == "wave"]
        rows.append(("RSS at attack start MiB", _get(record, "phases", "attack", "server", "rss_start_mib")))
        for wave in waves:
            rows.append((f"RSS after wave {wave['wave']} MiB", wave.get("rss_mib")))
            rows.append((f"  server connections after wave {wave['wave']}", wave.get("server_connections")))
            rows.append((f"  wave {wave['wave']} MiB sent, s", f"{wave.get('sent_mib')} @{wave.get('seconds')}"))
        rows += [
            ("server connections before", record.get("server_connections_baseline")),
            ("RSS after close+settle MiB", _get(record, "after", "rss_after_close_mib")),
            ("connections back after s", _get(record, "after", "connections_back_s")),
            ("sockets sent all payload", f"{r.get('sent_all')}/{r.get('sockets')}" if r else None),
            ("/ws sockets ended", _get(r, "ended_by_path", "/ws")),
            ("/yws sockets ended", _get(r, "ended_by_path", "/yws")),
        ]
    elif attack == "ops_body":
        kinds: dict[str, list[dict[str, Any]]] = {}
        for request in r.get("requests", []):
            kinds.setdefault(request["kind"], []).append(request)
        growth = record.get("ops_requests_rss") or []
        for index, request in enumerate(r.get("requests", [])[:3]):
            peak = growth[index]["growth_mib"] if index < len(growth) else None
            rows.append((f"{request['kind']}: status", request.get("status")))
            rows.append(
                (
                    f"{request['kind']}: s, MiB sent first",
                    f"{request.get('seconds')}, {_mib(request.get('body_bytes_sent'))}",
                )
            )
            top = growth[index]["rss_max_mib"] if index < len(growth) else None
            rows.append((f"{request['kind']}: RSS growth (peak) MiB", None if peak is None else f"{peak} ({top})"))
        rows.append(("ops requests made", len(r.get("requests", []))))
        rows.append(("ops statuses", {k: _fmt(v) for k, v in (r.get("statuses") or {}).items()}))
    elif attack == "burst":
        rows += [
            ("burst seconds to all stored", r.get("seconds")),
            ("burst all stored", r.get("all_stored")),
            ("burst update frames sent", r.get("update_frames_sent")),
            ("burst acked total", r.get("acked_total")),
            ("burst resyncs", r.get("resyncs")),
            ("burst errors", r.get("errors")),
            ("burst doc characters (of %s)" % (3 * (r.get("updates_per_client") or 0)), r.get("document_characters")),
        ]
    rows.append(
        (
            "victim errors (quiet/attack)",
            f"{_fmt(_get(record, 'phases', 'quiet', 'victim', 'errors'))} / "
            f"{_fmt(_get(record, 'phases', 'attack', 'victim', 'errors'))}",
        )
    )
    rows.append(("victim reconnects", record.get("victim_reconnects") or None))
    rows.append(
        (
            "log lines, whole server run",
            {p.strip(): n for p, n in (record.get("log_lines_total") or {}).items() if n}
            or (None if record.get("log_lines_total") is None else "none"),
        )
    )
    return rows


def _mib(value: Any) -> Any:
    return None if value is None else round(value / MiB, 1)


def _kib(value: Any) -> Any:
    return None if value is None else round(value / 1024, 1)


def print_tables(results: dict[str, dict[str, Any]], trees: list[str], attacks_run: list[str], seconds: float) -> None:
    width, col = 36, 12
    for attack in attacks_run:
        records = {tree: results.get(tree, {}).get(attack) for tree in trees}
        print()
        print(f"== {attack} ({seconds:g} s phases) ".ljust(width + len(trees) * 2 * col, "="))
        print(" " * width + "".join(f"{tree[: 2 * col - 2]:>{2 * col}}" for tree in trees))
        print(" " * width + "".join(f"{'quiet':>{col}}{'attack':>{col}}" for _ in trees))
        for label, path in COMMON_ROWS + [(f"log lines {p.strip()!r}", ("log_lines", p)) for p in LOG_PATTERNS]:
            cells = []
            for tree in trees:
                record = records[tree] or {}
                for phase in ("quiet", "attack"):
                    cells.append(_fmt(_get(record, "phases", phase, *path)))
            print(f"{label:<{width}}" + "".join(f"{cell:>{col}}" for cell in cells))
        extra: dict[str, dict[str, Any]] = {}
        order: list[str] = []
        for tree in trees:
            for label, value in attack_rows(attack, records[tree] or {}):
                if label not in extra:
                    extra[label] = {}
                    order.append(label)
                extra[label][tree] = value
        long_rows = []
        for label in order:
            cells = [_fmt(extra[label].get(tree)) for tree in trees]
            if all(len(cell) <= 2 * col - 1 for cell in cells):
                print(f"{label:<{width}}" + "".join(f"{cell:>{2 * col}}" for cell in cells))
            else:
                long_rows.append((label, cells))
        for label, cells in long_rows:
            print(f"{label}:")
            for tree, cell in zip(trees, cells, strict=True):
                print(f"    {tree}: {cell}")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tree",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a checkout to serve (repeatable; columns in this order)",
    )
    parser.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma-separated, of {', '.join(ATTACKS)}")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the quiet phase and of each flood")
    parser.add_argument("--json", type=Path, help="write every raw figure here")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="[TREE:]KEY=VALUE",
        help="extra server environment, for every tree or (TREE:) one",
    )
    parser.add_argument(
        "--workdir", type=Path, help="servers' logs and data (default: a new temporary directory, kept)"
    )
    parser.add_argument("--queries", type=int, default=2000, help="query-awareness messages per round")
    parser.add_argument(
        "--query-quiet",
        type=float,
        default=1.0,
        help="next query round once no answer came for this long (0: at once, a flood)",
    )
    parser.add_argument(
        "--presence-bytes", type=int, default=237 * 1024, help="presence states on the queried document"
    )
    parser.add_argument("--half-waves", type=int, default=3)
    parser.add_argument("--half-sockets", type=int, default=64, help="sockets per wave")
    parser.add_argument("--half-declared-mib", type=int, default=16)
    parser.add_argument("--half-payload-mib", type=int, default=8)
    parser.add_argument("--ops-body-mib", type=int, default=128)
    parser.add_argument("--burst-updates", type=int, default=1000, help="updates per client (3 clients)")
    parser.add_argument("--burst-timeout", type=float, default=60.0)
    parser.add_argument(
        "--log-pattern", action="append", default=[], help="also count server log lines containing this (repeatable)"
    )
    args = parser.parse_args(argv)
    args.attack_list = [a.strip() for a in args.attacks.split(",") if a.strip()]
    unknown = [a for a in args.attack_list if a not in ATTACKS]
    if unknown:
        parser.error(f"unknown attacks {unknown}; known: {', '.join(ATTACKS)}")
    trees = []
    for spec in args.tree:
        name, sep, path = spec.partition("=")
        if not sep or not name or not Path(path).is_dir():
            parser.error(f"--tree {spec!r}: expected NAME=PATH of a directory")
        trees.append((name, Path(path)))
    if len({name for name, _ in trees}) != len(trees):
        parser.error("tree names must differ")
    args.trees = trees
    env: dict[str, dict[str, str]] = {name: {} for name, _ in trees}
    for spec in args.env:
        key, sep, value = spec.partition("=")
        if not sep:
            parser.error(f"--env {spec!r}: expected [TREE:]KEY=VALUE")
        tree, colon, bare = key.partition(":")
        targets = [tree] if colon else list(env)
        if colon and tree not in env:
            parser.error(f"--env {spec!r}: no tree named {tree!r}")
        for target in targets:
            env[target][bare if colon else key] = value
    args.tree_env = env
    return args


def _open_file_room(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


async def main_async(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    trees = [Tree(name, path, args.tree_env[name], workdir) for name, path in args.trees]
    for tree in trees:
        tree.check()
        progress(
            f"tree {tree.name}: {tree.path} (commit {tree.info['commit']}, "
            f"{tree.info['uncommitted_yrelay_files']} uncommitted files under yrelay/, imports {tree.info['imports']})"
            + ("" if tree.info["static"] else "; no yrelay/app/static (built client missing)")
        )
        tree.start_redis()
        assert tree.redis is not None
        progress(f"tree {tree.name}: redis-server on {tree.redis.url}")
    results: dict[str, dict[str, Any]] = {tree.name: {} for tree in trees}
    output: dict[str, Any] = {
        "meta": {
            "argv": sys.argv,
            "seconds": args.seconds,
            "attacks": args.attack_list,
            "trees": {tree.name: tree.info for tree in trees},
            "env": args.tree_env,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "workdir": str(workdir),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "results": results,
    }
    for attack in args.attack_list:
        for tree in trees:
            progress(f"{tree.name}/{attack}: starting (load average {os.getloadavg()[0]:.2f})")
            try:
                results[tree.name][attack] = await run_one(tree, attack, args)
            except Exception:  # noqa: BLE001 - one failed run is a figure too; the others go on
                results[tree.name][attack] = {"error": traceback.format_exc()}
                progress(f"{tree.name}/{attack}: ERROR {traceback.format_exc().strip().splitlines()[-1]}")
            if args.json:
                args.json.write_text(json.dumps(output, indent=1, default=str))
    output["meta"]["seconds_total"] = round(time.monotonic() - STARTED, 1)
    return output


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    LOG_PATTERNS.extend(p for p in args.log_pattern if p not in LOG_PATTERNS)
    _open_file_room(4096)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="attack-probe-"))
    workdir.mkdir(parents=True, exist_ok=True)
    progress(f"work directory (server logs) {workdir}")

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    output: dict[str, Any] | None = None
    try:
        output = asyncio.run(main_async(args, workdir))
    except KeyboardInterrupt:
        progress("interrupted: stopping servers and Redis")
        return 130
    finally:
        RESOURCES.stop_all()
    print_tables(output["results"], [name for name, _ in args.trees], args.attack_list, args.seconds)
    for tree, records in output["results"].items():
        for attack, record in records.items():
            if "error" in record:
                print(f"\n{tree}/{attack} could not run:\n{record['error']}")
    if args.json:
        args.json.write_text(json.dumps(output, indent=1, default=str))
        progress(f"raw figures in {args.json}")
    progress(f"total {output['meta']['seconds_total']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

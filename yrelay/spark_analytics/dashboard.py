"""One self-contained HTML page over the tables ``yrelay analyze`` wrote.

It is written for the on-call engineer woken by a "clients lagging" alert,
so it reads top to bottom in the order of their questions: how bad is it
now (headline figures: sessions by status, the worst lag, p99 ack latency
over the last 5 minutes, documents with blocked updates, consumer groups
behind), who (every session not OK, worst first, with its document,
subject, status, lag, last ack and last problem), since when (the lag of
those sessions over time, sampled at every bucket whether they acked or
not), and then the background (statuses, ack latency, evictions, resends
and resyncs over time, hottest documents, the full figures). Every table
and axis has a human label and its unit.

It reads the Parquet tables with pandas (no Spark: the tables it needs are
small, or filtered to the chosen sessions while reading), and inlines
plotly.js once, so the page opens from ``file://`` on a machine with no
network and no server.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, SupportsInt

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from yrelay.spark_analytics.tables import SEVERITY, STATUS_LABELS, Status, Table

DASHBOARD = "dashboard.html"
#: Sessions drawn in the lag chart (the worst ones not OK; more is unreadable).
LAG_LINES = 10
STATUS_COLOURS = {
    Status.OK: "#2e7d32",
    Status.WARN: "#f9a825",
    Status.STALL: "#ef6c00",
    Status.STOP: "#6d4c41",
    Status.REWIND: "#6a1b9a",
    Status.ERR: "#c62828",
    Status.LEFT: "#90a4ae",
    Status.LEFT_UNACKED: "#546e7a",
}
#: Statuses listed as "not OK": everything but OK and a clean LEFT.
TROUBLED = [status for status in SEVERITY if status not in (Status.OK, Status.LEFT)]
_CONFIG = {"displaylogo": False, "responsive": True}

#: Human column titles (with units) of the tables shown; a column named in
#: plain words (``session``, ``acks``) is its own title.
LABELS = {
    "rank": "#",
    "doc": "document",
    "current_lag_entries": "lag now (entries)",
    "current_lag_s": "lag now (s)",
    "last_ack": "last ack (UTC)",
    "last_problem": "last problem",
    "left": "left at (UTC)",
    "lag_entries": "lag at last ack (entries)",
    "lag_s": "lag at last ack (s)",
    "appends_per_s": "appends/s",
    "bytes_per_s": "bytes/s",
    "resend_ratio": "resends per delivery",
    "trim_efficiency": "trimmed per append",
    "stream_length": "stream length (entries, est.)",
    "lag_ms": "lag (ms)",
}
#: The summary's figures, titled (a figure named in plain words, ``appends``,
#: is its own title); times and durations are formatted by their suffix.
SUMMARY_LABELS = {
    "start_ts": "log starts (UTC)",
    "end_ts": "log ends (UTC)",
    "span_s": "span (s)",
    "bucket_s": "chart bucket (s)",
    "events": "events read",
    "corrupt_lines": "corrupt lines skipped",
    "other_version_lines": "lines of an unknown schema version skipped",
    "dropped_events": "events the servers lost (dropped)",
    "bytes": "bytes appended",
    "acked_deliveries": "deliveries acked",
    "resend_ratio": "resends per delivery",
    "trimmed": "entries trimmed",
    "trim_efficiency": "trimmed per append",
    "sessions": "sessions (document x session)",
    "sessions_connected": "sessions connected at the end",
    "p50_ms": "ack latency p50 (ms)",
    "p95_ms": "ack latency p95 (ms)",
    "p99_ms": "ack latency p99 (ms)",
    "max_ms": "ack latency max (ms)",
    "p99_last_5min_ms": "ack latency p99, last 5 min (ms)",
    "worst_lag_entries": "worst lag now (entries)",
    "worst_lag_ms": "worst lag now (ms)",
    "blocked_documents": "documents with refused (blocked) updates",
    "consumer_groups": "consumer groups",
    "groups_behind": "consumer groups behind",
    "worst_group_lag_ms": "worst consumer group lag (ms)",
    **{f"status_{status.value.lower()}": f"sessions {status.value}" for status in Status},
}


def read_table(out_dir: Path, table: Table, **filters: list[str]) -> pd.DataFrame:
    """A written table as pandas (empty when the job did not write it)."""
    path = Path(out_dir) / table.value
    if not path.exists():
        return pd.DataFrame()
    where = [(column, "in", values) for column, values in filters.items()] or None
    return pd.read_parquet(path, filters=where)


def render(out_dir: Path) -> Path:
    """Write ``out_dir/dashboard.html`` from the tables under ``out_dir``; return its path."""
    out_dir = Path(out_dir)
    summary = read_table(out_dir, Table.SUMMARY)
    row = summary.iloc[0].to_dict() if not summary.empty else {}
    status = read_table(out_dir, Table.STATUS)
    troubled = troubled_sessions(status)
    bucket = f"{_number(row.get('bucket_s'))} s"
    sections = [
        _headline(row),
        _table_section(f"Sessions not OK ({len(troubled)}), worst first", troubled, _TROUBLED_COLUMNS, "troubled"),
        _figure_html(lag_figure(out_dir, troubled, bucket), "chart-lag"),
        _figure_html(status_figure(status), "chart-status"),
        _figure_html(latency_figure(read_table(out_dir, Table.LATENCY_HISTOGRAM), row), "chart-latency"),
        _figure_html(activity_figure(read_table(out_dir, Table.EVENTS_OVER_TIME), bucket), "chart-activity"),
        _figure_html(hottest_figure(read_table(out_dir, Table.HOTTEST_DOCUMENTS)), "chart-hottest"),
        _table_section(
            "Top lagging sessions (connected, lag at the end of the log)",
            _with_lag_seconds(read_table(out_dir, Table.TOP_LAGGING)),
            _TOP_LAGGING_COLUMNS,
            "top",
        ),
        _table_section("Hottest documents", read_table(out_dir, Table.HOTTEST_DOCUMENTS), _HOTTEST_COLUMNS, "hottest"),
    ]
    current = read_table(out_dir, Table.CURRENT_LAG)
    if not current.empty:
        worst = current.sort_values(["lag_ms", "lag_entries"], ascending=False).head(20)
        sections.append(
            _table_section(
                "Lag now, from Redis (the 20 worst tracked sessions)",
                worst,
                ["doc", "session", "offset", "lag_entries", "lag_ms"],
                "redis",
            )
        )
    sections.append(_summary_section(summary))
    path = out_dir / DASHBOARD
    path.write_text(_page(row, sections), encoding="utf-8")
    return path


def troubled_sessions(status: pd.DataFrame) -> pd.DataFrame:
    """Sessions not OK (nor cleanly left), worst status first, then the
    longest lag; with display columns (lag in s, last ack and left as UTC)."""
    if status.empty:
        return status
    bad = status[status["status"].isin([str(s) for s in TROUBLED])].copy()
    bad["severity"] = bad["status"].map({str(s): rank for rank, s in enumerate(SEVERITY)})
    bad = bad.sort_values(
        ["severity", "current_lag_ms", "current_lag_entries", "doc", "session"],
        ascending=[True, False, False, True, True],
        na_position="last",
    )
    bad["last_ack"] = [_time(value) for value in bad["last_ack_ts"]]
    bad["left"] = [_time(value) for value in bad["left_ts"]]
    return _with_lag_seconds(bad)


def _with_lag_seconds(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    frame = frame.copy()
    frame["current_lag_s"] = frame["current_lag_ms"] / 1000
    frame["lag_s"] = frame["lag_ms"] / 1000
    return frame


# ------------------------------------------------------------------ figures


def lag_figure(out_dir: Path, troubled: pd.DataFrame, bucket: str) -> go.Figure:
    """Lag (s and entries) at the end of every bucket of the worst sessions
    not OK, acking or not (the ``lag_timeline`` table)."""
    figure = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1, subplot_titles=("lag (seconds)", "lag (entries)")
    )
    chosen = troubled.head(LAG_LINES) if not troubled.empty else troubled
    if not chosen.empty:
        lag = read_table(out_dir, Table.LAG_TIMELINE, session=sorted(set(chosen["session"])))
        for doc, session, subject, status in zip(
            chosen["doc"], chosen["session"], chosen["subject"], chosen["status"], strict=True
        ):
            line = lag[(lag["doc"] == doc) & (lag["session"] == session)].sort_values("bucket")
            name = f"{doc} / {_who(subject, session)} ({status})"
            for row, values in enumerate((line["lag_ms"] / 1000, line["lag_entries"]), 1):
                trace = go.Scatter(
                    x=line["bucket"], y=values, name=name, legendgroup=name, mode="lines+markers", showlegend=row == 1
                )
                figure.add_trace(trace, row=row, col=1)
    figure.update_yaxes(title_text="s", row=1, col=1)
    figure.update_yaxes(title_text="entries", row=2, col=1)
    figure.update_xaxes(title_text="time (UTC)", row=2, col=1)
    title = (
        f"Lag over time of the {len(chosen)} worst sessions not OK (at the end of every {bucket} bucket)"
        if len(chosen)
        else "Lag over time: every session is OK"
    )
    return _titled(figure, title, height=560)


def status_figure(status: pd.DataFrame) -> go.Figure:
    counts = status["status"].value_counts() if not status.empty else pd.Series(dtype=int)
    bar = go.Bar(
        x=[STATUS_LABELS[s] for s in SEVERITY],
        y=[int(counts.get(s.value, 0)) for s in SEVERITY],
        marker_color=[STATUS_COLOURS[s] for s in SEVERITY],
    )
    figure = go.Figure(bar)
    figure.update_yaxes(title_text="sessions (document x session)")
    return _titled(figure, "Sessions by status at the end of the log")


def latency_figure(histogram: pd.DataFrame, summary: dict[str, Any]) -> go.Figure:
    ordered = histogram.sort_values("bin_ms") if not histogram.empty else histogram
    labels = [f">= {int(edge):,} ms" for edge in ordered.get("bin_ms", [])]
    figure = go.Figure(go.Bar(x=labels, y=list(ordered.get("deliveries", [])), marker_color="#1565c0"))
    figure.update_xaxes(title_text="time from delivery to the ack that covers it")
    figure.update_yaxes(title_text="deliveries")
    title = "Ack latency over the whole log"
    if summary:
        title += "".join(f", {p} {_number(summary.get(f'{p}_ms'))} ms" for p in ("p50", "p95", "p99"))
    return _titled(figure, title)


def activity_figure(events: pd.DataFrame, bucket: str) -> go.Figure:
    figure = go.Figure()
    for kind, name in (("evict", "evictions"), ("resend", "resends"), ("resync", "resyncs")):
        rows = events[events["type"] == kind].sort_values("bucket") if not events.empty else events
        figure.add_trace(
            go.Scatter(x=rows.get("bucket", []), y=rows.get("events", []), name=name, mode="lines+markers")
        )
    figure.update_xaxes(title_text="time (UTC)")
    figure.update_yaxes(title_text=f"events per {bucket}")
    return _titled(figure, "Evictions, resends and resyncs over time")


def hottest_figure(hottest: pd.DataFrame) -> go.Figure:
    figure = go.Figure(
        go.Bar(x=list(hottest.get("doc", [])), y=list(hottest.get("appends_per_s", [])), marker_color="#00838f")
    )
    figure.update_xaxes(title_text="document")
    figure.update_yaxes(title_text="appends/s (over the log's span)")
    return _titled(figure, "Hottest documents")


def _titled(figure: go.Figure, title: str, height: int = 420) -> go.Figure:
    figure.update_layout(
        title=title, template="plotly_white", height=height, margin={"t": 60, "l": 60, "r": 20, "b": 50}
    )
    return figure


# --------------------------------------------------------------------- page

_TROUBLED_COLUMNS = [
    "doc",
    "subject",
    "session",
    "status",
    "current_lag_entries",
    "current_lag_s",
    "last_ack",
    "last_problem",
    "left",
    "acks",
]
_TOP_LAGGING_COLUMNS = [
    "rank",
    "doc",
    "subject",
    "session",
    "status",
    "current_lag_entries",
    "current_lag_s",
    "lag_entries",
    "lag_s",
    "acks",
    "last_problem",
]
_HOTTEST_COLUMNS = [
    "rank",
    "doc",
    "appends",
    "appends_per_s",
    "bytes_per_s",
    "deliveries",
    "resend_ratio",
    "evictions",
    "resyncs",
    "trim_efficiency",
    "stream_length",
]


def _number(value: object) -> str:
    """A cell: thousands separated, at most 3 decimals, "-" for missing."""
    if isinstance(value, str):
        return value
    if value is None or pd.isna(value):
        return "-"
    return f"{value:,.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else f"{value:,}"


def _time(value: SupportsInt | None) -> str:
    """ms since the epoch as a UTC time, "-" for missing (None or NaN)."""
    if value is None or pd.isna(value):
        return "-"
    when: str = pd.Timestamp(int(value), unit="ms", tz="UTC").strftime("%Y-%m-%dT%H:%M:%S.%f")
    return when[:-3] + "Z"


def _who(subject: object, session: str) -> str:
    return session if subject is None or pd.isna(subject) else f"{subject} [{session}]"


def _figure_html(figure: go.Figure, div_id: str) -> str:
    div: str = pio.to_html(figure, full_html=False, include_plotlyjs=False, div_id=div_id, config=_CONFIG)
    return "<section>" + div + "</section>"


def _table_section(title: str, frame: pd.DataFrame, columns: list[str], name: str) -> str:
    shown = frame[[c for c in columns if c in frame.columns]] if not frame.empty else frame
    if shown.empty:
        body = "<p class='none'>none</p>"
    else:
        header = "".join(f"<th>{html.escape(LABELS.get(c, c))}</th>" for c in shown.columns)
        rows = "".join(
            "<tr>" + "".join(_cell(c, v) for c, v in zip(shown.columns, record, strict=True)) + "</tr>"
            for record in shown.itertuples(index=False)
        )
        body = f"<table id='{name}'><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>"
    return f"<section><h2>{html.escape(title)}</h2>{body}</section>"


def _cell(column: str, value: object) -> str:
    if column == "status" and isinstance(value, str) and value in Status.__members__.values():
        colour = STATUS_COLOURS[Status(value)]
        return (
            f"<td class='status' title='{html.escape(STATUS_LABELS[Status(value)])}'>"
            f"<span style='background:{colour}'>{html.escape(value)}</span></td>"
        )
    return f"<td>{html.escape(_number(value))}</td>"


def _headline(row: dict[str, Any]) -> str:
    """The figures to read first, as cards (red when they call for action)."""
    if not row:
        return "<section class='headline'><p>no summary table</p></section>"
    shown = [(s, row.get(f"status_{s.value.lower()}", 0)) for s in SEVERITY]
    counts = " ".join(
        f"<span class='pill' style='background:{STATUS_COLOURS[s]}'>{s.value} {int(n)}</span>" for s, n in shown if n
    )
    troubled = sum(int(row.get(f"status_{s.value.lower()}", 0)) for s in TROUBLED)
    worst_s = (row.get("worst_lag_ms") or 0) / 1000
    cards = [
        ("Sessions by status now", counts or "none", troubled > 0),
        (
            "Worst lag now (connected sessions)",
            f"{_number(row.get('worst_lag_entries'))} entries / {_number(worst_s)} s",
            worst_s > 0,
        ),
        ("Ack latency p99, last 5 minutes", f"{_number(row.get('p99_last_5min_ms'))} ms", False),
        ("Documents with blocked updates", _number(row.get("blocked_documents")), bool(row.get("blocked_documents"))),
        (
            "Consumer groups behind",
            f"{_number(row.get('groups_behind'))} of {_number(row.get('consumer_groups'))}",
            bool(row.get("groups_behind")),
        ),
    ]
    if row.get("dropped_events") or row.get("corrupt_lines") or row.get("other_version_lines"):
        cards.append(
            (
                "Log gaps",
                f"{_number(row.get('dropped_events'))} events lost, "
                f"{_number(row.get('corrupt_lines'))} corrupt and "
                f"{_number(row.get('other_version_lines'))} unknown-version lines skipped",
                True,
            )
        )
    body = "".join(
        f"<div class='card{' alert' if alert else ''}'><h3>{html.escape(title)}</h3><p>{value}</p></div>"
        for title, value, alert in cards
    )
    return f"<section class='headline' id='headline'>{body}</section>"


def _summary_section(summary: pd.DataFrame) -> str:
    if summary.empty:
        return "<section><h2>All figures</h2><p>no summary table</p></section>"
    row = summary.iloc[0]
    cells = "".join(
        f"<tr><th>{html.escape(SUMMARY_LABELS.get(name, name))}</th>"
        f"<td>{_time(row[name]) if name.endswith('_ts') else _number(row[name])}</td></tr>"
        for name in summary.columns
    )
    return f"<section><h2>All figures of the log</h2><table class='summary' id='summary'>{cells}</table></section>"


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
section { margin-bottom: 2em; }
.headline { display: flex; flex-wrap: wrap; gap: 1em; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 1em; min-width: 14em; }
.card h3 { margin: 0 0 0.3em; font-size: 0.85em; font-weight: normal; color: #555; }
.card p { margin: 0; font-size: 1.3em; }
.card.alert { border-color: #c62828; background: #fff5f5; }
.pill, td.status span { color: #fff; border-radius: 3px; padding: 0 0.4em; font-size: 0.85em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 0.25em 0.75em; text-align: right; border-bottom: 1px solid #ddd; }
th { background: #f5f5f5; }
table.summary th { text-align: left; }
"""


def _page(row: dict[str, Any], sections: list[str]) -> str:
    span = ""
    if row:
        start, end = _time(row.get("start_ts")), _time(row.get("end_ts"))
        span = f" <small>{start} to {end} ({_number(row.get('span_s'))} s)</small>"
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>yrelay: lag and delivery</title>"
        f"<style>{_STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
        f"<body><h1>yrelay: lag and delivery{span}</h1>" + "".join(sections) + "</body></html>"
    )

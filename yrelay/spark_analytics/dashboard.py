"""One self-contained HTML page over the tables ``yrelay analyze`` wrote.

It reads the Parquet tables with pandas (no Spark: the tables it needs are
small, or filtered to the top sessions while reading), and inlines
plotly.js once, so the page opens from ``file://`` on a machine with no
network and no server. Charts: lag over time of the top lagging sessions,
statuses, the ack latency distribution, evictions/resends/resyncs over
time, the hottest documents; tables: the summary, every session that is not
OK (so one that never acked, absent from the lag charts, is named too) and
the top-N lists.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from .tables import Status, Table

DASHBOARD = "dashboard.html"
#: Sessions drawn in the lag chart (the most lagging ones; more is unreadable).
LAG_LINES = 10
STATUS_COLOURS = {
    Status.OK: "#2e7d32", Status.WARN: "#f9a825", Status.STALL: "#ef6c00",
    Status.STOP: "#6d4c41", Status.REWIND: "#6a1b9a", Status.ERR: "#c62828",
}
_CONFIG = {"displaylogo": False, "responsive": True}


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
    top = read_table(out_dir, Table.TOP_LAGGING)
    summary = read_table(out_dir, Table.SUMMARY)
    status = read_table(out_dir, Table.STATUS)
    figures = [
        lag_figure(out_dir, top),
        status_figure(status),
        latency_figure(read_table(out_dir, Table.LATENCY_HISTOGRAM), summary),
        activity_figure(read_table(out_dir, Table.EVENTS_OVER_TIME)),
        hottest_figure(read_table(out_dir, Table.HOTTEST_DOCUMENTS)),
    ]
    sections = [_summary_section(summary), *(_figure_html(figure, i) for i, figure in enumerate(figures)),
                _not_ok_section(status),
                _table_section("Top lagging sessions (end of the log)", top, _TOP_LAGGING_COLUMNS),
                _table_section("Hottest documents", read_table(out_dir, Table.HOTTEST_DOCUMENTS), _HOTTEST_COLUMNS)]
    current = read_table(out_dir, Table.CURRENT_LAG)
    if not current.empty:
        worst = current.sort_values(["lag_ms", "lag_entries"], ascending=False).head(len(top) or 20)
        sections.append(_table_section("Current lag (Redis, now)", worst, list(worst.columns)))
    path = out_dir / DASHBOARD
    path.write_text(_page(sections), encoding="utf-8")
    return path


# ------------------------------------------------------------------ figures


def lag_figure(out_dir: Path, top: pd.DataFrame) -> go.Figure:
    """Lag (ms and entries) over time of the most lagging sessions."""
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                           subplot_titles=("lag (ms)", "lag (entries)"))
    chosen = top.head(LAG_LINES)
    if not chosen.empty:
        lag = read_table(out_dir, Table.LAG_OVER_TIME, session=sorted(set(chosen["session"])))
        for doc, session in zip(chosen["doc"], chosen["session"]):
            line = lag[(lag["doc"] == doc) & (lag["session"] == session)].sort_values("bucket")
            name = f"{doc} / {session}"
            figure.add_trace(go.Scatter(x=line["bucket"], y=line["lag_ms"], name=name, legendgroup=name,
                                        mode="lines+markers"), row=1, col=1)
            figure.add_trace(go.Scatter(x=line["bucket"], y=line["lag_entries"], name=name, legendgroup=name,
                                        mode="lines+markers", showlegend=False), row=2, col=1)
    return _titled(figure, f"Lag over time: the {len(chosen)} most lagging sessions (last ack per bucket)")


def status_figure(status: pd.DataFrame) -> go.Figure:
    counts = status["status"].value_counts() if not status.empty else pd.Series(dtype=int)
    names = [s.value for s in Status]
    bar = go.Bar(x=names, y=[int(counts.get(name, 0)) for name in names],
                 marker_color=[STATUS_COLOURS[Status(name)] for name in names])
    return _titled(go.Figure(bar), "Sessions by status (document and session, end of the log)")


def latency_figure(histogram: pd.DataFrame, summary: pd.DataFrame) -> go.Figure:
    ordered = histogram.sort_values("bin_ms") if not histogram.empty else histogram
    labels = [f">= {int(edge):,} ms" for edge in ordered.get("bin_ms", [])]
    figure = go.Figure(go.Bar(x=labels, y=list(ordered.get("deliveries", [])), marker_color="#1565c0"))
    title = "Ack latency (deliver -> covering ack)"
    if not summary.empty:
        row = summary.iloc[0]
        title += "".join(f", {p} {_number(row[f'{p}_ms'])} ms" for p in ("p50", "p95", "p99"))
    return _titled(figure, title)


def activity_figure(events: pd.DataFrame) -> go.Figure:
    figure = go.Figure()
    for kind in ("evict", "resend", "resync"):
        rows = events[events["type"] == kind].sort_values("bucket") if not events.empty else events
        figure.add_trace(go.Scatter(x=rows.get("bucket", []), y=rows.get("events", []), name=kind,
                                    mode="lines+markers"))
    return _titled(figure, "Evictions, resends and resyncs over time (events per bucket)")


def hottest_figure(hottest: pd.DataFrame) -> go.Figure:
    figure = go.Figure(go.Bar(x=list(hottest.get("doc", [])), y=list(hottest.get("appends_per_s", [])),
                              marker_color="#00838f"))
    return _titled(figure, "Hottest documents (appends/s over the log)")


def _titled(figure: go.Figure, title: str) -> go.Figure:
    figure.update_layout(title=title, template="plotly_white", height=420, margin={"t": 60, "l": 60, "r": 20, "b": 50})
    return figure


# --------------------------------------------------------------------- page

_TOP_LAGGING_COLUMNS = ["rank", "doc", "session", "status", "current_lag_ms", "current_lag_entries", "lag_ms",
                        "lag_entries", "acks", "last_problem"]
_NOT_OK_COLUMNS = ["doc", "session", "status", "current_lag_ms", "current_lag_entries", "acks", "last_ack_ts",
                   "last_problem"]
#: Worst first: failed, then silent, then stuck, then merely behind.
_SEVERITY = [Status.ERR, Status.STOP, Status.STALL, Status.REWIND, Status.WARN]
_HOTTEST_COLUMNS = ["rank", "doc", "appends", "appends_per_s", "bytes_per_s", "deliveries", "resend_ratio",
                    "evictions", "resyncs", "trim_efficiency", "stream_length"]


def _number(value: object) -> str:
    """A cell: thousands separated, at most 3 decimals, "-" for missing."""
    if isinstance(value, str):
        return value
    if value is None or pd.isna(value):
        return "-"
    return f"{value:,.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else f"{value:,}"


def _summary_value(name: str, value: object) -> str:
    """Times (``*_ts``, ms since the epoch) as UTC dates, the rest as numbers."""
    if name.endswith("_ts") and value is not None and not pd.isna(value):
        return pd.Timestamp(int(value), unit="ms", tz="UTC").isoformat(timespec="milliseconds")
    return _number(value)


def _figure_html(figure: go.Figure, index: int) -> str:
    return "<section>" + pio.to_html(figure, full_html=False, include_plotlyjs=False, div_id=f"chart-{index}",
                                     config=_CONFIG) + "</section>"


def _table_section(title: str, frame: pd.DataFrame, columns: list[str]) -> str:
    shown = frame[[c for c in columns if c in frame.columns]] if not frame.empty else frame
    body = shown.map(_number).to_html(index=False, border=0) if not shown.empty else "<p>none</p>"
    return f"<section><h2>{html.escape(title)}</h2>{body}</section>"


def _not_ok_section(status: pd.DataFrame) -> str:
    """Every session whose status is not OK, worst first, with its lag and
    last ack (a session that never acked has no lag figures: "-")."""
    bad = status[status["status"] != str(Status.OK)].copy() if not status.empty else status
    if not bad.empty:
        bad["severity"] = bad["status"].map({str(s): rank for rank, s in enumerate(_SEVERITY)})
        bad = bad.sort_values(["severity", "current_lag_ms", "doc", "session"], ascending=[True, False, True, True],
                              na_position="first")
        bad["last_ack_ts"] = [_summary_value("last_ack_ts", value) for value in bad["last_ack_ts"]]
    return _table_section(f"Sessions not OK ({len(bad)})", bad, _NOT_OK_COLUMNS)


def _summary_section(summary: pd.DataFrame) -> str:
    if summary.empty:
        return "<section><h2>Summary</h2><p>no summary table</p></section>"
    row = summary.iloc[0]
    cells = "".join(f"<tr><th>{html.escape(str(name))}</th><td>{_summary_value(name, row[name])}</td></tr>"
                    for name in summary.columns)
    return f"<section><h2>Summary</h2><table class='summary'>{cells}</table></section>"


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
section { margin-bottom: 2em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 0.25em 0.75em; text-align: right; border-bottom: 1px solid #ddd; }
th { background: #f5f5f5; }
table.summary th { text-align: left; }
"""


def _page(sections: list[str]) -> str:
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>yrelay analytics</title>"
        f"<style>{_STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
        "<body><h1>yrelay analytics</h1>" + "".join(sections) + "</body></html>"
    )

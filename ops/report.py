"""The metrics report for people: one self-contained HTML file (plots as embedded PNG).

Plots are drawn with matplotlib's Agg backend (no display needed) and embedded as
base64 data URIs, so the file can be mailed or opened from anywhere. Every number in it
comes from the metrics JSON document (ops/metrics.py); nothing is computed here but
layout.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

COLORS = {"done": "#2e7d32", "failed": "#c62828", "other": "#90a4ae", "accent": "#1565c0"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1100px;color:#1c2330;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{margin-top:2.2rem;border-bottom:1px solid #dde3ea;
padding-bottom:.3rem;font-size:1.2rem}.muted{color:#5f6b7a}
.cards{display:flex;flex-wrap:wrap;gap:.8rem;margin:1rem 0}
.card{border:1px solid #dde3ea;border-radius:8px;padding:.6rem 1rem;min-width:120px}
.card b{display:block;font-size:1.35rem}
table{border-collapse:collapse;margin:.6rem 0;width:100%;font-size:13px}
th,td{padding:.25rem .6rem;border-bottom:1px solid #eef1f5;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f5f7fa}
img{max-width:100%;border:1px solid #eef1f5;border-radius:6px}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
@media(max-width:800px){.grid{grid-template-columns:1fr}}
"""


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _figure(width: float = 7.0, height: float = 3.2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", color="#eef1f5")
    ax.set_axisbelow(True)
    return fig, ax


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#5f6b7a")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_volume(doc: dict[str, Any]) -> str:
    fig, ax = _figure(10, 3.4)
    rows = doc["volume"]
    if not rows:
        _empty(ax, "no messages")
        return _png(fig)
    import matplotlib.dates as mdates

    width_days = {"minute": 1 / 1440, "hour": 1 / 24, "day": 1.0}[doc["bucket"]] * 0.85
    x = [datetime.fromtimestamp(r["bucket"] / 1000, UTC) for r in rows]
    done = [r["done"] for r in rows]
    failed = [r["failed"] for r in rows]
    other = [r["copies"] - r["done"] - r["failed"] for r in rows]
    ax.bar(x, done, width_days, label="done", color=COLORS["done"], align="edge")
    ax.bar(
        x,
        failed,
        width_days,
        bottom=done,
        label="dead letters",
        color=COLORS["failed"],
        align="edge",
    )
    ax.bar(
        x,
        other,
        width_days,
        bottom=[d + f for d, f in zip(done, failed, strict=True)],
        label="new / claimed",
        color=COLORS["other"],
        align="edge",
    )
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    ax.set_ylabel(f"copies per {doc['bucket']}")
    ax.legend(frameon=False, ncol=3, loc="upper left")
    return _png(fig)


def plot_latency(doc: dict[str, Any]) -> str:
    fig, ax = _figure()
    lat = doc["latency"]
    bins = lat["histogram"]
    if not bins:
        _empty(ax, "no completed deliveries")
        return _png(fig)
    lefts = [max(b["fromMs"], 0.5) for b in bins]
    widths = [b["toMs"] - left for b, left in zip(bins, lefts, strict=True)]
    ax.bar(
        lefts,
        [b["count"] for b in bins],
        widths,
        align="edge",
        color=COLORS["accent"],
        edgecolor="white",
    )
    ax.set_xscale("log")
    top = ax.get_ylim()[1]
    for i, (name, style) in enumerate((("p50", "-"), ("p95", "--"), ("p99", ":"))):
        value = lat.get(name)
        if value:
            ax.axvline(value, color="#1c2330", linestyle=style, linewidth=1)
            y = top * (0.97 - 0.09 * i)
            ax.text(value, y, f" {name} {_ms(value)}", fontsize=8, va="top")
    ax.set_xlabel("stored → done (ms, log scale)")
    ax.set_ylabel("copies")
    return _png(fig)


def _barh(
    rows: Sequence[tuple[str, float]], color: str | Sequence[str], xlabel: str, empty: str
) -> str:
    fig, ax = _figure(7, max(1.6, 0.38 * len(rows) + 0.8))
    if not rows:
        _empty(ax, empty)
        return _png(fig)
    labels = [r[0] for r in rows][::-1]
    values = [r[1] for r in rows][::-1]
    colors = color[::-1] if isinstance(color, list) else color
    ax.barh(labels, values, color=colors)
    ax.grid(axis="x", color="#eef1f5")
    ax.grid(axis="y", visible=False)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
    ax.set_xlabel(xlabel)
    return _png(fig)


def plot_dead_letters(doc: dict[str, Any]) -> str:
    rows = [(r["code"] or "?", r["count"]) for r in doc["deadLetters"]["byCode"]]
    return _barh(rows, COLORS["failed"], "dead letters", "no dead letters")


def plot_rejections(doc: dict[str, Any]) -> str:
    rows = doc["rejections"]["byReason"]
    colors = [COLORS["accent"] if r["source"] == "router" else COLORS["failed"] for r in rows]
    return _barh([(r["reason"], r["count"]) for r in rows], colors, "rejections", "no rejections")


def plot_depth(doc: dict[str, Any]) -> str:
    rows = [d for d in doc["depth"] if d["waiting"] or d["claimed"]][:20]
    fig, ax = _figure(7, max(1.6, 0.38 * len(rows) + 0.8))
    if not rows:
        _empty(ax, "every mailbox is empty")
        return _png(fig)
    labels = [d["subject"] for d in rows][::-1]
    waiting = [d["waiting"] for d in rows][::-1]
    claimed = [d["claimed"] for d in rows][::-1]
    ax.barh(labels, waiting, color=COLORS["other"], label="waiting in new/")
    ax.barh(labels, claimed, left=waiting, color=COLORS["accent"], label="claimed")
    ax.grid(axis="x", color="#eef1f5")
    ax.grid(axis="y", visible=False)
    ax.legend(frameon=False, loc="lower left", bbox_to_anchor=(0, 1), ncol=2)
    ax.set_xlabel("copies now")
    return _png(fig)


# ---------------------------------------------------------------------- HTML


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 86_400_000:
        return f"{value / 86_400_000:.1f} d"
    if value >= 3_600_000:
        return f"{value / 3_600_000:.1f} h"
    if value >= 60_000:
        return f"{value / 60_000:.1f} min"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:.0f} ms"


def _cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return f"<td>{'-' if value is None else value}</td>"
    if isinstance(value, int | float):
        text = f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"
        return f'<td class="n">{text}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    if not rows:
        return '<p class="muted">(none)</p>'
    head = "".join(
        f'<th class="n">{html.escape(t)}</th>'
        if isinstance(rows[0].get(k), int | float)
        else f"<th>{html.escape(t)}</th>"
        for k, t in columns
    )
    body = "".join(
        "<tr>" + "".join(_cell(row.get(k)) for k, _ in columns) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(src: str, alt: str) -> str:
    return f'<img src="{src}" alt="{html.escape(alt)}">'


# The tables of the report: (document key, column title) each.
ENDPOINT_COLUMNS = (
    ("subject", "endpoint"),
    ("endpoint", "hash"),
    ("copies", "copies"),
    ("done", "done"),
    ("failed", "dead"),
    ("new", "waiting"),
    ("claimed", "claimed"),
    ("p50", "p50"),
    ("p95", "p95"),
    ("p99", "p99"),
)
DEPTH_COLUMNS = (
    ("subject", "endpoint"),
    ("waiting", "waiting in new/"),
    ("claimed", "claimed"),
    ("oldest", "oldest waiting"),
)
SUBJECT_COLUMNS = (
    ("subject", "subject"),
    ("copies", "copies"),
    ("messages", "messages"),
    ("done", "done"),
    ("failed", "dead"),
    ("new", "waiting"),
    ("claimed", "claimed"),
)
SENDER_COLUMNS = (
    ("sender", "sender"),
    ("messages", "messages"),
    ("copies", "copies"),
    ("failed", "dead"),
)
REASON_COLUMNS = (("code", "code"), ("reason", "reason"), ("count", "count"))
REJECTION_COLUMNS = (
    ("reason", "reason"),
    ("category", "category"),
    ("source", "source"),
    ("count", "count"),
)
REJECTION_ENDPOINT_COLUMNS = (("reason", "reason"), ("endpoint", "endpoint"), ("count", "count"))


def render_html(doc: dict[str, Any]) -> str:
    """The whole page: head, summary, cards, plots, tables."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>Relay delivery metrics</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>Relay delivery metrics</h1>",
        _summary(doc),
        _cards(doc),
        *_plots(doc),
        *_tables(doc),
        "</body></html>",
    ]
    return "\n".join(parts)


def _summary(doc: dict[str, Any]) -> str:
    """Where the numbers come from and what they span."""
    rng = doc["range"]
    return (
        f"<p class='muted'>Generated {html.escape(doc['generatedAtIso'] or '')} from "
        f"{doc['sources']['live']:,} live rows and {doc['sources']['archived']:,} archived rows "
        f"({html.escape(doc['archive'])}); messages created "
        f"{html.escape(rng['firstCreatedIso'] or '-')} to "
        f"{html.escape(rng['lastCreatedIso'] or '-')}. Computed in {doc['seconds']:.1f} s.</p>"
    )


def _cards(doc: dict[str, Any]) -> str:
    """The headline numbers, one card each."""
    t, lat = doc["totals"], doc["latency"]
    cards = [
        ("copies", f"{t['copies']:,}"),
        ("messages", f"{t['messages']:,}"),
        ("done", f"{t['byState']['done']:,}"),
        ("dead letters", f"{t['byState']['failed']:,}"),
        ("waiting", f"{t['byState']['new']:,}"),
        ("claimed", f"{t['byState']['claimed']:,}"),
        ("latency p50", _ms(lat["p50"])),
        ("p95", _ms(lat["p95"])),
        ("p99", _ms(lat["p99"])),
        ("rejections", f"{doc['rejections']['total']:,}"),
    ]
    return (
        "<div class='cards'>"
        + "".join(
            f"<div class='card'><span class='muted'>{k}</span><b>{v}</b></div>" for k, v in cards
        )
        + "</div>"
    )


def _plots(doc: dict[str, Any]) -> list[str]:
    """Volume over time, then the grid of latency, dead letters, rejections and depth."""
    lat = doc["latency"]
    return [
        f"<h2>Volume over time (per {doc['bucket']}, by creation time)</h2>",
        _img(plot_volume(doc), "volume over time"),
        "<div class='grid'><div><h2>Delivery latency, stored → done</h2>",
        _img(plot_latency(doc), "latency distribution"),
        f"<p class='muted'>{lat['count']:,} completed copies; mean {_ms(lat['mean'])}, "
        f"max {_ms(lat['max'])}.</p></div>",
        "<div><h2>Dead letters by code</h2>",
        _img(plot_dead_letters(doc), "dead letters by code"),
        "</div><div><h2>Rejections by reason</h2>",
        _img(plot_rejections(doc), "rejections by reason"),
        "<p class='muted'>Blue: refused by the router (nothing stored). "
        "Red: dead letters made at publish time.</p>",
        "</div><div><h2>Endpoint depth now</h2>",
        _img(plot_depth(doc), "endpoint depth"),
        "</div></div>",
    ]


def _tables(doc: dict[str, Any]) -> list[str]:
    """The tables, with times shown in readable units."""
    endpoints = [
        {**r, "p50": _ms(r["p50"]), "p95": _ms(r["p95"]), "p99": _ms(r["p99"])}
        for r in doc["byEndpoint"]
    ]
    depth = [{**d, "oldest": _ms(d["oldestWaitingAgeMs"])} for d in doc["depth"]]
    return [
        "<h2>By endpoint</h2>",
        _table(endpoints, ENDPOINT_COLUMNS),
        "<h2>Depth now</h2>",
        _table(depth, DEPTH_COLUMNS),
        "<h2>By subject</h2>",
        _table(doc["bySubject"], SUBJECT_COLUMNS),
        "<h2>By sender</h2>",
        _table(doc["bySender"], SENDER_COLUMNS),
        "<h2>Dead letters: top reasons</h2>",
        _table(doc["deadLetters"]["topReasons"], REASON_COLUMNS),
        "<h2>Rejections</h2>",
        _table(doc["rejections"]["byReason"], REJECTION_COLUMNS),
        _table(doc["rejections"]["byEndpoint"], REJECTION_ENDPOINT_COLUMNS),
    ]

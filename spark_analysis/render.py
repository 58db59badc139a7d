"""The human side of the report: matplotlib PNGs and one self-contained HTML page.

Plain Python over collected rows; no Spark here.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402


@dataclass
class PlotData:
    """What the plots need, collected from Spark by the job."""

    curve: list[dict[str, Any]] = field(default_factory=list)  # fraction, p01_s, p50_s, p99_s
    t100_by_kind: dict[str, list[float]] = field(default_factory=dict)
    incomplete_by_kind: dict[str, int] = field(default_factory=dict)
    first_suspect_s: list[float] = field(default_factory=list)
    all_dead_s: list[float] = field(default_factory=list)
    lag: list[dict[str, Any]] = field(default_factory=list)


def fmt_s(value: float | None) -> str:
    """Seconds as the report prints them everywhere (the tests look for these strings)."""
    return "n/a" if value is None else f"{value:.3f} s"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{100.0 * value:.1f} %"


def _save(fig: Any, path: Path) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    data = buf.getvalue()
    path.write_bytes(data)
    return data


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def plot_infection_curve(curve: list[dict[str, Any]], path: Path) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    pts = [c for c in curve if c["p50_s"] is not None]
    if pts:
        ax.plot([c["p50_s"] for c in pts], [c["fraction"] for c in pts], label="median event")
        band = [c for c in curve if c["p01_s"] is not None]
        slow = [c for c in curve if c["p99_s"] is not None]
        if band:
            ax.plot([c["p01_s"] for c in band], [c["fraction"] for c in band], "--", color="C2",
                    label="fastest 1 % of events")
        if slow:
            ax.plot([c["p99_s"] for c in slow], [c["fraction"] for c in slow], "--", color="C3",
                    label="p99 (slowest 1 %) of events")
        lo = {c["fraction"]: c["p01_s"] for c in band}
        hi = {c["fraction"]: c["p99_s"] for c in slow}
        shared = sorted(f for f in lo if f in hi)
        if shared:
            ax.fill_betweenx(shared, [lo[f] for f in shared], [hi[f] for f in shared],
                             alpha=0.15, color="C0", label="p01..p99 band")
        ax.legend(loc="lower right")
    else:
        _empty(ax, "no dissemination events")
    ax.set_xlabel("seconds since origin")
    ax.set_ylabel("fraction of alive nodes that have seen it")
    ax.set_ylim(0, 1.02)
    ax.set_title("Infection curve")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_dissemination_cdf(t100_by_kind: dict[str, list[float]], path: Path) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for kind, values in sorted(t100_by_kind.items()):
        if not values:
            continue
        xs = sorted(values)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{kind} ({len(xs)})")
        drawn = True
    if drawn:
        ax.legend(loc="lower right")
    else:
        _empty(ax, "no event reached full coverage")
    ax.set_xlabel("t100: seconds until every alive node had it")
    ax.set_ylabel("fraction of events")
    ax.set_title("Dissemination time CDF per kind (full-coverage events)")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_detection(first_suspect: list[float], all_dead: list[float], path: Path) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    if first_suspect or all_dead:
        values = first_suspect + all_dead
        bins = min(30, max(5, len(values)))
        lo, hi = min(values), max(values)
        edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)] if hi > lo else bins
        if first_suspect:
            ax.hist(first_suspect, bins=edges, alpha=0.6, label="first suspect anywhere")
        if all_dead:
            ax.hist(all_dead, bins=edges, alpha=0.6, label="dead at every live node")
        ax.legend()
    else:
        _empty(ax, "no crashes")
    ax.set_xlabel("seconds after the crash")
    ax.set_ylabel("crashes")
    ax.set_title("Crash detection latency")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_lag(lag: list[dict[str, Any]], path: Path) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    rows = [r for r in lag if r["lag_p50_s"] is not None]
    if rows:
        names = [r["node"] for r in rows][::-1]
        ax.barh(names, [r["lag_p50_s"] for r in rows][::-1], label="median")
        ax.scatter([r["lag_p99_s"] for r in rows][::-1], names, color="C3", zorder=3, label="p99")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    else:
        _empty(ax, "no observations")
    ax.set_xlabel("observation delay (s)")
    ax.set_title(f"Slowest {len(rows)} nodes by median observation delay")
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def _table(headers: list[str], rows: list[list[Any]], empty: str) -> str:
    if not rows:
        return f"<p class=empty>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """
body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#222}
h1{margin-bottom:.2em} .sub{color:#666;margin-top:0}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3} .headline td:first-child{font-weight:600}
img{max-width:100%} .empty{color:#888}
"""


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _side(majority: bool | None) -> str:
    return "n/a" if majority is None else ("majority" if majority else "minority")


def headline_rows(summary: dict[str, Any]) -> list[list[str]]:
    d = summary["dissemination"]
    det = summary["detection"]
    part = summary["partitions"]
    return [
        ["nodes", str(summary["nodes"])],
        ["trace records", str(summary["events"])],
        ["time span", fmt_s(summary["time_span_s"])],
        ["dissemination events", str(d["events"])],
        ["full coverage", fmt_ratio(d["full_coverage_ratio"])],
        ["t50 median", fmt_s(d["t50_s_median"])],
        ["t90 median", fmt_s(d["t90_s_median"])],
        ["t99 median", fmt_s(d["t99_s_median"])],
        ["t100 p99", fmt_s(d["t100_s"]["p99"])],
        ["crashes", str(det["crashes"])],
        ["first suspect p50", fmt_s(det["first_suspect_p50_s"])],
        ["dead everywhere p50", fmt_s(det["all_dead_p50_s"])],
        ["undetected crashes", str(det["undetected"])],
        ["false positives", str(summary["false_positives"]["count"])],
        ["partitions detected / healed", f"{part['count']} / {part['healed']}"],
        ["partition detection p99 (majority / minority side)",
         " / ".join(fmt_s(part.get("by_side", {}).get(k, {}).get("detection_s_p99")) for k in ("majority", "minority"))],
        ["partition heal p99 (first contact to one view)", fmt_s(part.get("heal_s_p99"))],
        ["session handoffs (moved / fell back / merged)",
         " / ".join(str(summary.get("handoffs", {}).get("by_outcome", {}).get(k, {}).get("handoffs", 0))
                    for k in ("ok", "fallback", "merged"))],
        ["handoff p50 / p99 (CONNECT to session here)",
         " / ".join(_ms(summary.get("handoffs", {}).get("by_outcome", {}).get("ok", {}).get(k)) for k in ("median_ms", "p99_ms"))],
        ["bad lines skipped", str(summary["input"]["bad_lines"])],
    ]


def render_report(summary: dict[str, Any], plots: PlotData, out: Path) -> Path:
    """Write the four PNGs and ``report.html`` (PNGs embedded) into ``out``."""
    images = {
        "infection_curve.png": plot_infection_curve(plots.curve, out / "infection_curve.png"),
        "dissemination_cdf.png": plot_dissemination_cdf(
            plots.t100_by_kind, out / "dissemination_cdf.png"
        ),
        "detection_latency.png": plot_detection(
            plots.first_suspect_s, plots.all_dead_s, out / "detection_latency.png"
        ),
        "per_node_lag.png": plot_lag(plots.lag, out / "per_node_lag.png"),
    }

    def img(name: str, alt: str) -> str:
        data = base64.b64encode(images[name]).decode("ascii")
        return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'

    d = summary["dissemination"]
    kind_rows = [
        [kind, k["events"], fmt_ratio(k["full_coverage_ratio"]), fmt_s(k["t50_s_median"]),
         fmt_s(k["t90_s_median"]), fmt_s(k["t99_s_median"]), fmt_s(k["t100_s"]["p99"]),
         k["hops"]["p50"], k["hops"]["p99"]]
        for kind, k in d["by_kind"].items()
    ]
    incomplete = ", ".join(f"{k}: {n}" for k, n in sorted(plots.incomplete_by_kind.items()) if n)
    fp = summary["false_positives"]
    fp_rows = [[r["member"], r["declared_by"], r["ts_us"]] for r in fp["list"]]
    handoff_rows = [
        [outcome, v["handoffs"], _ms(v["median_ms"]), _ms(v["p99_ms"]), _ms(v["max_ms"]), v["messages"]]
        for outcome, v in summary.get("handoffs", {}).get("by_outcome", {}).items()
    ]
    part_rows = [
        [r["node"], r["subject"], r.get("peers") or "", _side(r.get("majority")), r["detected_ts_us"],
         r["healed_ts_us"] or "not healed", fmt_s(r["detection_s"]), fmt_s(r["heal_s"])]
        for r in summary["partitions"]["list"]
    ]
    side_rows = [
        [side, v["count"], fmt_s(v["detection_s_p50"]), fmt_s(v["detection_s_p99"]), fmt_s(v["detection_s_max"]),
         fmt_s(v["suspect_to_dead_s_p50"]), fmt_s(v["suspect_to_dead_s_max"]), v["within_bound"] or "n/a", v["healed"], fmt_s(v["heal_s_p50"]), fmt_s(v["heal_s_p99"]), fmt_s(v["heal_s_max"])]
        for side, v in summary["partitions"].get("by_side", {}).items()
    ]
    lag_rows = [
        [r["node"], r["observations"], fmt_s(r["lag_p50_s"]), fmt_s(r["lag_p99_s"])]
        for r in summary["per_node_lag"]
    ]
    pct = summary["percentiles"]
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>meshd convergence report</title>
<style>{_CSS}</style></head><body>
<h1>meshd convergence report</h1>
<p class=sub>{html.escape(", ".join(summary["input"]["paths"]))}
 &middot; {summary["input"]["files"]} file(s){" &middot; simulated" if summary["sim"] else ""}</p>
<h2>Headline</h2>
{_table(["metric", "value"], headline_rows(summary), "")}
<h2>Dissemination</h2>
<p>Coverage times count from the origin's timestamp until 50/90/99/100 % of the nodes
alive at that moment had observed the event (nearest rank).</p>
{img("infection_curve.png", "infection curve")}
{img("dissemination_cdf.png", "dissemination CDF per kind")}
<p>Events that never reached full coverage are left out of the CDF{": " + html.escape(incomplete) if incomplete else ""}.</p>
{_table(["kind", "events", "full coverage", "t50 median", "t90 median", "t99 median",
         "t100 p99", "hops p50", "hops p99"], kind_rows, "no dissemination events")}
<h2>Failure detection</h2>
{img("detection_latency.png", "detection latency histogram")}
<h2>False positives ({fp["count"]})</h2>
{_table(["member", "declared dead by", "ts_us"], fp_rows, "no member was declared dead while alive")}
<h2>Partitions</h2>
<p>Detection runs from the onset (the first member of the group stopped answering) to
the conclusion that the group is lost. Suspect to dead is, for the slowest member of
the other side, the time from this node's first suspicion of it to marking it dead;
the target is the suspicion timeout + 3 s. Heal runs from the first contact with the
other side to one view.</p>
{_table(["side", "detections", "detection p50", "detection p99", "detection max",
         "suspect to dead p50", "suspect to dead max", "within suspicion timeout + 3 s", "healed", "heal p50", "heal p99", "heal max"], side_rows,
        "no partition detected")}
{_table(["node", "partition", "other side", "side", "detected_ts_us", "healed_ts_us", "detection", "heal"], part_rows,
        "no partition detected")}
<h2>Session handoffs</h2>
<p>A client that reconnects to another node: the time from its CONNECT there to its
session being there (ok), takeovers that fell back because the owner did not answer,
and copies merged in later.</p>
{_table(["outcome", "handoffs", "median", "p99", "max", "messages moved"], handoff_rows, "no session handoff")}
<h2>Slowest nodes</h2>
{img("per_node_lag.png", "per-node lag")}
{_table(["node", "observations", "median delay", "p99 delay"], lag_rows, "no observations")}
<p class=sub>Percentiles: over events {html.escape(pct["events"]["method"])},
per-node lag {html.escape(pct["per_node_lag"]["method"])}, hops exact
(exact = linear interpolation; approx = percentile_approx, accuracy 10000).</p>
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path

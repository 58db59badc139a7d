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
class Timeline:
    """The run in seconds from its start: what was declared dead when (per class),
    crashes and restarts, and the partition's span (first detection to last heal)."""

    declarations: dict[str, dict[int, int]] = field(default_factory=dict)  # class -> second -> count
    crashes: list[tuple[str, float, float | None]] = field(default_factory=list)  # member, crash, restart
    partition: tuple[float, float | None] | None = None


# Why a section is empty: which records it needs and which runs write them.
WHY_EMPTY: dict[str, str] = {
    "dissemination": (
        "No dissemination events: this needs records with an event_id of kind broadcast, route_add, "
        "route_del, config_set or member_*. Real nodes write them on every membership, route and config "
        "change; `meshd simulate` writes them with --broadcasts-per-s, --crash or --partition."
    ),
    "detection": (
        "No crashes: this needs node_crash records (`meshd simulate --crash N`) or, in real traces, a node "
        "whose lines stop without node_stop more than --crash-grace seconds before the end (or that "
        "starts again: node_start after a kill)."
    ),
    "declarations": (
        "No death declarations: this needs member_dead records; `meshd simulate --crash N` or "
        "--partition makes members declare others dead."
    ),
    "partitions": (
        "No partition detected: this needs partition_detected / partition_healed records, written by "
        "every node's detector when a group of members is lost together (`meshd simulate --partition "
        "A|B --partition-at T --heal-at T2`; real nodes on a network split; a crash counts as a "
        "partition of one)."
    ),
    "handoffs": (
        "No session handoff: this needs session_handoff records, written when an MQTT client with a "
        "persistent session reconnects to another node (real runs, or `meshd simulate --cluster`); "
        "the gossip-only `meshd simulate` has no MQTT clients."
    ),
    "lag": "No observations of other nodes' events: see Dissemination.",
}


@dataclass
class PlotData:
    """What the plots need, collected from Spark by the job."""

    curve: list[dict[str, Any]] = field(default_factory=list)  # fraction, p01_s, p50_s, p99_s
    t100_by_kind: dict[str, list[float]] = field(default_factory=dict)
    incomplete_by_kind: dict[str, int] = field(default_factory=dict)
    first_suspect_s: list[float] = field(default_factory=list)
    all_dead_s: list[float] = field(default_factory=list)
    lag: list[dict[str, Any]] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    events: int = 0  # dissemination events in the run


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


def curve_note(curve: list[dict[str, Any]], events: int) -> str | None:
    """What the infection curve says instead of lines, None when it has lines."""
    if any(c["p50_s"] is not None or c["p01_s"] is not None for c in curve):
        return None
    if not events:
        return "no dissemination events\n(see the note below)"
    if not curve:
        return f"{events} dissemination events, none with a node alive at its origin"
    return f"{events} dissemination events, but none reached\n{curve[0]['fraction']:.0%} of the nodes alive at its origin"


def plot_infection_curve(curve: list[dict[str, Any]], path: Path, events: int = 0) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    pts = [c for c in curve if c["p50_s"] is not None]
    note = curve_note(curve, events)
    if note is None:
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
        _empty(ax, note)
    ax.set_xlabel("seconds since the event's origin")
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
        _empty(ax, "no event reached full coverage" if t100_by_kind else "no dissemination events")
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
        _empty(ax, "no crashes (see the note below)")
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


CLASS_COLORS = {"true_detection": "C0", "restart": "C2", "leave": "C7", "partition": "C1",
                "false_positive": "C3", "unverified": "C5"}


def plot_timeline(tl: Timeline, span_s: float, path: Path) -> bytes:
    """Death declarations per second by class, with crashes, restarts and the
    partition marked: the whole run at a glance, in seconds from its start."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bottom: dict[int, int] = {}
    for cls, per_s in sorted(tl.declarations.items()):
        xs = sorted(per_s)
        ax.bar(xs, [per_s[x] for x in xs], width=1.0, align="edge", bottom=[bottom.get(x, 0) for x in xs],
               color=CLASS_COLORS.get(cls, "C9"), label=f"{cls.replace('_', ' ')} ({sum(per_s.values())})")
        for x in xs:
            bottom[x] = bottom.get(x, 0) + per_s[x]
    for i, (member, crash, restart) in enumerate(tl.crashes):
        ax.axvline(crash, color="C3", ls="--", lw=1, label="crash" if i == 0 else None)
        if restart is not None:
            ax.axvline(restart, color="C2", ls=":", lw=1.2, label="restart" if i == 0 else None)
    if tl.partition is not None:
        start, end = tl.partition
        ax.axvspan(start, end if end is not None else span_s, color="C1", alpha=0.12,
                   label="partition (first detection to last heal)")
    if not (tl.declarations or tl.crashes or tl.partition):
        _empty(ax, "no crashes, declarations or partitions")
    else:
        ax.legend(loc="upper right", fontsize="small")
    ax.set_xlim(0, max(span_s, 1.0))
    ax.set_xlabel("seconds from the run's start")
    ax.set_ylabel("member_dead declarations per second")
    ax.set_title("Timeline: who was declared dead, and why")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _table(headers: list[str], rows: list[list[Any]], empty: str, section: str = "") -> str:
    if not rows:
        if not empty:
            return ""  # the section's note says why
        return f"<p class=empty data-section={html.escape(section or 'none')}>{html.escape(empty)}</p>"
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
img{max-width:100%} .empty{color:#888} figure{margin:1em 0} .rows{font-size:.9em;margin:.2em 0}
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


def _rows_link(name: str, formats: tuple[str, ...]) -> str:
    """Where a figure's rows are: the CSV table (or the Parquet folder) beside the page."""
    if "csv" in formats:
        target = f"{name}.csv"
    elif "parquet" in formats:
        target = f"{name}.parquet/"
    else:
        return ""
    return f'<p class=rows>Rows: <a href="{html.escape(target)}">{html.escape(target)}</a></p>'


def _since(ts_us: int | None, start_us: int) -> str:
    return "n/a" if ts_us is None else f"{(ts_us - start_us) / 1e6:.3f}"


def _truth_section(summary: dict[str, Any]) -> str:
    checked = summary.get("truth_check")
    if checked is None:
        return ""
    rows = [[r["figure"], r["report"] if r["report"] is not None else "n/a",
             r["truth"] if r["truth"] is not None else "n/a", "ok" if r["ok"] else "DIFFERS"]
            for r in checked["rows"]]
    verdict = "agrees with" if checked["ok"] else "DISAGREES with"
    return f"""<h2 id=truth>Against the simulator's truth</h2>
<p>The report {verdict} the simulator's ground truth (<code>{html.escape(checked["file"])}</code>).</p>
{_table(["figure", "report", "simulator's truth", ""], rows, "", "truth")}"""


def render_report(
    summary: dict[str, Any], plots: PlotData, out: Path, formats: tuple[str, ...] = ("html", "json", "csv")
) -> Path:
    """Write the PNGs and ``report.html`` (PNGs embedded, each figure linked to the
    table of rows it was drawn from) into ``out``."""
    start_us = summary.get("start_ts_us") or 0
    images = {
        "timeline.png": plot_timeline(plots.timeline, summary["time_span_s"] or 0.0, out / "timeline.png"),
        "infection_curve.png": plot_infection_curve(plots.curve, out / "infection_curve.png",
                                                    summary["dissemination"]["events"]),
        "dissemination_cdf.png": plot_dissemination_cdf(
            plots.t100_by_kind, out / "dissemination_cdf.png"
        ),
        "detection_latency.png": plot_detection(
            plots.first_suspect_s, plots.all_dead_s, out / "detection_latency.png"
        ),
        "per_node_lag.png": plot_lag(plots.lag, out / "per_node_lag.png"),
    }

    def img(name: str, alt: str, rows: str) -> str:
        data = base64.b64encode(images[name]).decode("ascii")
        return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
                f"{_rows_link(rows, formats)}</figure>")

    def why(section: str, empty: bool) -> str:
        return f"<p class=empty data-section={section}>{html.escape(WHY_EMPTY[section])}</p>" if empty else ""

    d = summary["dissemination"]
    kind_rows = [
        [kind, k["events"], fmt_ratio(k["full_coverage_ratio"]), fmt_s(k["t50_s_median"]),
         fmt_s(k["t90_s_median"]), fmt_s(k["t99_s_median"]), fmt_s(k["t100_s"]["p99"]),
         k["hops"]["p50"], k["hops"]["p99"]]
        for kind, k in d["by_kind"].items()
    ]
    incomplete = ", ".join(f"{k}: {n}" for k, n in sorted(plots.incomplete_by_kind.items()) if n)
    det = summary["detection"]
    crash_rows = [
        [c["member"], _since(c["crash_ts_us"], start_us), c["source"], _since(c["restart_ts_us"], start_us),
         fmt_s(c["first_suspect_s"]), fmt_s(c["all_dead_s"]), f"{c['declared']}/{c['observers']}"]
        for c in det.get("list", [])
    ]
    decl = summary.get("declarations", {"count": 0, "by_class": {}})
    decl_rows = [[cls.replace("_", " "), n] for cls, n in decl["by_class"].items()] if decl["count"] else []
    fp = summary["false_positives"]
    fp_rows = [[r["member"], r["declared_by"], _since(r["ts_us"], start_us)] for r in fp["list"]]
    handoff_rows = [
        [outcome, v["handoffs"], _ms(v["median_ms"]), _ms(v["p99_ms"]), _ms(v["max_ms"]), v["messages"]]
        for outcome, v in summary.get("handoffs", {}).get("by_outcome", {}).items()
    ]
    part_rows = [
        [r["node"], r["subject"], r.get("peers") or "", _side(r.get("majority")), _since(r["detected_ts_us"], start_us),
         _since(r["healed_ts_us"], start_us) if r["healed_ts_us"] is not None else "not healed",
         fmt_s(r["detection_s"]), fmt_s(r["heal_s"])]
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
 &middot; {summary["input"]["files"]} file(s){" &middot; simulated" if summary["sim"] else ""}
 &middot; times are seconds from the run's start (the first record, ts_us {start_us})</p>
{_truth_section(summary)}
<h2>Headline</h2>
{_table(["metric", "value"], headline_rows(summary), "")}
<h2 id=timeline>Timeline</h2>
{img("timeline.png", "timeline of declarations, crashes and partitions", "declarations")}
<h2 id=dissemination>Dissemination</h2>
<p>Coverage times count from the origin's timestamp until 50/90/99/100 % of the nodes
alive at that moment had observed the event (nearest rank). The t50/t90/t99 medians are
taken over all events, an event that never reached a level counting as slower than any
(so t50 &le; t90 &le; t99); n/a: more than half the events never reached it.</p>
{why("dissemination", not d["events"])}
{img("infection_curve.png", "infection curve", "events")}
{img("dissemination_cdf.png", "dissemination CDF per kind", "events")}
<p>Events that never reached full coverage are left out of the CDF{": " + html.escape(incomplete) if incomplete else ""}.</p>
{_table(["kind", "events", "full coverage", "t50 median", "t90 median", "t99 median",
         "t100 p99", "hops p50", "hops p99"], kind_rows, "no dissemination events", "dissemination")}
<h2 id=detection>Failure detection</h2>
{why("detection", not det["crashes"])}
{img("detection_latency.png", "detection latency histogram", "crashes")}
{_table(["member", "crashed at (s)", "seen as", "restarted at (s)", "first suspect after", "dead everywhere after",
         "declared / observers"], crash_rows, "no crash", "detection")}
<h2 id=declarations>Death declarations by class</h2>
<p>Every member_dead event, classed as in spark_analysis/README.md, "Classification":
a crash detected (the member came back later: restart), a graceful leave, a member cut
off by a partition, or a false positive (alive and reachable).</p>
{why("declarations", not decl["count"])}
{_table(["class", "declarations"], decl_rows, "", "declarations")}
{_rows_link("declarations", formats)}
<h2 id=false-positives>False positives ({fp["count"]})</h2>
{_table(["member", "declared dead by", "at (s)"], fp_rows, "") if fp_rows else "<p>No member was declared dead while alive and reachable.</p>"}
<h2 id=partitions>Partitions</h2>
<p>Detection runs from the onset (the first member of the group stopped answering) to
the conclusion that the group is lost. Suspect to dead is, for the slowest member of
the other side, the time from this node's first suspicion of it to marking it dead;
the target is the suspicion timeout + 3 s. Heal runs from the first contact with the
other side to one view.</p>
{why("partitions", not summary["partitions"]["count"])}
{_table(["side", "detections", "detection p50", "detection p99", "detection max",
         "suspect to dead p50", "suspect to dead max", "within suspicion timeout + 3 s", "healed", "heal p50", "heal p99", "heal max"], side_rows,
        "", "partitions")}
{_table(["node", "partition", "other side", "side", "detected at (s)", "healed at (s)", "detection", "heal"], part_rows,
        "", "partitions")}
{_rows_link("partitions", formats)}
<h2 id=handoffs>Session handoffs</h2>
<p>A client that reconnects to another node: the time from its CONNECT there to its
session being there (ok), takeovers that fell back because the owner did not answer,
and copies merged in later.</p>
{why("handoffs", not handoff_rows)}
{_table(["outcome", "handoffs", "median", "p99", "max", "messages moved"], handoff_rows, "", "handoffs")}
{_rows_link("handoffs", formats)}
<h2 id=lag>Slowest nodes</h2>
{why("lag", not lag_rows)}
{img("per_node_lag.png", "per-node lag", "nodes")}
{_table(["node", "observations", "median delay", "p99 delay"], lag_rows, "", "lag")}
<p class=sub>Percentiles: over events {html.escape(pct["events"]["method"])},
per-node lag {html.escape(pct["per_node_lag"]["method"])}, hops exact
(exact = linear interpolation; approx = percentile_approx, accuracy 10000).</p>
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path

"""`meshd members` (dispatched here by mesh/cli.py): the member list a running node sees."""

from __future__ import annotations

import json
import sys
from typing import Any

from mesh.http_client import HttpClientError, request_json
from mesh.usage import Parser

DEFAULT_HTTP = "127.0.0.1:18083"


def members_main(argv: list[str]) -> int:
    p = Parser(prog="meshd members", description="Print the member list a running node sees.")
    p.add_argument("--http", metavar="HOST:PORT", default=DEFAULT_HTTP, help=f"the node's HTTP API address (default {DEFAULT_HTTP})")
    p.add_argument("--json", action="store_true", help="print the raw JSON instead of a table")
    args = p.parse(argv)
    try:
        status, body = _get_members(args.http)
    except OSError as exc:
        print(f"meshd members: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"meshd members: HTTP {status}: {body}", file=sys.stderr)
        return 1
    members = body.get("members", []) if isinstance(body, dict) else body
    if not isinstance(members, list):
        print("meshd members: unexpected answer", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(members, indent=2))
    else:
        print(format_members(members))
    return 0


def _get_members(http: str) -> tuple[int, Any]:
    try:
        return request_json(http, "GET", "/api/v1/members")
    except HttpClientError as exc:
        raise OSError(str(exc)) from None


def format_members(members: list[dict[str, Any]]) -> str:
    from datetime import datetime, timezone

    headers = ["ID", "ADDRESS", "STATE", "INCARNATION", "LAST CHANGE (UTC)"]
    rows = []
    for m in members:
        ts = m.get("last_change_ts_us")
        when = datetime.fromtimestamp(ts / 1e6, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if isinstance(ts, int) and ts > 0 else "-"
        rows.append([str(m.get("id", "")), str(m.get("address", "")), str(m.get("state", "")), str(m.get("incarnation", "")), when])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    counts: dict[str, int] = {}
    for m in members:
        counts[str(m.get("state"))] = counts.get(str(m.get("state")), 0) + 1
    lines.append(f"{len(members)} members: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return "\n".join(lines)

"""`meshd ctl`: operate a running node through its HTTP API.

    meshd ctl config set KEY VALUE   change a cluster-wide setting (every node applies it)
    meshd ctl config set acl @FILE   enforce an ACL file's rules on every node
    meshd ctl config get KEY         one cluster setting: value, origin node, HLC
    meshd ctl config list            every cluster setting
    meshd ctl routes                 the cluster route table as this node sees it
    meshd ctl cluster                members, current partitions and partition history
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from mesh.http_client import HttpClientError, request_json

DEFAULT_HTTP = "127.0.0.1:18083"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="meshd ctl", description="Operate a running meshd node through its HTTP API.")
    p.add_argument("--http", default=DEFAULT_HTTP, help=f"the node's HTTP API address (default {DEFAULT_HTTP})")
    p.add_argument("--json", action="store_true", help="print the node's JSON answer as it is")
    p.add_argument("--token", default=os.environ.get("MESHD_API_TOKEN"),
                   help="bearer token for a node with api_token set (default: env MESHD_API_TOKEN)")
    sub = p.add_subparsers(dest="command", required=True)
    config = sub.add_parser("config", help="cluster-wide settings").add_subparsers(dest="action", required=True)
    s = config.add_parser("set", help="set a cluster-wide setting")
    s.add_argument("key")
    s.add_argument("value")
    g = config.add_parser("get", help="show one cluster-wide setting")
    g.add_argument("key")
    config.add_parser("list", help="show every cluster-wide setting")
    sub.add_parser("routes", help="the cluster route table (filter -> nodes)")
    sub.add_parser("cluster", help="members, current partitions (netsplits) and their history")
    return p


def _call(http: str, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    return request_json(http, method, path, body, token=token)


def _format_register(r: dict[str, Any]) -> str:
    hlc = r.get("hlc", {})
    return f"{r['key']:<22} {json.dumps(r['value']):<12} origin={r['origin']} hlc={hlc.get('wall_ms')}.{hlc.get('logical')}"


def format_cluster(body: dict[str, Any]) -> str:
    """`meshd ctl cluster`: the member table, then partitions now and before."""
    lines = [f"{m['id']:<24} {m['address']:<22} {m['state']:<8} inc={m['incarnation']}" for m in body.get("members", [])]
    parts = body.get("partitions", [])
    if not parts:
        lines.append("no partition")
    for p in parts:
        side = "majority" if p.get("majority") else "minority"
        lines.append(
            f"PARTITION {p['id']}: this side {','.join(p['local'])} ({side}); "
            f"unreachable {','.join(p['remote'])}; back already: {','.join(p['returned']) or '-'}"
        )
    history = body.get("history", [])
    if history:
        lines.append("history:")
        for h in history:
            if h["event"] == "partition_detected":
                what = f"detected, lost {','.join(h['peers'])} ({'majority' if h['majority'] else 'minority'}) in {h['detection_s']} s"
            else:
                what = f"healed, {','.join(h['peers'])} back; heal {h['heal_s']} s, split {h['duration_s']} s"
            lines.append(f"  {h['id']}: {what}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "routes":
            status, body = _call(args.http, "GET", "/api/v1/routes", token=args.token)
        elif args.command == "cluster":
            status, body = _call(args.http, "GET", "/api/v1/cluster", token=args.token)
        elif args.action == "set":
            if args.value.startswith("@"):
                # `meshd ctl config set acl @acl.toml`: the file's text is the value.
                try:
                    with open(args.value[1:], encoding="utf-8") as f:
                        args.value = f.read()
                except OSError as exc:
                    print(f"meshd ctl: cannot read {args.value[1:]}: {exc.strerror or exc}", file=sys.stderr)
                    return 2
            status, body = _call(args.http, "PUT", f"/api/v1/config/{args.key}", {"value": args.value}, token=args.token)
        elif args.action == "get":
            status, body = _call(args.http, "GET", f"/api/v1/config/{args.key}", token=args.token)
        else:
            status, body = _call(args.http, "GET", "/api/v1/config", token=args.token)
    except HttpClientError as exc:
        print(f"meshd ctl: {exc}", file=sys.stderr)
        return 1
    if status >= 400:
        message = body.get("error") if isinstance(body, dict) else body
        print(f"meshd ctl: {message}", file=sys.stderr)
        return 2 if status == 400 else 1
    if args.json:
        print(json.dumps(body, indent=2))
    elif args.command == "routes":
        routes = body["routes"]
        for r in routes:
            print(f"{r['filter']:<40} {' '.join(r['nodes'])}")
        print(f"{len(routes)} routes", file=sys.stderr)
    elif args.command == "cluster":
        print(format_cluster(body))
    elif args.action == "list":
        for r in body["config"]:
            print(_format_register(r))
    else:
        print(_format_register(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

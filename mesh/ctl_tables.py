"""What `meshd ctl` prints without `--json`: the node's JSON answers as tables.

Each function takes the decoded JSON body of one endpoint and returns the text. Lines
about the answer itself (members that did not answer, the next page) follow the table,
so `grep` on a client id still finds its row.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns as wide as their widest cell, two spaces apart."""
    cells = [list(headers)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def _footer(body: dict[str, Any], noun: str, *, paged: bool = True) -> list[str]:
    lines = []
    if paged:
        meta = body.get("meta", {})
        lines.append(f"{len(body.get('data', []))} of {meta.get('count', 0)} {noun}")
        if meta.get("next"):
            lines.append(f"next page: --after {meta['next']}")
    for m in body.get("missing", []):
        lines.append(f"missing: {m['node']} ({m['reason']})")
    return lines


def _address(row: dict[str, Any]) -> str | None:
    if row.get("ip_address") is None:
        return None
    host = row["ip_address"]
    return f"[{host}]:{row['port']}" if ":" in host else f"{host}:{row['port']}"


def format_clients(body: dict[str, Any]) -> str:
    """`meshd ctl clients list`: one row per client, connected or with a kept session."""
    rows = [
        (r["clientid"], r["node"], r["connected"], _address(r), r["username"], r["proto_ver"], r["keepalive"],
         r["subscriptions_cnt"], r["inflight_cnt"], r["mqueue_len"])
        for r in body["data"]
    ]
    headers = ("CLIENTID", "NODE", "CONNECTED", "ADDRESS", "USERNAME", "PROTO", "KEEPALIVE", "SUBS", "INFLIGHT",
               "QUEUED")
    return "\n".join([table(headers, rows), *_footer(body, "clients")])


def format_sessions(body: dict[str, Any]) -> str:
    """`meshd ctl sessions list`: the same rows, as sessions (expiry, queue, drops)."""
    rows = [
        (r["clientid"], r["node"], r["connected"], r["clean_start"], _expiry(r["expiry_interval"]),
         r["subscriptions_cnt"], r["inflight_cnt"], r["mqueue_len"], r["mqueue_dropped"], r["disconnected_at"])
        for r in body["data"]
    ]
    headers = ("CLIENTID", "NODE", "CONNECTED", "CLEAN_START", "EXPIRY", "SUBS", "INFLIGHT", "QUEUED", "DROPPED",
               "DISCONNECTED_AT")
    return "\n".join([table(headers, rows), *_footer(body, "sessions")])


def _expiry(seconds: int) -> str:
    return "never" if seconds == 0xFFFFFFFF else f"{seconds}s"


def format_client(body: dict[str, Any]) -> str:
    """`meshd ctl clients show ID`: the client's fields, then its subscriptions and the
    first inflight and queued messages."""
    skip = {"subscriptions", "inflight", "mqueue", "missing", "replication"}
    width = max(len(k) for k in body if k not in skip)
    lines = [f"{k:<{width}}  {_cell(v)}" for k, v in body.items() if k not in skip]
    lines += ["", "subscriptions:", _indent(format_subscription_rows(body.get("subscriptions", [])))]
    if body.get("inflight"):
        lines += ["", "inflight:", _indent(table(("PACKET_ID", "TOPIC", "QOS", "STATE"),
                                                 [(m["packet_id"], m["topic"], m["qos"], m["state"])
                                                  for m in body["inflight"]]))]
    if body.get("mqueue"):
        lines += ["", "queued:", _indent(table(("TOPIC", "QOS"), [(m["topic"], m["qos"]) for m in body["mqueue"]]))]
    rep = body.get("replication")
    if isinstance(rep, dict):
        # Session replication (README "Session replication"): as its owner sees it.
        lines += ["", "replication:"]
        lines += [f"  {k:<16}  {_cell(rep.get(k))}" for k in ("copies", "mode", "epoch", "seq", "under_replicated")]
        lines.append(_indent(table(("REPLICA", "SEQ", "LAG"),
                                   [(r["node"], _cell(r.get("seq")), r.get("lag")) for r in rep.get("replicas", [])])))
    lines += _footer(body, "", paged=False)
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def format_subscription_rows(rows: list[dict[str, Any]]) -> str:
    return table(("TOPIC", "QOS", "NL", "RAP", "RH", "SUBID"),
                 [(s["topic"], s["qos"], s["nl"], s["rap"], s["rh"], s["subid"]) for s in rows])


def format_subscriptions(body: dict[str, Any]) -> str:
    """`meshd ctl subscriptions list`: which clients on which nodes."""
    rows = [(s["topic"], s["clientid"], s["node"], s["qos"], s["nl"], s["rap"], s["rh"]) for s in body["data"]]
    headers = ("TOPIC", "CLIENTID", "NODE", "QOS", "NL", "RAP", "RH")
    return "\n".join([table(headers, rows), *_footer(body, "subscriptions")])


def format_deleted(body: dict[str, Any]) -> str:
    lines = [f"session {body['deleted']} ended on {', '.join(body['nodes'])}"]
    return "\n".join(lines + _footer(body, "", paged=False))


def format_kicked(body: dict[str, Any]) -> str:
    return "\n".join([f"kicked {body['kicked']} on {', '.join(body['nodes'])}", *_footer(body, "", paged=False)])


def format_routes(body: dict[str, Any]) -> str:
    routes = body["routes"]
    return "\n".join([table(("FILTER", "NODES"), [(r["filter"], " ".join(r["nodes"])) for r in routes]),
                      f"{len(routes)} routes"])


def format_streams(body: dict[str, Any]) -> str:
    streams = body["streams"]
    rows = [(s["filter"], s["keep"], s["messages"], s["bytes"], s["max_messages"], s["max_bytes"], s["max_age_s"],
             s["oldest"] or None, s["newest"] or None, s["replays"]) for s in streams]
    return "\n".join([table(("FILTER", "KEEP", "MESSAGES", "BYTES", "MAX_MESSAGES", "MAX_BYTES", "MAX_AGE_S",
                              "OLDEST", "NEWEST", "REPLAYS"), rows),
                      f"{len(streams)} streams on node {body['node_id']} (counts are this node's part)"])


def _config_value(entry: dict[str, Any]) -> str:
    value = entry["value"]
    if entry["key"] == "acl" and isinstance(value, str):
        return f"({len(value)} bytes of TOML)"
    return json.dumps(value) if not isinstance(value, str) else value


def _config_source(entry: dict[str, Any]) -> str:
    source = entry["source"]
    if source == "cluster":
        hlc = entry.get("hlc", {})
        return f"cluster origin={entry['origin']} hlc={hlc.get('wall_ms')}.{hlc.get('logical')}"
    if entry.get("source_detail"):
        return f"{source} ({entry['source_detail']})"
    return source


def format_config(body: dict[str, Any]) -> str:
    """`meshd ctl config list`: every setting, its value in effect and where it came from."""
    return table(("KEY", "VALUE", "SOURCE"), [(e["key"], _config_value(e), _config_source(e)) for e in body["config"]])


def format_config_entry(entry: dict[str, Any]) -> str:
    return table(("KEY", "VALUE", "SOURCE"), [(entry["key"], _config_value(entry), _config_source(entry))])


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


def format_delayed(body: dict[str, Any]) -> str:
    """`meshd ctl delayed list`: pending delayed messages in due order."""
    rows = [(d["id"], d["topic"], d["due"], d["origin"], d["node"], d["qos"], d["retain"]) for d in body["data"]]
    headers = ("ID", "TOPIC", "DUE", "ORIGIN", "NODE", "QOS", "RETAIN")
    return "\n".join([table(headers, rows), *_footer(body, "delayed messages")])


def format_delayed_one(body: dict[str, Any]) -> str:
    """`meshd ctl delayed show|cancel ID`: one message, a field a line."""
    lines = [f"cancelled {body['cancelled']} on {', '.join(body.get('nodes', []))}"] if "cancelled" in body else []
    names = ("id", "topic", "due", "due_in_s", "received_at", "origin", "node", "qos", "retain", "publisher",
             "payload_bytes", "expires_at")
    return "\n".join(lines + [f"{name}: {_cell(body.get(name))}" for name in names] + _footer(body, "", paged=False))


def _rule_row(rule: dict[str, Any]) -> tuple[object, ...]:
    m = rule.get("metrics", {})
    return (rule["id"], ",".join(rule.get("from", [])), m.get("matched"), m.get("passed"), m.get("failed"),
            m.get("actions_ok"), m.get("actions_failed"), rule.get("source"))


_RULE_HEADERS = ("ID", "FROM", "MATCHED", "PASSED", "FAILED", "ACTIONS_OK", "ACTIONS_FAILED", "SOURCE")


def format_rules(body: dict[str, Any]) -> str:
    """`meshd ctl rules`: one row per rule with its counters; rules this node cannot run follow."""
    lines = [table(_RULE_HEADERS, [_rule_row(r) for r in body.get("rules", [])])]
    for rule_id, error in sorted(body.get("refused", {}).items()):
        lines.append(f"refused here: {rule_id}: {error}")
    return "\n".join(lines)


def format_rule(rule: dict[str, Any]) -> str:
    """`meshd ctl rules show|add`: the rule's row, its SQL, actions and last error."""
    m = rule.get("metrics", {})
    lines = [table(_RULE_HEADERS, [_rule_row(rule)]), f"sql: {rule['sql']}"]
    lines.extend(f"action: {json.dumps(a, sort_keys=True)}" for a in rule.get("actions", []))
    if m.get("last_error"):
        lines.append(f"last error: {m['last_error']}")
    return "\n".join(lines)


def format_deleted_rule(body: dict[str, Any]) -> str:
    return f"deleted rule {body['deleted']} (on every node)"


def format_plugins(body: dict[str, Any]) -> str:
    """`meshd ctl plugins`: each plugin and its state, then every callback in chain order."""
    plugins = table(("PLUGIN", "STATUS", "ERRORS", "ORIGIN"),
                    [(p["name"], p["status"] if not p.get("error") else f"{p['status']}: {p['error']}", p["errors"],
                      p["origin"]) for p in body.get("plugins", [])])
    hooks = table(("POINT", "CALLBACK", "PRIORITY", "ERRORS"),
                  [(h["point"], h["callback"], h["priority"], h["errors"]) for h in body.get("hooks", [])])
    return plugins + "\n\n" + hooks
def format_bridges(body: dict[str, Any]) -> str:
    """`meshd ctl bridges list`: one row per bridge on the node."""
    rows = []
    for b in body["bridges"]:
        m, st = b["metrics"], b["status"]
        rows.append((b["id"], b["type"], b["url"], b["source"], st["state"], m["queued"], m["sent_total"],
                     m["dropped_total"], st["last_error"]))
    headers = ("ID", "TYPE", "URL", "SOURCE", "STATE", "QUEUED", "SENT", "DROPPED", "LAST ERROR")
    return "\n".join([table(headers, rows), f"{len(rows)} bridges on {body['node_id']}"])


def format_bridge(body: dict[str, Any]) -> str:
    """`meshd ctl bridges show ID`: config, status and metrics as key: value lines."""
    lines = [f"{body['id']} ({body['type']} {body['url']}, from {body['source']}, on {body['node']})"]
    for section in ("status", "metrics", "config"):
        lines.append(f"{section}:")
        for key, value in body[section].items():
            shown = json.dumps(value) if isinstance(value, (dict, list)) else _cell(value)
            lines.append(f"  {key}: {shown}")
    return "\n".join(lines)


def format_bridge_deleted(body: dict[str, Any]) -> str:
    return f"bridge {body['deleted']} removed (on every node, as a cluster config change)"

"""`meshd ctl`: operate a running node (and through it, the cluster) over its HTTP API.

    meshd ctl clients list [FILTERS]     clients on every node, connected or with a kept session
    meshd ctl clients show CLIENT_ID     one client: connection, session, subscriptions, queue
    meshd ctl clients kick CLIENT_ID     disconnect a client wherever it is connected (v5: 0x98)
    meshd ctl sessions list [FILTERS]    the same clients, as sessions (expiry, queue, drops)
    meshd ctl sessions show CLIENT_ID
    meshd ctl sessions delete CLIENT_ID  end a session wherever it is (disconnecting its client)
    meshd ctl subscriptions list [--topic TOPIC] [--clientid CLIENT_ID] [--node NODE]
    meshd ctl config list                every setting: value in effect and its source
    meshd ctl config get KEY             one setting
    meshd ctl config set KEY VALUE       change a cluster-wide setting (every node applies it)
    meshd ctl config set acl @FILE       enforce an ACL file's rules on every node
    meshd ctl delayed list [--limit N] [--after ID] [--node NODE_ID]   pending delayed messages, cluster-wide
    meshd ctl delayed show ID            one pending delayed message
    meshd ctl delayed cancel ID          cancel it, wherever it is
    meshd ctl rules list                 every rule, with its metrics (matched, passed, failed, actions)
    meshd ctl rules show RULE_ID         one rule, its SQL, actions, metrics and last error
    meshd ctl rules add RULE_ID SQL [--action JSON]...   add (or replace) a rule on every node
    meshd ctl rules delete RULE_ID       remove a rule added through the API, on every node
    meshd ctl plugins                    this node's plugins and every hook callback, with errors
    meshd ctl routes                     the cluster route table as this node sees it
    meshd ctl bridges list               every bridge on the node: target, state, queue, sent, dropped, last error
    meshd ctl bridges show ID            one bridge: its config, status and metrics
    meshd ctl bridges add @FILE          add or replace a bridge on every node (a JSON or TOML table)
    meshd ctl bridges delete ID          remove a bridge from every node
    meshd ctl cluster                    members, current partitions and partition history

`--json` (the node's JSON answer as it is), `--http HOST:PORT` and `--token TOKEN` go
anywhere on the line. Exit codes: 0 done, 2 a usage error or a request the node
refused as wrong (400), 1 anything else (unreachable, not found, failed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote, urlencode

from mesh import ctl_tables
from mesh.http_client import HttpClientError, request_json
from mesh.usage import Parser

DEFAULT_HTTP = "127.0.0.1:18083"


def _common_options(*, with_defaults: bool) -> Parser:
    """--http, --json and --token, for the top parser (with defaults) and for every
    subcommand (without: a subcommand must not reset what was given before it)."""
    def default(value: object) -> object:
        return value if with_defaults else argparse.SUPPRESS

    p = Parser(add_help=False)
    p.add_argument("--http", metavar="HOST:PORT", default=default(DEFAULT_HTTP),
                   help=f"the node's HTTP API address (default {DEFAULT_HTTP})")
    p.add_argument("--json", action="store_true", default=default(False), help="print the node's JSON answer as it is")
    p.add_argument("--token", metavar="TOKEN", default=default(os.environ.get("MESHD_API_TOKEN")),
                   help="bearer token for a node with api_token set (default: env MESHD_API_TOKEN)")
    return p


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: object = None


def _client_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clientid-prefix", metavar="PREFIX", help="client ids that start with PREFIX")
    p.add_argument("--username", metavar="USERNAME", help="clients that authenticated as USERNAME")
    p.add_argument("--node", metavar="NODE_ID", help="only the clients of this node")
    state = p.add_mutually_exclusive_group()
    state.add_argument("--connected", dest="connected", action="store_const", const="true",
                       help="only connected clients")
    state.add_argument("--disconnected", dest="connected", action="store_const", const="false",
                       help="only sessions kept for clients that are gone")
    _paging(p)


def _paging(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", metavar="N", type=_limit, help="rows per page, 1..1000 (default 100)")
    p.add_argument("--after", metavar="CURSOR", help="the page after this cursor (printed under a full page)")


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"expected a number 1..1000, not {text!r}")
    return int(text)


def _query(args: argparse.Namespace, names: tuple[str, ...]) -> str:
    """The query string of the options given (each option is named as its parameter)."""
    given = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    return "?" + urlencode(given) if given else ""


def _path_id(client_id: str) -> str:
    return quote(client_id, safe="")


def build_parser() -> Parser:
    common = _common_options(with_defaults=False)
    p = Parser(prog="meshd ctl", parents=[_common_options(with_defaults=True)],
               description="Operate a running meshd node (and the cluster through it) over its HTTP API.",
               epilog="--json, --http and --token may be given anywhere on the line.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(parent: "argparse._SubParsersAction[Parser]", name: str, help: str) -> Parser:
        parser = parent.add_parser(name, help=help, description=help, parents=[common])
        p.leaf(parser)
        return parser

    clients = command(sub, "clients", "clients on every node").add_subparsers(dest="action", required=True,
                                                                              metavar="ACTION")
    _client_filters(command(clients, "list", "clients on every node, connected or with a kept session"))
    command(clients, "show", "one client: connection, session, subscriptions, queue").add_argument(
        "client_id", metavar="CLIENT_ID")
    command(clients, "kick", "disconnect a client wherever it is connected (its session stays)").add_argument(
        "client_id", metavar="CLIENT_ID")

    sessions = command(sub, "sessions", "sessions on every node").add_subparsers(dest="action", required=True,
                                                                                 metavar="ACTION")
    _client_filters(command(sessions, "list", "every session: expiry, subscriptions, queue, drops"))
    command(sessions, "show", "one session, as clients show").add_argument("client_id", metavar="CLIENT_ID")
    command(sessions, "delete", "end a session wherever it is (its client is disconnected)").add_argument(
        "client_id", metavar="CLIENT_ID")

    subs = command(sub, "subscriptions", "subscriptions on every node").add_subparsers(dest="action", required=True,
                                                                                       metavar="ACTION")
    subs_list = command(subs, "list", "which clients on which nodes subscribe")
    subs_list.add_argument("--topic", metavar="TOPIC",
                           help="a topic name: the subscriptions matching it; a filter: exactly that filter")
    subs_list.add_argument("--clientid", metavar="CLIENT_ID", help="the subscriptions of one client")
    subs_list.add_argument("--node", metavar="NODE_ID", help="only the subscriptions on this node")
    _paging(subs_list)

    config = command(sub, "config", "settings: in effect, and cluster-wide changes").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    s = command(config, "set", "change a cluster-wide setting (every node applies it)")
    s.add_argument("key", metavar="KEY")
    s.add_argument("value", metavar="VALUE", help="the new value; @FILE reads it from FILE (acl)")
    command(config, "get", "one setting: its value in effect and its source").add_argument("key", metavar="KEY")
    command(config, "list", "every setting: its value in effect and its source")

    delayed = command(sub, "delayed", "pending delayed messages ($delayed/...), cluster-wide").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    delayed_list = command(delayed, "list", "pending delayed messages in due order")
    delayed_list.add_argument("--limit", metavar="N", type=_limit, help="rows per page, 1..1000 (default 100)")
    delayed_list.add_argument("--after", metavar="ID", help="the page after this id (printed under a full page)")
    delayed_list.add_argument("--node", metavar="NODE_ID", help="only the messages this node keeps")
    command(delayed, "show", "one pending delayed message").add_argument("id", metavar="ID")
    command(delayed, "cancel", "cancel a pending delayed message").add_argument("id", metavar="ID")

    rules = command(sub, "rules", "SQL rules over messages and events, on every node").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    command(rules, "list", "every rule, with its metrics")
    command(rules, "show", "one rule: SQL, actions, metrics, last error").add_argument("rule_id", metavar="RULE_ID")
    add = command(rules, "add", "add (or replace) a rule on every node")
    add.add_argument("rule_id", metavar="RULE_ID")
    add.add_argument("sql", metavar="SQL", help='e.g. \'SELECT payload.temp AS t FROM "sensors/+/temp" WHERE t > 30\'')
    add.add_argument("--action", dest="actions", metavar="JSON", action="append", default=[],
                     help='an action table as JSON, e.g. \'{"type": "republish", "topic": "alerts/${clientid}"}\' (repeatable)')
    command(rules, "delete", "remove a rule added through the API, on every node").add_argument(
        "rule_id", metavar="RULE_ID")
    command(sub, "plugins", "this node's plugins and every hook callback, with their errors")
    bridges = command(sub, "bridges", "bridges to other brokers and HTTP services").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    command(bridges, "list", "every bridge on the node: target, state, queue, sent, dropped, last error")
    command(bridges, "show", "one bridge: its config, status and metrics").add_argument("bridge_id", metavar="ID")
    command(bridges, "add", "add or replace a bridge on every node").add_argument(
        "value", metavar="@FILE", help="the bridge's table: a JSON object, or TOML (id = ..., type = ..., ...)")
    command(bridges, "delete", "remove a bridge from every node").add_argument("bridge_id", metavar="ID")

    command(sub, "routes", "the cluster route table (filter -> nodes)")
    command(sub, "cluster", "members, current partitions (netsplits) and their history")
    command(sub, "streams", "durable streams, with this node's counts and bytes")
    return p


_CLIENT_QUERY = ("clientid_prefix", "username", "node", "connected", "limit", "after")
_SUBS_QUERY = ("topic", "clientid", "node", "limit", "after")


def _request(args: argparse.Namespace) -> Request:
    command, action = args.command, getattr(args, "action", None)
    if command in ("clients", "sessions"):
        if action == "list":
            return Request("GET", "/api/v1/clients" + _query(args, _CLIENT_QUERY))
        if action == "show":
            return Request("GET", f"/api/v1/clients/{_path_id(args.client_id)}")
        if action == "kick":
            return Request("POST", f"/api/v1/clients/{_path_id(args.client_id)}/kick")
        return Request("DELETE", f"/api/v1/sessions/{_path_id(args.client_id)}")
    if command == "subscriptions":
        return Request("GET", "/api/v1/subscriptions" + _query(args, _SUBS_QUERY))
    if command == "delayed":
        if action == "list":
            return Request("GET", "/api/v1/delayed" + _query(args, ("limit", "after", "node")))
        return Request("GET" if action == "show" else "DELETE", f"/api/v1/delayed/{_path_id(args.id)}")
    if command == "config":
        if action == "set":
            return Request("PUT", f"/api/v1/config/{quote(args.key, safe='')}", {"value": args.value})
        if action == "get":
            return Request("GET", f"/api/v1/config/{quote(args.key, safe='')}")
        return Request("GET", "/api/v1/config")
    if command == "rules":
        if action == "add":
            return Request("POST", "/api/v1/rules", {"id": args.rule_id, "sql": args.sql, "actions": args.actions})
        if action == "show":
            return Request("GET", f"/api/v1/rules/{quote(args.rule_id, safe='')}")
        if action == "delete":
            return Request("DELETE", f"/api/v1/rules/{quote(args.rule_id, safe='')}")
        return Request("GET", "/api/v1/rules")
    if command == "bridges":
        if action == "show":
            return Request("GET", f"/api/v1/bridges/{_path_id(args.bridge_id)}")
        if action == "delete":
            return Request("DELETE", f"/api/v1/bridges/{_path_id(args.bridge_id)}")
        if action == "add":
            return Request("POST", "/api/v1/bridges", args.table)
        return Request("GET", "/api/v1/bridges")
    return Request("GET", f"/api/v1/{command}")


_TABLES: dict[tuple[str, str | None], Callable[[dict[str, Any]], str]] = {
    ("clients", "list"): ctl_tables.format_clients,
    ("clients", "show"): ctl_tables.format_client,
    ("clients", "kick"): ctl_tables.format_kicked,
    ("sessions", "list"): ctl_tables.format_sessions,
    ("sessions", "show"): ctl_tables.format_client,
    ("sessions", "delete"): ctl_tables.format_deleted,
    ("subscriptions", "list"): ctl_tables.format_subscriptions,
    ("config", "set"): ctl_tables.format_config_entry,
    ("config", "get"): ctl_tables.format_config_entry,
    ("config", "list"): ctl_tables.format_config,
    ("delayed", "list"): ctl_tables.format_delayed,
    ("delayed", "show"): ctl_tables.format_delayed_one,
    ("delayed", "cancel"): ctl_tables.format_delayed_one,
    ("rules", "list"): ctl_tables.format_rules,
    ("rules", "show"): ctl_tables.format_rule,
    ("rules", "add"): ctl_tables.format_rule,
    ("rules", "delete"): ctl_tables.format_deleted_rule,
    ("plugins", None): ctl_tables.format_plugins,
    ("bridges", "list"): ctl_tables.format_bridges,
    ("bridges", "show"): ctl_tables.format_bridge,
    ("bridges", "add"): ctl_tables.format_bridge,
    ("bridges", "delete"): ctl_tables.format_bridge_deleted,
    ("routes", None): ctl_tables.format_routes,
    ("cluster", None): ctl_tables.format_cluster,
    ("streams", None): ctl_tables.format_streams,
}


def _parse_actions(args: argparse.Namespace) -> str | None:
    """`rules add ... --action JSON`: each action's table; an error message or None."""
    if getattr(args, "command", None) != "rules" or getattr(args, "action", None) != "add":
        return None
    tables = []
    for text in args.actions:
        try:
            table = json.loads(text)
        except ValueError as exc:
            return f"--action {text!r}: not JSON ({exc})"
        if not isinstance(table, dict):
            return f"--action {text!r}: expected a JSON object with a type"
        tables.append(table)
    args.actions = tables
    return None


def _read_at_file(args: argparse.Namespace) -> str | None:
    """`config set acl @acl.toml`: the file's text is the value; `bridges add @FILE`: the
    file's JSON or TOML table is the body; an error message or None."""
    if args.command == "bridges" and getattr(args, "action", None) == "add":
        return _read_table(args)
    if getattr(args, "action", None) == "set" and args.value.startswith("@"):
        try:
            with open(args.value[1:], encoding="utf-8") as f:
                args.value = f.read()
        except OSError as exc:
            return f"cannot read {args.value[1:]}: {exc.strerror or exc}"
    return None


def _read_table(args: argparse.Namespace) -> str | None:
    import tomllib

    text = args.value
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            return f"cannot read {text[1:]}: {exc.strerror or exc}"
    try:
        args.table = json.loads(text)
    except ValueError:
        try:
            args.table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            return f"the bridge's table is neither JSON nor TOML: {exc}"
    if isinstance(args.table, dict) and list(args.table) == ["bridges"] and isinstance(args.table["bridges"], list) \
            and len(args.table["bridges"]) == 1:
        args.table = args.table["bridges"][0]  # a [[bridges]] table as in the node's config file
    return None


# A command with actions, given none, lists (`meshd ctl clients` is `meshd ctl clients list`).
_ACTIONS = {"clients": {"list", "show", "kick"}, "sessions": {"list", "show", "delete"},
            "subscriptions": {"list"}, "config": {"list", "get", "set"}, "delayed": {"list", "show", "cancel"},
            "rules": {"list", "show", "add", "delete"}, "bridges": {"list", "show", "add", "delete"}}


def _default_action(argv: list[str]) -> list[str]:
    for i, token in enumerate(argv):
        if token in _ACTIONS:
            rest = argv[i + 1:]
            if any(t in _ACTIONS[token] for t in rest) or any(t in ("-h", "--help") for t in rest):
                return argv
            return argv[:i + 1] + ["list"] + rest
        if token in ("routes", "cluster", "plugins", "streams"):
            return argv
    return argv


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse(_default_action(argv))
    problem = _read_at_file(args) if args.command in ("config", "bridges") else _parse_actions(args)
    if problem is not None:
        print(f"meshd ctl: {problem}", file=sys.stderr)
        return 2
    request = _request(args)
    try:
        status, body = request_json(args.http, request.method, request.path, request.body, token=args.token)
    except HttpClientError as exc:
        print(f"meshd ctl: {exc}", file=sys.stderr)
        return 1
    if status >= 400:
        message = body.get("error") if isinstance(body, dict) else body
        print(f"meshd ctl: {message}", file=sys.stderr)
        if isinstance(body, dict):
            for m in body.get("missing", []):
                print(f"missing: {m['node']} ({m['reason']})", file=sys.stderr)
        return 2 if status == 400 else 1
    if args.json or not isinstance(body, dict):
        print(json.dumps(body, indent=2))
    else:
        print(_TABLES[args.command, getattr(args, "action", None)](body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

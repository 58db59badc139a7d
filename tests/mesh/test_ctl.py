"""`meshd ctl` against a real node: --json/--http/--token anywhere on the line, tables
otherwise, `config list/get` with sources, and usage errors of two lines."""

from __future__ import annotations

import json

import pytest

from mesh import cli
from tests.support import Client


def ctl(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["ctl", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def http(node) -> str:
    return f"127.0.0.1:{node.ports['http']}"


@pytest.mark.parametrize("command", [["routes"], ["cluster"], ["config", "list"], ["config", "get", "max_inflight"],
                                     ["clients", "list"], ["sessions", "list"], ["subscriptions", "list"]])
def test_json_and_http_anywhere_on_the_line(capsys, http, command) -> None:
    answers = []
    for argv in (["--json", "--http", http, *command], [*command, "--json", "--http", http],
                 [command[0], "--http", http, *command[1:], "--json"]):
        rc, out, err = ctl(capsys, *argv)
        assert rc == 0, err
        answers.append(json.loads(out))
    for answer in answers:
        answer.pop("uptime_s", None)
    assert answers[0] == answers[1] == answers[2]


@pytest.mark.parametrize("command", ["clients", "sessions", "subscriptions", "config"])
def test_a_command_given_no_action_lists(capsys, http, command) -> None:
    rc, listed, err = ctl(capsys, command, "list", "--json", "--http", http)
    assert rc == 0, err
    rc, bare, err = ctl(capsys, command, "--json", "--http", http)
    assert rc == 0, err
    drop_uptime = lambda text: {k: v for k, v in json.loads(text).items() if k != "uptime_s"}  # noqa: E731
    assert drop_uptime(bare) == drop_uptime(listed)


def test_token_anywhere_on_the_line(capsys, node_factory) -> None:
    node = node_factory(api_token="s3cret")
    http = f"127.0.0.1:{node.ports['http']}"
    rc, _, err = ctl(capsys, "routes", "--http", http)
    assert rc == 1 and "bearer token" in err
    assert ctl(capsys, "routes", "--http", http, "--token", "s3cret")[0] == 0
    assert ctl(capsys, "--token", "s3cret", "clients", "list", "--http", http)[0] == 0


def test_clients_sessions_subscriptions_as_tables(capsys, node, http) -> None:
    c = Client("table-client", version=5)
    c.connect(node.mqtt_port, keepalive=45)
    c.subscribe("t/+/x", 1)
    rc, out, _ = ctl(capsys, "clients", "list", "--http", http)
    assert rc == 0
    header, row, footer = out.splitlines()
    assert header.split() == ["CLIENTID", "NODE", "CONNECTED", "ADDRESS", "USERNAME", "PROTO", "KEEPALIVE", "SUBS",
                              "INFLIGHT", "QUEUED"]
    assert row.split()[:3] == ["table-client", "test-node", "yes"] and row.split()[5:8] == ["5", "45", "1"]
    assert footer == "1 of 1 clients"
    rc, out, _ = ctl(capsys, "subscriptions", "list", "--topic", "t/1/x", "--http", http)
    assert out.splitlines()[1].split() == ["t/+/x", "table-client", "test-node", "1", "0", "0", "0"]
    rc, out, _ = ctl(capsys, "clients", "show", "table-client", "--http", http)
    assert "keepalive" in out and "t/+/x" in out
    rc, out, _ = ctl(capsys, "sessions", "delete", "table-client", "--http", http)
    assert rc == 0 and out.strip() == "session table-client ended on test-node"
    rc, _, err = ctl(capsys, "sessions", "show", "table-client", "--http", http)
    assert rc == 1 and "table-client" in err


def test_paging_prints_the_next_cursor(capsys, node, http) -> None:
    clients = [Client(f"page-{i}", version=5) for i in range(3)]
    for c in clients:
        c.connect(node.mqtt_port)
    rc, out, _ = ctl(capsys, "clients", "list", "--limit", "2", "--http", http)
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ["page-0", "page-1"] and lines[3] == "2 of 3 clients"
    assert lines[4].startswith("next page: --after ")
    rc, out, _ = ctl(capsys, "clients", "list", "--limit", "2", "--after", lines[4].split()[-1], "--http", http)
    assert out.splitlines()[1].split()[0] == "page-2" and "next page" not in out


def test_config_list_and_get_show_value_and_source(capsys, node_factory) -> None:
    node = node_factory(max_inflight=7)
    http = f"127.0.0.1:{node.ports['http']}"
    rc, out, _ = ctl(capsys, "config", "list", "--http", http)
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert rows["max_inflight"] == ["7", "flag", "(--max-inflight)"]
    assert rows["receive_maximum"] == ["1024", "default"]
    assert rows["node_id"][0] == "test-node"
    assert ctl(capsys, "config", "set", "max_queued_messages", "4", "--http", http)[0] == 0
    rc, out, _ = ctl(capsys, "config", "get", "max_queued_messages", "--http", http)
    value_row = out.splitlines()[1].split()
    assert value_row[:4] == ["max_queued_messages", "4", "cluster", "origin=test-node"]


@pytest.mark.parametrize("argv, usage", [
    (["ctl", "routes", "--bogus"], "usage: meshd ctl routes [-h]"),
    (["ctl", "--bogus", "routes"], "usage: meshd ctl routes [-h]"),
    (["ctl", "clients", "list", "--limit", "0"], "usage: meshd ctl clients list [-h]"),
    (["ctl", "config", "get"], "usage: meshd ctl config get [-h]"),
    (["ctl", "nonsense"], "usage: meshd ctl [-h]"),
    (["--no-such-flag"], "usage: meshd [run] [--config FILE]"),
    (["--max-inflight"], "usage: meshd [run] [--config FILE]"),
    (["members", "--bogus"], "usage: meshd members [-h] [--http HOST:PORT]"),
])
def test_usage_errors_are_one_line_and_the_usage_line(capsys, argv, usage) -> None:
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(("meshd ctl", "meshd:", "meshd members:")) and "usage" not in lines[0]
    assert lines[1].startswith(usage)


def test_unreachable_node_is_one_line(capsys) -> None:
    rc, out, err = ctl(capsys, "clients", "list", "--http", "127.0.0.1:1")
    assert rc == 1 and out == "" and err.count("\n") == 1 and "127.0.0.1:1" in err


def test_kick_through_ctl(capsys, node, http) -> None:
    c = Client("kick-me", version=5)
    c.connect(node.mqtt_port)
    rc, out, _ = ctl(capsys, "clients", "kick", "kick-me", "--http", http)
    assert rc == 0 and out.strip() == "kicked kick-me on test-node"
    rc_reason, _ = c.disconnects.get(timeout=10)
    assert rc_reason.value == 0x98
    rc, _, err = ctl(capsys, "clients", "kick", "nobody", "--http", http)
    assert rc == 1 and "nobody: not connected to any member that answered" in err

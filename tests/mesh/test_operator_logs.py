"""Operator log lines (README "Logs"): one key=value line per event, the same as JSON
with `--log-format json`, and never a payload, a password or a token.

Client and config events on a real node in this process (real sockets, paho clients,
records read with caplog); the JSON format and the secrets on a real `meshd` process.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

from mesh.http_client import request_json
from mesh.logs import setup_logging
from oplog import EVENT_ATTR, FIELDS_ATTR, Event, format_fields, log_event
from tests.support import TIMEOUT, Client, MeshdProcess, RunningNode, run_cli, wait_for

ROOT = Path(__file__).resolve().parents[2]


def events(caplog: pytest.LogCaptureFixture, event: Event) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, EVENT_ATTR, None) == event.value]


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return getattr(record, FIELDS_ATTR)


def one(caplog: pytest.LogCaptureFixture, event: Event, **match: Any) -> dict[str, Any]:
    """Wait for exactly one `event` line whose fields include `match`; its fields."""
    def found() -> list[logging.LogRecord]:
        return [r for r in events(caplog, event) if all(fields(r).get(k) == v for k, v in match.items())]

    (record,) = wait_for(found, TIMEOUT, f"{event} {match}")
    line = record.getMessage()
    assert line.startswith(f"{event} ") and "\n" not in line
    for k, v in match.items():
        assert f" {k}=" in line, line
    assert record.levelno == logging.INFO
    return fields(record)


# -- the line's shape ----------------------------------------------------------


def test_key_value_line_quotes_what_would_split_it():
    line = format_fields("client.refused", {"client_id": "c 1", "code": "0x87", "detail": 'say "no"', "empty": "",
                                            "n": 3, "ok": True, "nothing": None, "sides": frozenset({"b", "a"})})
    assert line == ('client.refused client_id="c 1" code=0x87 detail="say \\"no\\"" empty="" n=3 ok=true '
                    'nothing=none sides=a,b')


def test_json_format_gives_the_event_and_its_fields_as_keys():
    buf = io.StringIO()
    handler = setup_logging("info", stream=buf, log_format="json")
    try:
        log = logging.getLogger("meshd.test")
        log_event(log, Event.MEMBER_DEAD, logging.WARNING, member="b", incarnation=3, peers=("z", "y"))
        log.info("plain %s", "text")
    finally:
        logging.getLogger().removeHandler(handler)
    first, second = (json.loads(line) for line in buf.getvalue().splitlines())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first.pop("ts"))
    assert first == {"level": "WARNING", "logger": "meshd.test", "event": "member.dead", "member": "b",
                     "incarnation": 3, "peers": ["y", "z"]}
    assert second["msg"] == "plain text" and "event" not in second


def test_setup_refuses_an_unknown_format():
    with pytest.raises(ValueError, match="log format"):
        setup_logging("info", log_format="xml")


def test_readme_lists_every_event_name():
    readme = (ROOT / "README.md").read_text()
    missing = [e.value for e in Event if f"`{e.value}`" not in readme]
    assert not missing, f"README 'Logs' does not list {missing}"


def stays_away(client: Client) -> Client:
    """No paho auto-reconnect: a client the node closed stays closed."""
    client.c.reconnect_delay_set(min_delay=300, max_delay=300)
    return client


# -- client events on a real node -----------------------------------------------


def test_connect_takeover_disconnect_and_expiry_lines(node: RunningNode, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO)
    first = stays_away(Client("c1", version=5, clean=False))
    first.connect(node.mqtt_port, keepalive=20, expiry=30)
    f = one(caplog, Event.CLIENT_CONNECTED, client_id="c1")
    first_address = f.pop("address")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", first_address)
    assert f == {"client_id": "c1", "listener": "tcp", "protocol": 5, "clean": False, "expiry": 30, "keepalive": 20,
                 "session_present": False, "username": None}

    second = Client("c1", version=4, clean=False)
    second.connect(node.mqtt_port, keepalive=7)
    taken = one(caplog, Event.CLIENT_TAKEN_OVER, client_id="c1")
    assert taken["from_connection"] == first_address and taken["address"] != first_address
    gone = one(caplog, Event.CLIENT_DISCONNECTED, client_id="c1", address=first_address)
    assert (gone["reason"], gone["code"]) == ("session_taken_over", "0x8E")
    again = one(caplog, Event.CLIENT_CONNECTED, client_id="c1", protocol=4)
    assert (again["clean"], again["expiry"], again["keepalive"], again["session_present"]) == (False, "never", 7, True)

    second.drop()  # no DISCONNECT: the socket just closes
    lost = one(caplog, Event.CLIENT_DISCONNECTED, client_id="c1", address=again["address"])
    assert (lost["reason"], lost["code"]) == ("connection_lost", None)

    brief = Client("brief", version=5)
    brief.connect(node.mqtt_port, expiry=5)
    brief.disconnect()
    bye = one(caplog, Event.CLIENT_DISCONNECTED, client_id="brief")
    assert (bye["reason"], bye["code"]) == ("client_disconnect", "0x00")
    # Its session outlives it by 5 s: run the broker's timers past that deadline.
    node.call(node.node.broker.handle_timers, time.time() + 60)
    assert one(caplog, Event.SESSION_EXPIRED, client_id="brief") == {"client_id": "brief", "expiry": 5, "while_down": False}


def test_kick_is_a_disconnect_by_administrative_action(node_factory, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO)
    node = node_factory()
    c = stays_away(Client("kicked", version=5))
    c.connect(node.mqtt_port)
    status, _ = request_json(f"127.0.0.1:{node.ports['http']}", "POST", "/api/v1/clients/kicked/kick")
    assert status == 200
    gone = one(caplog, Event.CLIENT_DISCONNECTED, client_id="kicked")
    assert (gone["reason"], gone["code"]) == ("administrative_action", "0x98")


def write_passwords(path: Path, **users: str) -> str:
    for user, password in users.items():
        out = run_cli(["passwd", str(path), user, "--password", password])
        assert out.returncode == 0, out.stderr
    return str(path)


def test_refused_line_has_the_reason_code_and_no_password(node_factory, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    node = node_factory(allow_anonymous=False, password_file=write_passwords(tmp_path / "pw", alice="wonderland"))
    intruder = Client("intruder", version=5)
    intruder.c.username_pw_set("alice", "not-the-password-4711")
    with pytest.raises(ConnectionError):
        intruder.connect(node.mqtt_port)
    refused = one(caplog, Event.CLIENT_REFUSED, client_id="intruder")
    assert refused["code"] == "0x86" and refused["reason"] == "bad_user_name_or_password"
    assert refused["username"] == "alice" and refused["listener"] == "tcp"
    assert not events(caplog, Event.CLIENT_CONNECTED)
    assert "not-the-password-4711" not in caplog.text


def test_config_change_line_names_key_value_and_origin(node: RunningNode, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO)
    status, _ = request_json(f"127.0.0.1:{node.ports['http']}", "PUT", "/api/v1/config/max_inflight", {"value": 7})
    assert status == 200
    applied = one(caplog, Event.CONFIG_APPLIED, key="max_inflight")
    assert (applied["value"], applied["origin"]) == (7, "test-node") and applied["hlc"]


# -- the JSON format and secrets on a real process -------------------------------


def test_json_log_of_a_run_with_passwords_tokens_and_payloads_holds_none_of_them(tmp_path: Path):
    secrets = {
        "password": "pa55-wonderland-9137",
        "wrong password": "guess-0000-wrong",
        "api token": "tok-5b8e1f0c-api",
        "cluster key": base64.b64encode(b"K" * 32).decode(),
        "payload": "payload-7f3a-confidential",
        "will payload": "will-payload-c0ffee",
        "retained payload": "retained-payload-9d2c",
    }
    pw = write_passwords(tmp_path / "pw", alice=secrets["password"])
    node = MeshdProcess(str(tmp_path / "node"), "--log-format", "json", "--log-level", "debug",
                        "--password-file", pw, "--no-allow-anonymous", "--api-token", secrets["api token"],
                        "--cluster-key", secrets["cluster key"], http=True).start()
    try:
        sub = Client("sub", version=5)
        sub.c.username_pw_set("alice", secrets["password"])
        sub.connect(node.port)
        sub.subscribe("t/#", 1)
        pub = stays_away(Client("pub", version=5))
        pub.c.username_pw_set("alice", secrets["password"])
        pub.connect(node.port, will=("t/will", secrets["will payload"].encode(), 1, False))
        pub.publish("t/a", secrets["payload"].encode(), qos=1)
        pub.publish("t/r", secrets["retained payload"].encode(), qos=1, retain=True)
        sub.expect(2)
        bad = Client("bad", version=5)
        bad.c.username_pw_set("alice", secrets["wrong password"])
        with pytest.raises(ConnectionError):
            bad.connect(node.port)
        status, _ = request_json(node.http_addr, "POST", "/api/v1/clients/pub/kick", token=secrets["api token"])
        assert status == 200
        sub.expect(1)  # the will
        sub.disconnect()
    finally:
        assert node.stop() == 0
    lines = [json.loads(line) for line in node.output().splitlines()]
    by_event: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        assert {"ts", "level", "logger"} <= line.keys() and ("event" in line or "msg" in line)
        if "event" in line:
            by_event.setdefault(line["event"], []).append(line)
    assert {e["client_id"] for e in by_event["client.connected"]} == {"sub", "pub"}
    assert all(e["username"] == "alice" for e in by_event["client.connected"])
    assert [(e["client_id"], e["code"]) for e in by_event["client.refused"]] == [("bad", "0x86")]
    assert {(e["client_id"], e["reason"]) for e in by_event["client.disconnected"]} == {
        ("pub", "administrative_action"), ("sub", "client_disconnect")}
    text = node.output()
    leaked = [name for name, secret in secrets.items() if secret in text]
    assert not leaked, f"the log holds the {leaked}"

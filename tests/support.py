"""Shared test helpers: a real node running in its own thread, and paho clients.

The node runs its own `trio.run` in a thread, so tests can drive it with ordinary
blocking clients (paho-mqtt, mosquitto_pub/sub, raw sockets) exactly as users do.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import paho.mqtt.client as mqtt
import trio
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from mesh.config import load_settings
from mesh.http_client import HttpClientError
from mesh.compose import build_node
from mesh.node import Node

TIMEOUT = 10.0


def node_settings(data_dir: str, **overrides: Any) -> Any:
    flags: dict[str, object] = {
        "node_id": "test-node",
        "data_dir": data_dir,
        "mqtt": "127.0.0.1:0",
        "ws": "127.0.0.1:0",
        "http": "127.0.0.1:0",
        "gossip": "127.0.0.1:0",
        "mdns": False,
        "trace": False,
        "sys_interval": 0,
    }
    flags.update({k: v for k, v in overrides.items()})
    return load_settings(flags, env={})


class RunningNode:
    """A Node served by `trio.run` in a background thread."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.node: Node | None = None
        self.ports: dict[str, int] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="meshd-test-node")

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # surfaced to the test by start()/stop()
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.node = build_node(self.settings)
        async with trio.open_nursery() as nursery:
            self.ports = await nursery.start(self.node.serve)
            self._ready.set()

    def start(self) -> "RunningNode":
        self._thread.start()
        if not self._ready.wait(TIMEOUT):
            raise TimeoutError("node did not start")
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn: Any, *args: Any) -> Any:
        """Run a sync function in the node's thread (to inspect broker state safely)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def stop(self) -> None:
        if self._token is not None and self._thread.is_alive():
            try:
                assert self.node is not None  # set before the token
                trio.from_thread.run_sync(self.node.request_shutdown, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(TIMEOUT)
        if self._error is not None and not isinstance(self._error, KeyboardInterrupt):
            raise self._error

    @property
    def mqtt_port(self) -> int:
        return self.ports["mqtt"]


class Client:
    """A paho-mqtt client with blocking helpers and a queue of received messages."""

    def __init__(
        self,
        client_id: str = "",
        *,
        version: int = 5,
        transport: str = "tcp",
        clean: bool = True,
        userdata: Any = None,
    ) -> None:
        protocol = {5: mqtt.MQTTv5, 4: mqtt.MQTTv311, 3: mqtt.MQTTv31}[version]
        kwargs: dict[str, Any] = {}
        if version != 5:
            kwargs["clean_session"] = clean
        self.version = version
        self.clean = clean
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, transport=transport, **kwargs)
        if transport == "websockets":
            self.c.ws_set_options(path="/mqtt")
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connack: queue.Queue[tuple[Any, Any, Any]] = queue.Queue()
        self.subacks: queue.Queue[Any] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.published: queue.Queue[Any] = queue.Queue()
        self.c.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props))
        self.c.on_message = lambda c, u, msg: self.messages.put(msg)
        self.c.on_subscribe = lambda c, u, mid, rcs, props: self.subacks.put(rcs)
        self.c.on_unsubscribe = lambda c, u, mid, rcs, props: self.subacks.put(rcs)
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put((rc, props))
        self.c.on_publish = lambda c, u, mid, rc, props: self.published.put((mid, rc))

    def connect(self, port: int, *, keepalive: int = 60, expiry: int | None = None, will: tuple | None = None, properties: dict | None = None, clean_start: bool | None = None, host: str = "127.0.0.1") -> Any:
        props = None
        if self.version == 5:
            props = PahoProperties(PacketTypes.CONNECT)
            if expiry is not None:
                props.SessionExpiryInterval = expiry
            for k, v in (properties or {}).items():
                setattr(props, k, v)
        if will is not None:
            topic, payload, qos, retain, *rest = will
            wprops = None
            if rest and self.version == 5:
                wprops = PahoProperties(PacketTypes.WILLMESSAGE)
                for k, v in rest[0].items():
                    setattr(wprops, k, v)
            self.c.will_set(topic, payload, qos, retain, properties=wprops)
        kwargs: dict[str, Any] = {}
        if self.version == 5:
            kwargs["clean_start"] = self.clean if clean_start is None else clean_start
            kwargs["properties"] = props
        self.c.connect(host, port, keepalive, **kwargs)
        self.c.loop_start()
        flags, rc, props = self.connack.get(timeout=TIMEOUT)
        if rc.is_failure:
            raise ConnectionError(f"CONNACK {rc}")
        return flags, rc, props

    def subscribe(self, topic: str, qos: int = 0, **options: Any) -> Any:
        if self.version == 5:
            from paho.mqtt.subscribeoptions import SubscribeOptions

            sub_id = options.pop("sub_id", None)
            props = None
            if sub_id is not None:
                props = PahoProperties(PacketTypes.SUBSCRIBE)
                props.SubscriptionIdentifier = sub_id
            self.c.subscribe(topic, options=SubscribeOptions(qos=qos, **options), properties=props)
        else:
            self.c.subscribe(topic, qos)
        return self.subacks.get(timeout=TIMEOUT)

    def unsubscribe(self, topic: str) -> Any:
        self.c.unsubscribe(topic)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False, properties: dict | None = None, wait: bool = True) -> Any:
        props = None
        if properties and self.version == 5:
            props = PahoProperties(PacketTypes.PUBLISH)
            for k, v in properties.items():
                setattr(props, k, v)
        info = self.c.publish(topic, payload, qos, retain, properties=props)
        if wait and qos > 0:
            info.wait_for_publish(TIMEOUT)
            if not info.is_published():
                raise TimeoutError(f"no ack for {topic}")
        return info

    def expect(self, n: int = 1, timeout: float = TIMEOUT) -> list[mqtt.MQTTMessage]:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"expected {n} messages, got {len(out)}: {[m.topic for m in out[:10]]}...")
            try:
                out.append(self.messages.get(timeout=left))
            except queue.Empty:
                continue
        return out

    def expect_none(self, wait: float = 0.3) -> None:
        try:
            msg = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message on {msg.topic}: {msg.payload!r}")

    def disconnect(self, properties: dict | None = None, reason: int | None = None) -> None:
        kwargs: dict[str, Any] = {}
        if self.version == 5:
            if properties:
                p = PahoProperties(PacketTypes.DISCONNECT)
                for k, v in properties.items():
                    setattr(p, k, v)
                kwargs["properties"] = p
            if reason is not None:
                from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

                kwargs["reasoncode"] = PahoReasonCode(PacketTypes.DISCONNECT, identifier=reason)
        self.c.disconnect(**kwargs)
        self.c.loop_stop()

    def drop(self) -> None:
        """Close the socket without DISCONNECT, as a crashed client would."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (gossip uses one port for both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = u.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no port free for both TCP and UDP")


def mosquitto_available() -> bool:
    return shutil.which("mosquitto_pub") is not None and shutil.which("mosquitto_sub") is not None


def meshd_command() -> list[str]:
    return [sys.executable, "-m", "mesh.cli"]


def subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHD_")}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(args: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(meshd_command() + args, capture_output=True, text=True, timeout=timeout, env=subprocess_env())


START_TIMEOUT = 60.0  # an upper bound on start-up under load; a start returns as soon as the node is ready


def wait_ready(proc: subprocess.Popen, ready_file: str, output: Any, timeout: float = START_TIMEOUT) -> dict[str, Any]:
    """Wait until `meshd --ready-file` wrote `ready_file` (every listener bound) and
    return what it holds (`ports`: the bound ports). `output()` gives the node's log
    for the error when it exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(ready_file, encoding="utf-8") as f:
                return json.load(f)  # written atomically: whole or absent
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"meshd exited early (code {proc.returncode}): {output()}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"meshd wrote no ready file within {timeout:.0f} s: {output()}")
        time.sleep(0.02)  # polling the file: the condition, not a guess at start-up time


# Every `meshd` child process started in this test process, for the check after each
# test (tests/conftest.py) that none ended by itself with a traceback.
LAUNCHED: list["MeshdProcess"] = []
TRACEBACK = "Traceback (most recent call last)"


class MeshdProcess:
    """`meshd` as a real child process on 127.0.0.1 (MQTT only unless told otherwise).

    Listeners bind port 0 unless a port is given (a port picked free beforehand can be
    taken by anyone before meshd binds it); `start` returns once the node's ready file
    says every listener is bound, and the bound ports are read from it. The node's
    output goes to a file next to its data dir (`output()`), never to a pipe that
    nobody reads (a full pipe would stop the node at its next log line)."""

    def __init__(self, data_dir: str, *extra: str, port: int | None = None, http: bool = False,
                 gossip_port: int | None = None, node_id: str | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or 0  # MQTT: the bound port once started
        self.http_port: int | None = 0 if http else None
        self.gossip_port = gossip_port or 0
        self.node_id = node_id
        self.extra = extra
        base = data_dir.rstrip(os.sep)
        self.ready_file = base + ".ready.json"
        self.log_file = base + ".log"
        self.proc: subprocess.Popen | None = None
        self.ready: dict[str, Any] = {}
        self._log_offset = 0  # where this run's output starts in the log file

    @property
    def http_addr(self) -> str:
        assert self.http_port, "started with http=True?"
        return f"127.0.0.1:{self.http_port}"

    @property
    def gossip_addr(self) -> str:
        """The gossip address to seed other nodes with."""
        return f"127.0.0.1:{self.gossip_port}"

    def start(self, timeout: float = START_TIMEOUT) -> "MeshdProcess":
        """Start and wait until every listener is bound (the ready file)."""
        self.launch()
        return self.wait_started(timeout)

    def launch(self) -> None:
        """Start the process; `wait_started` waits for it to be ready."""
        ident = ["--node-id", self.node_id] if self.node_id else []
        if os.path.exists(self.ready_file):
            os.remove(self.ready_file)
        os.makedirs(os.path.dirname(self.log_file) or ".", exist_ok=True)
        with open(self.log_file, "a", encoding="utf-8") as log:
            self._log_offset = log.tell()
            LAUNCHED.append(self)
            self.proc = subprocess.Popen(
                meshd_command() + ident + [
                    "--data-dir", self.data_dir, "--mqtt", f"127.0.0.1:{self.port}", "--ws", "off",
                    "--http", "off" if self.http_port is None else f"127.0.0.1:{self.http_port}",
                    "--gossip", f"127.0.0.1:{self.gossip_port}", "--no-mdns", "--no-trace",
                    "--ready-file", self.ready_file, *self.extra,
                ],
                stdout=log, stderr=subprocess.STDOUT, text=True, env=subprocess_env(),
            )

    def wait_started(self, timeout: float = START_TIMEOUT) -> "MeshdProcess":
        assert self.proc is not None, "launch() first"
        self.ready = wait_ready(self.proc, self.ready_file, self.output, timeout)
        ports = self.ready["ports"]
        self.port, self.gossip_port = ports["mqtt"], ports["gossip"]
        if self.http_port is not None:
            self.http_port = ports["http"]
        if self.node_id is None:
            self.node_id = self.ready["node_id"]
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown path runs."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(10)

    def output(self) -> str:
        """Everything the node logged so far (all its runs from this object's data dir)."""
        try:
            with open(self.log_file, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def crash(self) -> str | None:
        """This run's output if the process ended by itself with a traceback (a bug in
        the node: an exception no one caught ends it), else None. A run still going, or
        ended by a signal (the test's kill, stop or SIGKILL), is no crash."""
        if self.proc is None or self.proc.poll() is None or self.proc.returncode < 0:
            return None
        with open(self.log_file, encoding="utf-8", errors="replace") as f:
            f.seek(self._log_offset)
            run = f.read()
        return run if TRACEBACK in run else None

    def __enter__(self) -> "MeshdProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start_all(nodes: "list[MeshdProcess]", timeout: float = START_TIMEOUT) -> None:
    """Launch every node at once, then wait for each: one burst of start-ups, not a
    row of them while the first nodes already gossip (on failure all are stopped)."""
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_started(timeout)
    except BaseException:
        for node in nodes:
            node.__exit__()
        raise


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll `predicate` in real time until it returns something truthy (returned) or
    `timeout` passes (AssertionError naming `what` and the last answer). A node that is
    not listening yet, or restarting, is an answer of "not yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (OSError, HttpClientError) as exc:
            last = exc
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}: {last}")


async def until(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    """In a Trio test: until `cond()` holds (virtual or real time), or TooSlowError."""
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.05)

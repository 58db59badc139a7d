#!/usr/bin/env python3
"""Do two versions of meshd still form one cluster? Runs real nodes of an older commit
and of this tree side by side on 127.0.0.1 and checks what crosses the wire between
them: membership (SWIM over UDP), route sync, forwarded publishes (mesh links),
session handoff, in both directions, a stream replay on a new node (the older
nodes, which do not know the `stream_read` query, hold no part of it), and session
replication beside nodes that predate it (the new node, with `session_replicas` 2 in
`sync` mode, can place no copy on them: its persistent session runs under-replicated,
and every message acknowledged for it is delivered, none waiting for a copy that
cannot be).

    python scripts/compat_check.py                  # against OLD_DEFAULT
    python scripts/compat_check.py --old v0.1.0     # any commit, tag or branch

Then two nodes, one of `--old-replicating` (a commit with session replication,
OLD_REPLICATING by default) and one of this tree, copy a persistent session to each
other: the client's owner is killed with 50 messages queued and acknowledged (in
`sync` mode: each on the other node's disk first), and the client, back on the other
node, gets its session and all 50, in both directions.

The old commit is exported with `git archive` into a temporary directory; each node is
`python -m mesh.cli` with PYTHONPATH set to its tree. Exit 0 when every check passes,
1 when one fails (its reason printed), 2 when the old commit cannot be exported.
Bounded: every wait has a timeout; every process started here is killed on exit.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mesh.http_client import request_json  # noqa: E402
from tests.support import wait_for  # noqa: E402
from tests.support import Client, free_port  # noqa: E402

# The last commit before the house (issue 19) changed the shape of every package.
OLD_DEFAULT = "9ea2f5a"
# The first commit with session replication (issue 29): a `repl` query per batch, no
# channels; this tree's owner falls back to queries for it.
OLD_REPLICATING = "e5edf2a"
REPLICATING = ("--session-replicas", "2", "--session-replication", "sync")
TIMEOUT = 30.0


class Node:
    """One `meshd` process running the code in `tree`."""

    def __init__(self, name: str, tree: Path, workdir: Path, seed: int | None, extra: tuple[str, ...] = ()) -> None:
        self.name = name
        self.tree = tree
        self.mqtt = free_port()
        self.http = free_port()
        self.gossip = free_port()
        self.log = open(workdir / f"{name}.log", "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESHD_")}
        env["PYTHONPATH"] = str(tree)
        args = [
            sys.executable, "-m", "mesh.cli", "--node-id", name, "--data-dir", str(workdir / name),
            "--mqtt", f"127.0.0.1:{self.mqtt}", "--ws", "off", "--http", f"127.0.0.1:{self.http}",
            "--gossip", f"127.0.0.1:{self.gossip}", "--no-mdns", "--no-trace", "--gossip-preset", "local",
        ]
        if seed is not None:
            args += ["--seed", f"127.0.0.1:{seed}"]
        args += list(extra)
        self.proc = subprocess.Popen(args, cwd=workdir, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        # The next node may name this one as its seed: a join that finds the seed not
        # yet listening is not retried once the joiner knows any other live member
        # (gossip.swim rejoins only when alone), so start nodes one after the other.
        try:
            wait_for(self.listening, TIMEOUT, f"{name} listens")
        except BaseException:
            self.stop()  # not in the caller's list yet: nobody else would
            raise

    def listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.mqtt), timeout=0.2).close()
            return True
        except OSError:
            assert self.proc.poll() is None, f"{self.name} exited early"
            return False

    def members(self) -> dict[str, str]:
        status, body = request_json(f"127.0.0.1:{self.http}", "GET", "/api/v1/members")
        return {m["id"]: m["state"] for m in body["members"]} if status == 200 else {}

    def metric(self, name: str) -> float | None:
        """One unlabelled sample of the node's /metrics, or None when it has none."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def routes(self) -> dict[str, set[str]]:
        status, body = request_json(f"127.0.0.1:{self.http}", "GET", "/api/v1/routes")
        return {r["filter"]: set(r["nodes"]) for r in body["routes"]} if status == 200 else {}

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def export(rev: str, into: Path) -> str:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"compat_check: cannot resolve {rev!r}: {commit.stderr.strip()}")
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", rev], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"compat_check: git archive {rev} failed")
    return commit.stdout.strip()


def forward(pub_node: Node, sub_node: Node, nodes: list[Node], tag: str) -> None:
    sub = Client(f"sub-{tag}", version=5)
    sub.connect(sub_node.mqtt)
    sub.subscribe(f"compat/{tag}/#", 1)
    for n in nodes:
        wait_for(lambda n=n: n.routes().get(f"compat/{tag}/#") == {sub_node.name}, TIMEOUT, f"{n.name} routes compat/{tag}/# to {sub_node.name}")
    pub = Client(f"pub-{tag}", version=4)
    pub.connect(pub_node.mqtt)
    for i in range(50):
        pub.publish(f"compat/{tag}/{i}", str(i).encode(), qos=1)
    got = [int(m.payload) for m in sub.expect(50)]
    assert got == list(range(50)), f"{pub_node.name} -> {sub_node.name}: got {got}"
    sub.expect_none(0.3)
    pub.disconnect()
    sub.disconnect()


def handoff(first: Node, second: Node, nodes: list[Node], tag: str) -> None:
    client_id = f"mover-{tag}"
    sub = Client(client_id, version=5, clean=False)
    sub.connect(first.mqtt, expiry=3600)
    sub.subscribe(f"move/{tag}/#", 1)
    for n in nodes:
        wait_for(lambda n=n: n.routes().get(f"move/{tag}/#") == {first.name}, TIMEOUT, f"{n.name} routes move/{tag}/# to {first.name}")
    sub.disconnect()
    pub = Client(f"pub-move-{tag}", version=5)
    pub.connect(first.mqtt)
    for i in range(20):
        pub.publish(f"move/{tag}/{i}", str(i).encode(), qos=1)
    pub.disconnect()
    again = Client(client_id, version=5, clean=False)
    flags, _, _ = again.connect(second.mqtt, expiry=3600)
    assert flags.session_present, f"{first.name} -> {second.name}: session not handed over"
    got = [int(m.payload) for m in again.expect(20)]
    assert got == list(range(20)), f"{first.name} -> {second.name}: queue {got}"
    again.disconnect()


def replication_beside_older(new: Node, old: Node, nodes: list[Node]) -> None:
    """A persistent session on the new node (2 copies, `sync`) while every other member
    predates replication: 50 QoS 1 messages published on an older node are each
    acknowledged within a second (an acknowledgement waits for no copy that cannot be
    made), the session is counted under-replicated, the client back on the new node
    gets all 50 in order, and the new node says once that the older members hold no
    copies (it does not take them for replicas that failed)."""
    client_id = "repl-compat"
    sub = Client(client_id, version=5, clean=False)
    sub.connect(new.mqtt, expiry=3600)
    sub.subscribe("repl/compat/#", 1)
    for n in nodes:
        wait_for(lambda n=n: n.routes().get("repl/compat/#") == {new.name}, TIMEOUT,
                 f"{n.name} routes repl/compat/# to {new.name}")
    sub.disconnect()
    pub = Client("pub-repl-compat", version=4)
    pub.connect(old.mqtt)
    slowest = 0.0
    for i in range(50):
        started = time.monotonic()
        pub.publish(f"repl/compat/{i}", str(i).encode(), qos=1)
        slowest = max(slowest, time.monotonic() - started)
    pub.disconnect()
    assert slowest < 1.0, f"a PUBACK took {slowest:.2f} s: it waited for a copy on an older node"
    # This session and the ones handed to the new node before count.
    wait_for(lambda: (new.metric("meshd_replication_under_replicated_sessions") or 0) >= 1, TIMEOUT,
             f"{new.name} counts the session under-replicated")
    again = Client(client_id, version=5, clean=False)
    flags, _, _ = again.connect(new.mqtt, expiry=3600)
    assert flags.session_present, "session lost"
    got = [int(m.payload) for m in again.expect(50)]
    assert got == list(range(50)), f"queue {got}"
    again.disconnect()
    # The older members are left out of placement as holding no copies (said once),
    # not replicas that failed (a WARNING each time they would be tried again).
    log = new.log_text()
    assert f"member {old.name} holds no session copies" in log, "the older member not left out as such"
    assert "failed (closed the query unanswered" not in log, "an older member taken for a failed replica"


def taken_over_from_the_other(owner: Node, other: Node, tag: str) -> None:
    """Two nodes, each with 2 copies of a session: a persistent session on `owner`,
    50 QoS 1 messages published on `other` (each PUBACK waited for `other`'s copy), the
    owner killed: the client on `other` gets its session and the 50, in order."""
    nodes = [owner, other]
    for n in nodes:
        wait_for(lambda n=n: sum(s == "alive" for s in n.members().values()) == 2, TIMEOUT, f"{n.name} sees 2 alive")
    client_id = f"xrep-{tag}"
    sub = Client(client_id, version=5, clean=False)
    sub.connect(owner.mqtt, expiry=3600)
    sub.subscribe(f"xrep/{tag}/#", 1)
    for n in nodes:
        wait_for(lambda n=n: n.routes().get(f"xrep/{tag}/#") == {owner.name}, TIMEOUT,
                 f"{n.name} routes xrep/{tag}/# to {owner.name}")
    sub.disconnect()
    pub = Client(f"pub-xrep-{tag}", version=4)
    pub.connect(other.mqtt)
    for i in range(50):
        pub.publish(f"xrep/{tag}/{i}", str(i).encode(), qos=1)
    pub.disconnect()
    owner.kill()
    wait_for(lambda: other.members().get(owner.name) != "alive", TIMEOUT, f"{other.name} sees {owner.name} dead")
    again = Client(client_id, version=5, clean=False)
    flags, _, _ = again.connect(other.mqtt, expiry=3600)
    assert flags.session_present, f"{owner.name} -> {other.name}: no session on the replica"
    got = [int(m.payload) for m in again.expect(50)]
    assert got == list(range(50)), f"{owner.name} -> {other.name}: queue {got}"
    again.disconnect()


def query_older(new: Node, older: list[Node]) -> None:
    """A cluster-wide question asked on a new node: the older ones, which know no cluster
    queries, are named missing (and, as the forward checks after this one show, their
    mesh links are not disturbed)."""
    status, body = request_json(f"127.0.0.1:{new.http}", "GET", "/api/v1/clients")
    assert status == 200, f"GET /api/v1/clients: {status} {body}"
    missing = sorted(m["node"] for m in body["missing"])
    assert missing == sorted(n.name for n in older), f"missing: {body['missing']}"


def stream_replay(new: Node) -> None:
    """A stream replay on a new node asks every member for its part: the older ones,
    which close the query unanswered, hold no part (not missing), and the replay ends
    with the new node's part and goes live."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.subscribeoptions import SubscribeOptions

    pub = Client("pub-stream", version=5)
    pub.connect(new.mqtt)
    for i in range(5):
        pub.publish(f"compat/stream/{i}", str(i).encode(), qos=1)
    sub = Client("sub-stream", version=5)
    sub.connect(new.mqtt)
    props = Properties(PacketTypes.SUBSCRIBE)
    props.UserProperty = [("replay-from", "earliest")]
    sub.c.subscribe("compat/stream/#", options=SubscribeOptions(qos=1), properties=props)
    codes = sub.subacks.get(timeout=TIMEOUT)
    assert [int(getattr(c, "value", c)) for c in codes] == [1], f"SUBACK {codes}"
    got = sub.expect(5)
    assert [m.payload for m in got] == [str(i).encode() for i in range(5)], [m.topic for m in got]
    pub.publish("compat/stream/live", b"live", qos=1)
    assert sub.expect(1)[0].payload == b"live"
    sub.expect_none(0.3)
    pub.disconnect()
    sub.disconnect()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", default=OLD_DEFAULT, help=f"the older commit (default {OLD_DEFAULT})")
    parser.add_argument("--old-replicating", default=OLD_REPLICATING,
                        help=f"an older commit with session replication (default {OLD_REPLICATING}; 'none' skips)")
    args = parser.parse_args(argv)
    failed = mixed(args.old)
    if failed or args.old_replicating == "none":
        return failed
    return replicating(args.old_replicating)


def run_checks(checks: list[tuple[str, Callable[[], None]]], nodes: list[Node], work: Path) -> int:
    for name, check in checks:
        started = time.monotonic()
        try:
            check()
        except AssertionError as exc:
            print(f"FAIL  {name}: {exc}  (logs in {work})")
            for n in nodes:
                n.stop()
                print(f"--- {n.name}\n" + (work / f"{n.name}.log").read_text()[-3000:])
            return 1
        print(f"ok    {name} ({time.monotonic() - started:.1f} s)")
    return 0


def replicating(rev: str) -> int:
    """A node of `rev` (with session replication) and one of this tree copy each
    other's sessions: a takeover from the other's copy, in both directions."""
    nodes: list[Node] = []
    with tempfile.TemporaryDirectory(prefix="meshd-compat-repl-") as tmp:
        work = Path(tmp)
        (work / "old").mkdir()
        old = export(rev, work / "old")
        print(f"old (replicating): {old}")
        try:
            a = Node("old-r", work / "old", work, seed=None, extra=REPLICATING)
            nodes.append(a)
            b = Node("new-r", ROOT, work, seed=a.gossip, extra=REPLICATING)
            nodes.append(b)

            def then_new_owner() -> None:
                c = Node("old-r2", work / "old", work, seed=b.gossip, extra=REPLICATING)
                nodes.append(c)
                taken_over_from_the_other(b, c, "n2o")

            return run_checks([
                ("replication: old owner killed, taken over from the new node's copy",
                 lambda: taken_over_from_the_other(a, b, "o2n")),
                ("replication: new owner killed, taken over from the old node's copy", then_new_owner),
            ], nodes, work)
        finally:
            for n in nodes:
                n.stop()


def mixed(rev: str) -> int:
    nodes: list[Node] = []
    with tempfile.TemporaryDirectory(prefix="meshd-compat-") as tmp:
        work = Path(tmp)
        (work / "old").mkdir()
        old = export(rev, work / "old")
        new = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        print(f"old: {old}  new: {new} (this tree)")
        try:
            a = Node("old-a", work / "old", work, seed=None)
            nodes.append(a)
            b = Node("new-b", ROOT, work, seed=a.gossip, extra=("--streams", '[{"filter": "compat/stream/#"}]',
                                                               "--session-replicas", "2", "--session-replication", "sync"))
            nodes.append(b)
            c = Node("old-c", work / "old", work, seed=b.gossip)
            nodes.append(c)
            checks: list[tuple[str, Callable[[], None]]] = [
                ("membership: every node sees 3 alive", lambda: [
                    wait_for(lambda n=n: sum(s == "alive" for s in n.members().values()) == 3, TIMEOUT, f"{n.name} sees 3 alive")
                    for n in nodes]),
                ("cluster query on new: the old nodes named missing", lambda: query_older(b, [a, c])),
                ("stream replay on new: the old nodes hold no part", lambda: stream_replay(b)),
                ("forward QoS 1: new -> old", lambda: forward(b, a, nodes, "n2o")),
                ("forward QoS 1: old -> new", lambda: forward(c, b, nodes, "o2n")),
                ("session handoff: old -> new", lambda: handoff(a, b, nodes, "o2n")),
                ("session handoff: new -> old", lambda: handoff(b, c, nodes, "n2o")),
                ("replication on new beside older nodes: degraded, nothing lost",
                 lambda: replication_beside_older(b, a, nodes)),
            ]
            return run_checks(checks, nodes, work)
        finally:
            for n in nodes:
                n.stop()


if __name__ == "__main__":
    sys.exit(main())

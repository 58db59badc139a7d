"""PartitionMonitor: the Trio shell (virtual time) and its surfaces on a real node
(`GET /api/v1/cluster`, `meshd ctl cluster`, `/metrics`, `$SYS/mesh/partitions`)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import trio
import trio.testing

from clock import TrioClock
from gossip.config import LOCAL
from mesh.http_client import request_json
from netsplit.detector import detector_for
from netsplit.monitor import PartitionMonitor
from netsplit.view import PartitionView
from tests.support import RunningNode, node_settings, run_cli


class FakeGossip:
    node_id = "n0"
    config = LOCAL

    def __init__(self) -> None:
        self.handlers: list[Callable[[str, str], None]] = []

    def on_member_change(self, handler: Callable[[str, str], None]) -> None:
        self.handlers.append(handler)

    def members(self) -> list[dict[str, Any]]:
        return []

    def change(self, member: str, state: str) -> None:
        for h in self.handlers:
            h(member, state)


class ListTrace:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def emit(self, **fields: Any) -> None:
        self.records.append(fields)


def test_monitor_detects_on_its_own_deadline_and_heals():
    async def main() -> None:
        gossip, trace = FakeGossip(), ListTrace()
        view = PartitionView(detector_for(gossip.node_id, gossip.config), clock=TrioClock())
        mon = PartitionMonitor(view, gossip, trace, clock=TrioClock())
        assert gossip.handlers == [mon.member_changed]
        seen: list[Any] = []
        mon.on_event(seen.append)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mon.run)
            for m in ("n1", "n2", "n3", "n4"):
                gossip.change(m, "alive")
            t0 = trio.current_time()
            gossip.change("n4", "dead")
            await trio.sleep(0.01)
            assert not mon.is_partitioned()  # still inside the window
            await trio.sleep(mon.detector.window)
            assert mon.is_partitioned() and mon.unreachable() == {"n4"} and mon.across_partition("n4")
            (det,) = [r for r in trace.records if r["kind"] == "partition_detected"]
            assert det["subject"] == "n0/1" and det["origin"] == "n0" and det["peers"] == "n4"
            assert det["majority"] is True and det["took_us"] == round(mon.detector.window * 1e6)
            assert abs(det["onset_ts_us"] / 1e6 - view.clock_offset - t0) < 1e-3
            snap = mon.snapshot()
            assert snap["partitions"][0]["remote"] == ["n4"] and snap["unreachable"] == ["n4"]
            gossip.change("n4", "alive")
            await trio.sleep(0)
            assert not mon.is_partitioned()
            healed = trace.records[-1]
            assert healed["kind"] == "partition_healed" and healed["subject"] == "n0/1" and healed["took_us"] == 0
            assert [h["event"] for h in mon.snapshot()["history"]] == ["partition_detected", "partition_healed"]
            assert [type(e).__name__ for e in seen] == ["PartitionDetected", "PartitionHealed"]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_cluster_endpoint_ctl_metrics_and_sys(tmp_path):
    node = RunningNode(node_settings(str(tmp_path), gossip_preset="local", node_id="solo")).start()
    try:
        http = f"127.0.0.1:{node.ports['http']}"
        status, body = request_json(http, "GET", "/api/v1/cluster")
        assert status == 200 and body["partitioned"] is False and body["partitions"] == []
        assert [m["id"] for m in body["members"]] == ["solo"]

        # a member we knew goes dead (as a cut cable would make it)
        assert node.node is not None
        mon = node.node.partitions
        node.call(mon.member_changed, "ghost", "alive")
        node.call(mon.member_changed, "ghost", "dead")
        _wait(lambda: request_json(http, "GET", "/api/v1/cluster")[1]["partitioned"])
        body = request_json(http, "GET", "/api/v1/cluster")[1]
        (p,) = body["partitions"]
        # one of two: an exact half, which goes to the smallest id ("ghost")
        assert p["remote"] == ["ghost"] and p["local"] == ["solo"] and p["majority"] is False
        assert body["unreachable"] == ["ghost"] and body["history"][0]["event"] == "partition_detected"

        out = run_cli(["ctl", "--http", http, "cluster"])
        assert out.returncode == 0, out.stderr
        assert f"PARTITION {p['id']}" in out.stdout and "unreachable ghost" in out.stdout

        _, text = _metrics(http)
        assert "meshd_partitions 1" in text and "meshd_partitions_detected_total 1" in text
        assert "meshd_unreachable_members 1" in text and "meshd_gossip_sweeps_total 0" in text
        assert "meshd_gossip_stale_verdicts_total 0" in text
        # of {ghost, solo} each holds half: the side with the smallest id ("ghost") has it
        assert request_json(http, "GET", "/api/v1/cluster")[1]["minority"] is True

        sys = dict(node.call(node.node.sys.mesh_values))
        value = json.loads(sys["$SYS/mesh/partitions"])
        assert value["partitioned"] is True and value["partitions"][0]["remote"] == ["ghost"]

        node.call(mon.member_changed, "ghost", "alive")
        _wait(lambda: not request_json(http, "GET", "/api/v1/cluster")[1]["partitioned"])
        _, text = _metrics(http)
        assert "meshd_partitions 0" in text and "meshd_partitions_healed_total 1" in text
    finally:
        node.stop()


def _metrics(http: str) -> tuple[int, str]:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{http}/metrics", timeout=5) as resp:
        return resp.status, resp.read().decode()

"""`meshd ctl sessions show ID`: the session's replication as its owner reports it."""

from __future__ import annotations

from mesh.ctl_tables import format_client


def test_the_replication_block_shows_copies_mode_epoch_sequence_and_each_replica() -> None:
    body = {
        "clientid": "c1", "node": "A", "connected": False,
        "subscriptions": [], "inflight": [], "mqueue": [], "missing": [],
        "replication": {"copies": 2, "mode": "sync", "epoch": "1795655259000.0@A", "seq": 1234,
                        "under_replicated": False, "replicas": [{"node": "B", "seq": 1230, "lag": 4}]},
    }
    out = format_client(body)
    assert "replication:" in out
    assert "epoch" in out and "1795655259000.0@A" in out and "1234" in out
    row = [line.split() for line in out.splitlines() if line.strip().startswith("B ")]
    assert row == [["B", "1230", "4"]]
    assert "{'copies'" not in out  # not dumped as a dict

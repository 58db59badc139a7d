#!/usr/bin/env python3
"""A long netsplit under load, in the network lab: how many acknowledged messages for
persistent sessions are lost across the split and the heal (the target is none).

Five `meshd` processes in network namespaces (scripts/netlab.py, needs root).  Two
persistent QoS 1 subscribers, one on each side, subscribe to `soak/#`; one publisher on
each side publishes QoS 1 at `--rate` messages/s throughout.  The lab splits 3|2 for
`--split` seconds, heals, and the script waits until every message a publisher got a
PUBACK for has reached both subscribers (or `--drain` seconds pass).  What a split
holds for a session arrives at once after the heal, so every node runs with
`--max-queued-messages` (default 10000) above that backlog: past it, the queue's
documented overflow policy drops, which this script would count as lost.

    sudo python scripts/netsplit_soak.py                  # 60 s split, 20 msg/s per side
    sudo python scripts/netsplit_soak.py --split 120 --rate 50

Prints per subscriber: acknowledged, received, lost, duplicates without DUP, order
violations per publisher; and the time from the heal to one membership view.  One JSON
line per run is appended to scripts/bench/results/netsplit_soak.jsonl.  Traffic stays
inside the namespaces the script creates; it removes them when done.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.netsplit.test_lab_splits import N, LabCluster, netlab, wait_for  # noqa: E402
from tests.support import Client  # noqa: E402

SIDE_A, SIDE_B = [0, 1, 2], [3, 4]


def connect(lab: LabCluster, host: int, client_id: str, persistent: bool) -> Client:
    client = Client(client_id, version=5, clean=not persistent)
    client.c.reconnect_delay_set(min_delay=1, max_delay=2)
    addr = lab.lab.hosts[host].address
    lab.lab.in_host(host, lambda: client.connect(1883, host=addr, expiry=3600 if persistent else None))
    return client


class Publisher(threading.Thread):
    def __init__(self, client: Client, name: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.client, self.name, self.interval = client, name, 1.0 / rate
        self.acked: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            info = self.client.c.publish("soak/" + self.name, f"{self.name}:{n}".encode(), qos=1)
            info.wait_for_publish(30)
            if info.is_published():
                self.acked.append(n)
            n += 1
            time.sleep(self.interval)


def account(sub: Client, publishers: list[Publisher]) -> dict:
    out = {}
    messages = list(sub.messages.queue)
    for p in publishers:
        mine = [(int(m.payload.split(b":")[1]), m.dup) for m in messages if m.payload.startswith(p.name.encode() + b":")]
        seen: set[int] = set()
        dup_plain = order = 0
        dups: list[int] = []
        last = -1
        for n, dup in mine:
            if n in seen:
                if not dup:
                    dup_plain += 1
                    dups.append(n)
                continue
            seen.add(n)
            order += n < last
            last = n
        lost = sorted(set(p.acked) - seen)
        out[p.name] = {"acked": len(p.acked), "received": len(seen), "lost": len(lost), "lost_sample": lost[:10],
                       "dup_without_dup_flag": dup_plain, "dup_sample": dups[:10], "order_violations": order}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", type=float, default=60.0, help="seconds the split lasts")
    ap.add_argument("--rate", type=float, default=20.0, help="QoS 1 messages/s per publisher")
    ap.add_argument("--drain", type=float, default=60.0, help="seconds to wait for delivery after the heal")
    ap.add_argument("--max-queued", type=int, default=10_000,
                    help="max_queued_messages on every node: a session's backlog after the split must fit (default 10000)")
    args = ap.parse_args()
    if not netlab.has_net_admin():
        print("netsplit_soak: needs root (CAP_NET_ADMIN) for network namespaces", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="meshd-soak-"))
    with netlab.NetLab(hosts=N, prefix="soak") as net:
        lab = LabCluster(net, base, ("--max-queued-messages", str(args.max_queued)))
        try:
            lab.start()
            wait_for(lambda: (lab.assert_running(), lab.one_view())[1], 60, "five nodes in one view")
            subs = {"sub-a": connect(lab, 1, "soak-sub-a", True), "sub-b": connect(lab, 3, "soak-sub-b", True)}
            for s in subs.values():
                s.subscribe("soak/#", 1)
            time.sleep(2)  # routes everywhere
            pubs = [Publisher(connect(lab, 2, "soak-pub-a", False), "pa", args.rate),
                    Publisher(connect(lab, 4, "soak-pub-b", False), "pb", args.rate)]
            for p in pubs:
                p.start()
            time.sleep(2)
            net.split(SIDE_B)
            split_at = time.monotonic()
            time.sleep(args.split)
            net.heal()
            healed_at = time.monotonic()
            one_view = wait_for(lab.one_view, 60, "one view after the heal")
            time.sleep(2)
            for p in pubs:
                p.stopping.set()
            for p in pubs:
                p.join(60)
            deadline = time.monotonic() + args.drain
            while time.monotonic() < deadline:
                if all(v["lost"] == 0 for s in subs.values() for v in account(s, pubs).values()):
                    break
                time.sleep(1)
            result = {
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "split_s": round(healed_at - split_at, 1),
                "rate_per_publisher": args.rate, "max_queued_messages": args.max_queued, "one_view_after_heal_s": round(one_view, 2),
                "subscribers": {name: account(s, pubs) for name, s in subs.items()},
            }
            result["lost_total"] = sum(v["lost"] for s in result["subscribers"].values() for v in s.values())
        finally:
            lab.stop()
    print(json.dumps(result, indent=2))
    print("logs and traces under", base)
    out = ROOT / "scripts" / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "netsplit_soak.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")
    return 0 if result["lost_total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

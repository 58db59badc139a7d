"""The MQTT codec and server machine on their own, compiled (mypyc) against pure Python.

    python scripts/bench/codec.py                # 5 alternating rounds, ~1 min
    python scripts/bench/codec.py --rounds 9 --n 50000

Each round runs every case twice in fresh processes, once as the build has it (compiled
when `native.status()` says so) and once with MESHD_PURE_PYTHON=1, alternating, and
reports CPU µs per operation (process CPU time, so other load on the machine matters
less than for wall time) as the median over the rounds with [min..max], and the ratio.
Cases:

- decode-qos0 / decode-qos1: a server's `ServerConnection` fed 64-byte PUBLISHes on
  `bench/in/007` (MQTT 3.1.1), 50 per read as they arrive in a loaded socket buffer,
  every event taken (plus the PUBACK bytes at QoS 1): what a publisher's reader does.
- deliver-qos1: `ServerConnection.publish` for one subscriber at QoS 1 (packet id
  allocated, bytes encoded) and its PUBACK decoded: what a subscriber costs.
- trie-match: `TopicTrie.match` of a topic against 1,000 filters (wildcards included).

A compiled build comes from `pip install -e .` (or `python setup.py build_ext
--inplace`); without one both columns are pure Python, and the header says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CASES = ("decode-qos0", "decode-qos1", "deliver-qos1", "trie-match")
BATCH = 50


def _publishes(qos: int, n: int) -> list[bytes]:
    from mqtt import Publish, encode

    out = []
    for i in range(n):
        packet = Publish(topic="bench/in/007", payload=bytes(64), qos=qos, packet_id=(i % 65535) + 1 if qos else None)
        out.append(encode(packet, 4))
    return out


def _connected_server():  # type: ignore[no-untyped-def]
    from mqtt import Connect, encode
    from mqtt.server import ServerConnection, ServerSettings

    conn = ServerConnection(ServerSettings(), 0.0)
    conn.receive_data(encode(Connect(client_id="bench", protocol_level=4), 4), 0.0)
    conn.next_event()
    conn.accept(session_present=False)
    return conn


def run_case(case: str, n: int) -> float:
    """CPU µs per operation of `case` in this process."""
    if case.startswith("decode"):
        qos = 1 if case.endswith("qos1") else 0
        packets = _publishes(qos, BATCH)
        chunk = b"".join(packets)
        conn = _connected_server()
        rounds = n // BATCH
        start = time.process_time()
        for _ in range(rounds):
            conn.receive_data(chunk, 1.0)
            while (event := conn.next_event()) is not None:
                if qos:
                    conn.puback(event.packet_id)  # type: ignore[union-attr]
        return (time.process_time() - start) / (rounds * BATCH) * 1e6
    if case == "deliver-qos1":
        from mqtt import Puback, encode

        conn = _connected_server()
        acks = {i: encode(Puback(packet_id=i), 4) for i in range(1, 65536)}
        payload = bytes(64)
        start = time.process_time()
        for _ in range(n):
            packet_id = conn.allocate_packet_id()
            conn.publish("bench/in/007", payload, 1, False, packet_id)
            conn.receive_data(acks[packet_id], 1.0)
            conn.next_event()
        return (time.process_time() - start) / n * 1e6
    if case == "trie-match":
        from routing.trie import TopicTrie

        trie: TopicTrie[int] = TopicTrie()
        for i in range(1000):
            kind = i % 4
            filt = (f"bench/in/{i:03d}", f"bench/+/{i:03d}", f"bench/{i:03d}/#", f"site/{i}/+/temp")[kind]
            trie.add(filt, i)
        start = time.process_time()
        for i in range(n):
            list(trie.match(f"bench/in/{i % 1000:03d}"))
        return (time.process_time() - start) / n * 1e6
    raise ValueError(case)


def _child(case: str, n: int, pure: bool) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MESHD_PURE_PYTHON", None)
    if pure:
        env["MESHD_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, __file__, "--child", case, "--n", str(n)], env=env,
                         capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout)


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=30000, help="operations per case and process")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import native

        print(json.dumps({"us": run_case(args.child, args.n), "compiled": native.status().compiled}))
        return 0
    cases = args.cases.split(",")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    results: dict[tuple[str, bool], list[float]] = {}
    compiled_seen = set()
    for _ in range(args.rounds):
        for case in cases:
            for pure in (False, True):
                line = _child(case, args.n, pure)
                results.setdefault((case, pure), []).append(float(line["us"]))  # type: ignore[arg-type]
                if not pure:
                    compiled_seen.add(bool(line["compiled"]))
                print(json.dumps({"case": case, "pure": pure, **line, "commit": commit,
                                  "loadavg": round(os.getloadavg()[0], 2)}), flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f}; first column compiled: {sorted(compiled_seen)}")
    print("| case | compiled µs/op | pure µs/op | compiled/pure |")
    print("|---|---:|---:|---:|")
    for case in cases:
        fast, slow = results[(case, False)], results[(case, True)]
        print(f"| {case} | {_fmt(fast)} | {_fmt(slow)} | {statistics.median(fast) / statistics.median(slow):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

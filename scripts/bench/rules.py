"""Issue 24: what a rule costs.

    python scripts/bench/rules.py --cpu          # CPU per message of one rule, in process (~10 s)
    python scripts/bench/run.py --brokers meshd --scenarios rule-qos0 --reps 3
                                                 # fan-in QoS 0 with the rule vs without (~1 min)

The rule: a three-field SELECT with a WHERE on a JSON payload,

    SELECT payload.temp AS t, clientid, topic FROM "bench/in/+" WHERE t > 20

- `--cpu`: the engine's whole message.publish callback (trie match of the rule's
  sources, the input record, JSON decode, WHERE, SELECT; no action: the WHERE holds for
  every message and the rule has none) over N messages, CPU time (process_time) per
  message. Also the evaluator alone (the compiled closures on a ready input).
- `rule-qos0` (run.py): the `fanin-qos0` closed loop (10 publishers on bench/in/NNN ->
  1 subscriber on bench/in/+, 64-byte JSON payloads) on a fresh meshd without rules and
  on one with the rule (`--rules`), one after the other; the ratio of delivered msg/s
  and of broker CPU per message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

RULE_SQL = 'SELECT payload.temp AS t, clientid, topic FROM "bench/in/+" WHERE t > 20'
RULE = {"id": "bench", "sql": RULE_SQL, "actions": []}


def json_payload(size: int) -> bytes:
    """A JSON object of exactly `size` bytes with the field the rule reads."""
    head = '{"temp": 21.5, "hum": 40, "site": "lab-7", "pad": "'
    body = head + "x" * (size - len(head) - 2) + '"}'
    data = body.encode()
    assert len(data) == size and json.loads(data)["temp"] == 21.5
    return data


def cpu_per_message(n: int = 200_000) -> dict[str, Any]:
    from clock import ManualClock
    from hooks import Hooks
    from mqtt import EMPTY_PROPERTIES
    from rules.actions import log_factory
    from rules.engine import RuleEngine, RuleSpec
    from rules.record import RuleInput
    from session_store.model import Message

    hooks = Hooks()
    engine = RuleEngine(node_id="bench", clock=ManualClock(), hooks=hooks, action_factories={"log": log_factory})
    engine.install(engine.build(RuleSpec.from_table(RULE)))
    payload = json_payload(64)
    messages = [Message(f"bench/in/{i % 10:03d}", payload, 0, False, EMPTY_PROPERTIES, None, f"pub{i % 10}", i, "bench")
                for i in range(1000)]
    (callback,) = [reg.callback for reg in hooks.message_publish]
    out: dict[str, Any] = {"sql": RULE_SQL, "messages": n}
    for _ in range(3):  # warm up
        for m in messages:
            callback(m)
    t0 = time.process_time()
    for i in range(n // len(messages)):
        for m in messages:
            callback(m)
    out["engine_us_per_msg"] = (time.process_time() - t0) / n * 1e6
    rule = engine.rules["bench"]
    assert rule.metrics.passed >= n and rule.metrics.failed == 0, rule.metrics
    evaluate = rule.query.evaluate
    inputs = [RuleInput.of_message(m, event="message.publish", node="bench", timestamp=0) for m in messages]
    for r in inputs:
        r.payload_json()  # decoded: the evaluator alone
    t0 = time.process_time()
    for i in range(n // len(inputs)):
        for r in inputs:
            evaluate(r)
    out["evaluate_us_per_msg"] = (time.process_time() - t0) / n * 1e6
    t0 = time.process_time()
    for i in range(n // len(messages)):
        for m in messages:
            json.loads(m.payload)
    out["json_loads_us_per_msg"] = (time.process_time() - t0) / n * 1e6
    return out


def run_rule_scenario(workdir: Path, quick: bool) -> dict[str, Any]:
    """run.py's `rule-qos0`: fan-in QoS 0 without the rule, then with it."""
    import brokers
    import loadgen

    duration = 2.0 if quick else 4.0
    args = dict(publishers=10, subscribers=1, qos=0, topics="per-publisher", duration=duration, window=5000,
                payload=json_payload(loadgen.PAYLOAD_SIZE))
    out: dict[str, Any] = {}
    for name, extra in (("plain", []), ("rule", ["--rules", json.dumps([RULE])])):
        broker = brokers.start(brokers.BROKERS["meshd"], workdir / name, extra=extra)
        try:
            out[name] = loadgen.throughput(broker.port, broker.pid, tag=name[0], **args)
            if not broker.alive():
                raise RuntimeError(f"meshd ({name}) exited during the run")
        finally:
            broker.stop()
    for k in ("msgs_per_s", "cpu_us_per_msg"):
        out[f"plain_{k}"] = out["plain"][k]
        out[f"rule_{k}"] = out["rule"][k]
    out["ratio"] = out["rule_msgs_per_s"] / out["plain_msgs_per_s"] if out["plain_msgs_per_s"] else None
    out["cpu_ratio"] = (out["rule_cpu_us_per_msg"] / out["plain_cpu_us_per_msg"]
                        if out["plain_cpu_us_per_msg"] else None)
    out["lost"] = out["rule"]["lost"] + out["plain"]["lost"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="CPU per message of the rule, in process")
    parser.add_argument("-n", type=int, default=200_000, help="messages for --cpu (default %(default)s)")
    args = parser.parse_args(argv)
    if not args.cpu:
        parser.error("--cpu (the throughput ratio runs through run.py --scenarios rule-qos0)")
    print(json.dumps(cpu_per_message(args.n), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

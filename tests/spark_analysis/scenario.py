"""A four-node trace with every metric's answer worked out by hand (times in seconds).

a, b, c, d start at 0; a, b, c stop at 80; d crashes at 30.

event  kind            origin @t   observations (node t hops)            alive  t50  t90  t99  t100
E1     broadcast       a @10       a 10 0, b 10.5 1, c 11 1, d 12 2      4      0.5  2    2    2
E2     route_add       b @20       b 20 0, a 20.2 1, c 20.4 1            4      0.2  -    -    -
S1     member_suspect  c @31 (d)   c 31 0, a 31.5 1, b 32 1              3      0.5  1    1    1
D1     member_dead     c @35 (d)   c 35 0, a 36 1, b 37 1                3      1    2    2    2
E3     config_set      a @40       a 40 0, b 40.3 1, c 40.9 1            3      0.3  0.9  0.9  0.9
D2     member_dead     b @50 (c)   b 50 0, a 50.5 1                      3      0.5  -    -    -
A1     member_alive    c @51 (c)   c 51 0, a 51.2 1, b 51.4 1            3      0.2  0.4  0.4  0.4
S2     member_suspect  a @58 (c)   a 58 0                                3      -    -    -    -

Crash of d at 30: first suspect 31 (1 s), dead at c 35, a 36, b 37 (all 7 s).
D2 is a false positive: c writes A1 at 51 after being declared dead at 50.
Partition at a: suspect c at 58, detected 60 (2 s), healed 70 (10 s).
"""

from __future__ import annotations

from gossip.trace import trace_record

S = 1_000_000


def _obs(eid: str, kind: str, origin: str, t0: float, subject: str, seen: list[tuple[str, float, int]]) -> list[dict]:
    return [
        trace_record(
            ts_us=round(t * S), node=node, kind=kind, subject=subject, origin=origin,
            origin_ts_us=round(t0 * S), event_id=eid, hops=hops,
        )
        for node, t, hops in seen
    ]


def _build() -> list[dict]:
    recs: list[dict] = []
    for n in "abcd":
        recs.append(trace_record(ts_us=0, node=n, kind="node_start", subject=n))
    recs += _obs("E1", "broadcast", "a", 10, "t/x", [("a", 10, 0), ("b", 10.5, 1), ("c", 11, 1), ("d", 12, 2)])
    recs += _obs("E2", "route_add", "b", 20, "t/#", [("b", 20, 0), ("a", 20.2, 1), ("c", 20.4, 1)])
    recs.append(trace_record(ts_us=30 * S, node="d", kind="node_crash", subject="d", sim=True))
    recs += _obs("S1", "member_suspect", "c", 31, "d", [("c", 31, 0), ("a", 31.5, 1), ("b", 32, 1)])
    recs += _obs("D1", "member_dead", "c", 35, "d", [("c", 35, 0), ("a", 36, 1), ("b", 37, 1)])
    recs += _obs("E3", "config_set", "a", 40, "k", [("a", 40, 0), ("b", 40.3, 1), ("c", 40.9, 1)])
    recs += _obs("D2", "member_dead", "b", 50, "c", [("b", 50, 0), ("a", 50.5, 1)])
    recs += _obs("A1", "member_alive", "c", 51, "c", [("c", 51, 0), ("a", 51.2, 1), ("b", 51.4, 1)])
    recs += _obs("S2", "member_suspect", "a", 58, "c", [("a", 58, 0)])
    recs.append(trace_record(ts_us=60 * S, node="a", kind="partition_detected", subject="c"))
    recs.append(trace_record(ts_us=70 * S, node="a", kind="partition_healed", subject="c"))
    # Session handoffs, as the taker writes them: two moves and one fallback.
    recs.append(trace_record(ts_us=62 * S, node="b", kind="session_handoff", subject="dev", origin="a",
                             to="b", outcome="ok", duration_ms=12.0, messages=5))
    recs.append(trace_record(ts_us=64 * S, node="c", kind="session_handoff", subject="dev", origin="b",
                             to="c", outcome="ok", duration_ms=30.0, messages=2))
    recs.append(trace_record(ts_us=66 * S, node="b", kind="session_handoff", subject="dev2", origin="d",
                             to="b", outcome="fallback", reason="owner unreachable", duration_ms=0.0, messages=0))
    for n in "abc":
        recs.append(trace_record(ts_us=80 * S, node=n, kind="node_stop", subject=n))
    return recs


SCENARIO: list[dict] = _build()

#!/usr/bin/env python3
"""Long fuzz run over the decoders that face the network: the MQTT decoder (server and
client roles, every protocol level), the gossip packet decoder and the mesh frame
decoder.  Inputs are random bytes and mutations (bit flips, truncations, splices,
length-field changes) of valid encodings.  The only exceptions allowed are each
decoder's own error types; anything else is a bug and is printed with its input.

    python scripts/fuzz_decoders.py --inputs 1000000          # MQTT decoder, 1M inputs
    python scripts/fuzz_decoders.py --target gossip --inputs 200000
    python scripts/fuzz_decoders.py --target links --inputs 200000

Deterministic for a given --seed; bounded by --inputs and --max-seconds.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gossip import wire  # noqa: E402
from mqtt import (  # noqa: E402
    Connack, Connect, Decoder, Disconnect, MQTTError, Properties, Puback, Publish, Suback, Subscribe,
    Subscription, Unsubscribe, Will, encode,
)
from routing.table import RouteDelta, RouteSnapshot  # noqa: E402
from session_store import records  # noqa: E402


def mqtt_seeds() -> list[tuple[bytes, str, int]]:
    """(bytes, role, level) of valid packets to mutate."""
    out = []
    for level in (3, 4, 5):
        props = Properties(user_properties=(("k", "v"),), message_expiry_interval=10) if level == 5 else Properties()
        connect = Connect(client_id="fuzz", clean_start=False, keep_alive=30, username="u", password=b"p",
                          will=Will("w/t", b"bye", 1, True), protocol_level=level)
        out.append((encode(connect, level), "server", level))
        for packet in (
            Publish(topic="a/b", payload=b"hello", qos=1, packet_id=7, properties=props),
            Publish(topic="a/b", payload=b"x" * 300, qos=2, packet_id=9),
            Subscribe(packet_id=3, subscriptions=(Subscription("a/+", 1), Subscription("$share/g/b/#", 2))),
            Unsubscribe(packet_id=4, topic_filters=("a/+",)),
            Puback(packet_id=7),
            Disconnect(),
        ):
            out.append((encode(connect, level) + encode(packet, level), "server", level))
        for packet in (Connack(session_present=True), Suback(packet_id=3, reason_codes=(1, 0x80)),
                       Publish(topic="x", payload=b"y", qos=1, packet_id=1)):
            out.append((encode(packet, level), "client", level))
    return out


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            del b[rng.randrange(len(b)):]
        elif op == 2:
            b[rng.randrange(len(b) + 1):rng.randrange(len(b) + 1)] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and b:
            b[rng.randrange(len(b))] = rng.choice((0x00, 0x7F, 0x80, 0xFF))
        elif op == 4 and len(b) > 2:
            i = rng.randrange(len(b) - 1)
            b[i:i] = b[i:i + rng.randint(1, 16)]
        else:
            b += rng.randbytes(rng.randint(1, 32))
    return bytes(b)


def fuzz_mqtt(rng: random.Random, n: int, deadline: float) -> tuple[int, list[str]]:
    seeds = mqtt_seeds()
    bad: list[str] = []
    done = 0
    for done in range(1, n + 1):
        if rng.random() < 0.2:
            role, level = rng.choice((("server", None), ("client", 5), ("client", 4)))
            data = rng.randbytes(rng.randint(0, 64))
        else:
            data, role, level = rng.choice(seeds)
            data = mutate(rng, data)
            level = None if role == "server" else level
        decoder = Decoder(role=role, protocol_level=level, max_packet_size=rng.choice((None, 64, 1 << 20)))
        try:
            # Feed in random chunks, as a socket would.
            i = 0
            while i < len(data):
                j = i + rng.randint(1, 64)
                decoder.feed(data[i:j])
                while decoder.next_packet() is not None:
                    pass
                i = j
        except MQTTError:
            pass
        except Exception as exc:  # noqa: BLE001 - this is what the fuzzer looks for
            bad.append(f"{type(exc).__name__}: {exc} on role={role} level={level} input={data.hex()}")
        if done % 10_000 == 0 and time.monotonic() > deadline:
            break
    return done, bad


def fuzz_gossip(rng: random.Random, n: int, deadline: float) -> tuple[int, list[str]]:
    valid = [
        wire.encode_frame_body("push_pull", "n1", {"x": 1}),
        wire.encode_frame_body("compound", "n1", {"m": [["ping", 1, "n2"], ["ack", 1]]}),
    ]
    bad: list[str] = []
    done = 0
    for done in range(1, n + 1):
        data = mutate(rng, rng.choice(valid)) if rng.random() < 0.8 else rng.randbytes(rng.randint(0, 64))
        try:
            wire.decode_packet(data)
        except wire.WireError:
            pass
        except Exception as exc:  # noqa: BLE001
            bad.append(f"decode_packet {type(exc).__name__}: {exc} input={data.hex()}")
        try:
            wire.decode_frame_body(data)
        except wire.WireError:
            pass
        except Exception as exc:  # noqa: BLE001
            bad.append(f"decode_frame_body {type(exc).__name__}: {exc} input={data.hex()}")
        if done % 10_000 == 0 and time.monotonic() > deadline:
            break
    return done, bad


def fuzz_links(rng: random.Random, n: int, deadline: float) -> tuple[int, list[str]]:
    """Mesh frames: the envelope, route deltas/snapshots and forwarded message records."""
    import cbor2

    from session_store.model import Message

    msg = records.message_map(Message("a/b", b"p", 1, False, Properties(), None, "c", 1))
    valid = [
        cbor2.dumps(RouteDelta("n1", 1, 1, (("a/#", True),)).to_wire()),
        cbor2.dumps(RouteSnapshot("n1", 1, 3, frozenset({"a", "b/+"})).to_wire()),
        cbor2.dumps(msg),
    ]
    bad: list[str] = []
    done = 0
    for done in range(1, n + 1):
        data = mutate(rng, rng.choice(valid))
        try:
            obj = cbor2.loads(data)
        except Exception:  # noqa: BLE001 - CBOR errors are the decoder's own refusal
            continue
        for parse, allowed in ((RouteDelta.from_wire, (TypeError, ValueError)),
                               (RouteSnapshot.from_wire, (TypeError, ValueError)),
                               (records.message_from_map, (records.RecordError,))):
            try:
                parse(obj)
            except allowed:
                pass
            except Exception as exc:  # noqa: BLE001
                bad.append(f"{parse.__qualname__} {type(exc).__name__}: {exc} input={data.hex()}")
        if done % 10_000 == 0 and time.monotonic() > deadline:
            break
    return done, bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=("mqtt", "gossip", "links"), default="mqtt")
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=1800)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    run = {"mqtt": fuzz_mqtt, "gossip": fuzz_gossip, "links": fuzz_links}[args.target]
    done, bad = run(rng, args.inputs, t0 + args.max_seconds)
    elapsed = time.monotonic() - t0
    print(f"{args.target}: {done} inputs in {elapsed:.1f} s ({done / elapsed:,.0f}/s), {len(bad)} unexpected exceptions")
    for line in bad[:20]:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

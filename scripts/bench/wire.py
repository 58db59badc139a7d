"""Pre-encoded MQTT 3.1.1 packets and cheap frame parsing for the load generator.

Packets are built once with the project's codec (`mqtt.encode`) and then copied
as bytes; the hot path never builds a packet object. Incoming data is parsed with byte
slicing where every frame has the same length (the common case in a throughput run) and
frame by frame otherwise, so the generator spends its CPU on the socket, not on Python.
"""

from __future__ import annotations

from typing import Callable

from mqtt import Connect, Publish, Subscribe, Subscription, encode

LEVEL = 4  # MQTT 3.1.1: the one protocol level all three brokers speak
PUBLISH_QOS0 = 0x30
PUBLISH_QOS1 = 0x32
PUBACK = 0x40
PIDS = [i.to_bytes(2, "big") for i in range(65536)]


def connect_packet(client_id: str, keep_alive: int = 0, clean_start: bool = True) -> bytes:
    """CONNECT at 3.1.1; `clean_start=False` is clean session 0 (a persistent session)."""
    return encode(Connect(client_id=client_id, clean_start=clean_start, keep_alive=keep_alive), LEVEL)


def subscribe_packet(topic_filter: str, qos: int, packet_id: int = 1) -> bytes:
    return encode(Subscribe(packet_id=packet_id, subscriptions=(Subscription(topic_filter, qos),)), LEVEL)


def puback_packet(packet_id: int) -> bytes:
    return b"\x40\x02" + PIDS[packet_id]


class PublishTemplate:
    """One topic and payload size, encoded once; `batch()` stamps packet ids into copies.

    QoS 0 batches are one bytes multiplication. QoS 1 packets are `head + pid + tail`.
    """

    def __init__(self, topic: str, payload: bytes, qos: int) -> None:
        self.topic = topic
        self.qos = qos
        self.packet = encode(Publish(topic=topic, payload=payload, qos=qos, packet_id=1 if qos else None), LEVEL)
        self.size = len(self.packet)
        if qos:
            at = self.size - len(payload) - 2
            self.head, self.tail = self.packet[:at], self.packet[at + 2:]
        self.payload_offset = self.size - len(payload)
        self.next_pid = 1

    def batch(self, count: int) -> bytes:
        if not self.qos:
            return self.packet * count
        head, tail, pids = self.head, self.tail, PIDS
        pid = self.next_pid
        parts = []
        for _ in range(count):
            parts.append(head + pids[pid] + tail)
            pid = pid + 1 if pid < 65535 else 1
        self.next_pid = pid
        return b"".join(parts)

    def stamped(self, payload_head: bytes) -> bytes:
        """One packet whose payload starts with `payload_head` (timestamps, sequence)."""
        n = len(payload_head)
        if not self.qos:
            off = self.payload_offset
            return self.packet[:off] + payload_head + self.packet[off + n:]
        pid = self.next_pid
        self.next_pid = pid + 1 if pid < 65535 else 1
        return self.head + PIDS[pid] + payload_head + self.tail[n:]


def publish_frame_size(topic: str, payload_size: int, qos: int) -> int:
    return PublishTemplate(topic, bytes(payload_size), qos).size


def split_frames(buf: bytearray) -> tuple[list[tuple[int, int, int]], int]:
    """Complete frames in `buf` as (first byte, body start, end) and the bytes used."""
    frames = []
    pos, n = 0, len(buf)
    while pos + 2 <= n:
        first = buf[pos]
        length, mult, i = 0, 1, pos + 1
        while True:
            if i >= n:
                return frames, pos
            b = buf[i]
            i += 1
            length += (b & 0x7F) * mult
            if b < 0x80:
                break
            mult <<= 7
        end = i + length
        if end > n:
            break
        frames.append((first, i, end))
        pos = end
    return frames, pos


class SubscriberStream:
    """Counts PUBLISHes arriving on one subscriber socket and builds the PUBACKs to send.

    `frame_size` is the size every PUBLISH should have; when all buffered frames have
    it, they are counted (and their packet ids copied into PUBACKs) by slicing.
    `on_payload`, when given, is called with each payload and the frames are always
    parsed one by one (latency runs, where the rate is low).
    """

    def __init__(self, frame_size: int, qos: int, payload_size: int,
                 on_payload: Callable[[bytes], None] | None = None) -> None:
        self.size = frame_size
        self.payload_size = payload_size
        self.qos = qos
        self.first = PUBLISH_QOS1 if qos else PUBLISH_QOS0
        # the fast path needs a one-byte remaining length (frames under 130 bytes)
        self.length_byte = frame_size - 2
        self.fast = on_payload is None and frame_size - 2 < 128
        self.on_payload = on_payload
        self.buf = bytearray()
        self.received = 0
        self.other = 0  # frames that were not PUBLISH (counted for the record)

    def feed(self, data: bytes) -> bytes:
        """Take bytes from the socket; return the PUBACKs to send back (maybe empty)."""
        buf = self.buf
        buf += data
        size = self.size
        k = len(buf) // size
        # fast path: every whole frame starts with the expected header (type and length)
        if (self.fast and k and buf[0: k * size: size].count(self.first) == k
                and buf[1: k * size: size].count(self.length_byte) == k):
            acks = self._acks_by_slicing(k) if self.qos else b""
            del buf[: k * size]
            self.received += k
            return acks + self._feed_frames() if buf else acks
        return self._feed_frames()

    def _acks_by_slicing(self, k: int) -> bytes:
        buf, size = self.buf, self.size
        at = size - self.payload_size - 2  # the packet id sits right before the payload
        out = bytearray(4 * k)
        out[0::4] = b"\x40" * k
        out[1::4] = b"\x02" * k
        out[2::4] = buf[at: k * size: size]
        out[3::4] = buf[at + 1: k * size: size]
        return bytes(out)

    def _feed_frames(self) -> bytes:
        frames, used = split_frames(self.buf)
        acks = []
        on_payload = self.on_payload
        buf = self.buf
        for first, start, end in frames:
            if first >> 4 != 3:
                self.other += 1
                continue
            self.received += 1
            tlen = (buf[start] << 8) | buf[start + 1]
            pos = start + 2 + tlen
            if first & 0x06:
                acks.append(b"\x40\x02" + bytes(buf[pos: pos + 2]))
                pos += 2
            if on_payload is not None:
                on_payload(bytes(buf[pos:end]))
        del buf[:used]
        return b"".join(acks)


class AckStream:
    """Counts PUBACKs (4-byte frames) arriving on a publisher socket."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.acked = 0

    def feed(self, data: bytes) -> int:
        buf = self.buf
        buf += data
        k = len(buf) // 4
        if k and buf[0: 4 * k: 4].count(PUBACK) == k and buf[1: 4 * k: 4].count(2) == k:
            del buf[: 4 * k]
            self.acked += k
            return k
        frames, used = split_frames(buf)
        n = sum(1 for first, _, _ in frames if first >> 4 == 4)
        del buf[:used]
        self.acked += n
        return n

"""Shared helpers for the codec tests: decode whole encodings and split feeds."""

from __future__ import annotations

import socket

from mqtt import Connack, Connect, Decoder, Packet, Publish, encode

# Packets only a server receives / only a client receives; the rest go both ways.
CLIENT_TO_SERVER_ONLY = {"Connect", "Subscribe", "Unsubscribe", "Pingreq"}
SERVER_TO_CLIENT_ONLY = {"Connack", "Suback", "Unsuback", "Pingresp"}


def role_for(packet: Packet) -> str:
    """The role of a decoder that may receive `packet`."""
    name = type(packet).__name__
    if name in SERVER_TO_CLIENT_ONLY:
        return "client"
    if isinstance(packet, Publish) and packet.properties.subscription_identifiers:
        return "client"  # only servers may send subscription identifiers [MQTT-3.3.4-6]
    return "server"


def decoder_for(packet: Packet, level: int, *, max_packet_size: int | None = None) -> Decoder:
    """A decoder positioned to receive `packet` at `level`, mid-session."""
    role = role_for(packet)
    if isinstance(packet, Connect) or (isinstance(packet, Connack) and role == "client"):
        # Let the decoder learn the level from the packet itself, as on a new connection.
        return Decoder(role=role, protocol_level=level if isinstance(packet, Connack) else None,
                       max_packet_size=max_packet_size)
    return Decoder(role=role, protocol_level=level, max_packet_size=max_packet_size)


def decode_all(decoder: Decoder, data: bytes) -> list[Packet]:
    decoder.feed(data)
    return list(decoder)


def decode_one(packet: Packet, data: bytes, level: int) -> Packet:
    decoder = decoder_for(packet, level)
    packets = decode_all(decoder, data)
    assert len(packets) == 1, packets
    assert decoder.buffered == 0
    return packets[0]


def check_splits(packet: Packet, data: bytes, level: int) -> None:
    """Every split point decodes to the same packet; every proper prefix needs more data."""
    for cut in range(len(data) + 1):
        decoder = decoder_for(packet, level)
        decoder.feed(data[:cut])
        got = decoder.next_packet()
        if cut < len(data):
            assert got is None, f"prefix of {cut}/{len(data)} bytes decoded to {got!r}"
            decoder.feed(data[cut:])
            got = decoder.next_packet()
        assert got == packet, (cut, got, packet)
        assert decoder.next_packet() is None
    # one byte at a time, twice in a row (the second copy starts mid-buffer)
    decoder = decoder_for(packet, level)
    seen = []
    for byte in data + data:
        decoder.feed(bytes((byte,)))
        seen.extend(decoder)
    assert seen == [packet, packet]


TIMEOUT = 10.0


class CodecServer:
    """One accepted connection, driven by hand from the test."""

    def __init__(self, listener: socket.socket, level: int) -> None:
        self.sock, _ = listener.accept()
        self.sock.settimeout(TIMEOUT)
        self.level = level
        self.decoder = Decoder(role="server")
        self.pending: list = []

    def read(self, expected_type: type):
        while not self.pending:
            data = self.sock.recv(65536)
            assert data, "client closed the connection"
            self.decoder.feed(data)
            self.pending.extend(self.decoder)
        packet = self.pending.pop(0)
        assert isinstance(packet, expected_type), packet
        return packet

    def send(self, packet) -> None:
        self.sock.sendall(encode(packet, self.level))


# Raw bytes for tests that build packets the encoder would refuse to write.

def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def pkt(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


def s(text: bytes | str) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def u16(n: int) -> bytes:
    return n.to_bytes(2, "big")


def props(*items: bytes) -> bytes:
    body = b"".join(items)
    return varint(len(body)) + body

"""Primitive MQTT data types: a bounds-checked reader and the varint/string writers.

Every read checks its bounds and raises `MalformedPacket`, so a truncated or garbled
packet can never surface as IndexError or UnicodeDecodeError.
"""

from __future__ import annotations

from .errors import LocalProtocolError, MalformedPacket

MAX_VARINT = 268_435_455  # 0xFF 0xFF 0xFF 0x7F, the largest four-byte varint

# One-byte varints are by far the most common; build them once.
_SMALL_VARINTS = tuple(bytes((n,)) for n in range(128))


class Reader:
    """Reads MQTT data types from `data` (one packet body) starting at `pos`."""

    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data)

    def remaining(self) -> int:
        return self.end - self.pos

    def u8(self) -> int:
        pos = self.pos
        if pos >= self.end:
            raise MalformedPacket("packet ends early (byte expected)")
        self.pos = pos + 1
        return self.data[pos]

    def u16(self) -> int:
        pos = self.pos
        if pos + 2 > self.end:
            raise MalformedPacket("packet ends early (two-byte integer expected)")
        self.pos = pos + 2
        data = self.data
        return (data[pos] << 8) | data[pos + 1]

    def u32(self) -> int:
        pos = self.pos
        if pos + 4 > self.end:
            raise MalformedPacket("packet ends early (four-byte integer expected)")
        self.pos = pos + 4
        return int.from_bytes(self.data[pos : pos + 4], "big")

    def varint(self) -> int:
        value = 0
        shift = 0
        data = self.data
        pos = self.pos
        for i in range(4):
            if pos >= self.end:
                raise MalformedPacket("packet ends early (variable byte integer expected)")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and i > 0:
                    # [MQTT-1.5.5-1] the minimum number of bytes must be used
                    raise MalformedPacket("variable byte integer is not minimally encoded")
                self.pos = pos
                return value
            shift += 7
        raise MalformedPacket("variable byte integer longer than four bytes")

    def take(self, n: int) -> bytes:
        pos = self.pos
        if pos + n > self.end:
            raise MalformedPacket("packet ends early (data shorter than its length says)")
        self.pos = pos + n
        return self.data[pos : pos + n]

    def binary(self) -> bytes:
        return self.take(self.u16())

    def utf8(self) -> str:
        return decode_utf8(self.binary())

    def rest(self) -> bytes:
        pos = self.pos
        self.pos = self.end
        return self.data[pos:]

    def expect_end(self, what: str) -> None:
        if self.pos != self.end:
            raise MalformedPacket(
                f"{what}: {self.end - self.pos} byte(s) left over after the packet contents"
            )


def decode_utf8_with_nul(raw: bytes) -> str:
    """Well-formed UTF-8 without surrogates; U+0000 left for the caller to judge."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("string is not well-formed UTF-8") from None


def decode_utf8(raw: bytes) -> str:
    """UTF-8 string per [MQTT-1.5.4]: well-formed, no surrogates, no U+0000."""
    try:
        # Python's strict decoder already rejects overlong forms and encoded surrogates.
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("string is not well-formed UTF-8") from None
    if "\x00" in text:
        raise MalformedPacket("string contains U+0000")
    return text


def encode_varint(n: int) -> bytes:
    if n < 128:
        if n < 0:
            raise LocalProtocolError(f"variable byte integer {n} is negative")
        return _SMALL_VARINTS[n]
    if n > MAX_VARINT:
        raise LocalProtocolError(f"variable byte integer {n} exceeds {MAX_VARINT}")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_utf8(text: str) -> bytes:
    """Length-prefixed UTF-8 string; rejects what the peer would have to reject."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise LocalProtocolError("string contains a lone surrogate") from None
    except AttributeError:
        raise LocalProtocolError(f"expected str, got {type(text).__name__}") from None
    if len(raw) > 0xFFFF:
        raise LocalProtocolError("string longer than 65535 bytes")
    if "\x00" in text:
        raise LocalProtocolError("string contains U+0000")
    return len(raw).to_bytes(2, "big") + raw


def encode_binary(data: bytes) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise LocalProtocolError(f"expected bytes, got {type(data).__name__}")
    if len(data) > 0xFFFF:
        raise LocalProtocolError("binary data longer than 65535 bytes")
    return len(data).to_bytes(2, "big") + bytes(data)


def encode_u16(n: int, what: str) -> bytes:
    if type(n) is not int or not 0 <= n <= 0xFFFF:
        raise LocalProtocolError(f"{what} {n!r} is not a two-byte integer")
    return n.to_bytes(2, "big")


def encode_u32(n: int, what: str) -> bytes:
    if type(n) is not int or not 0 <= n <= 0xFFFFFFFF:
        raise LocalProtocolError(f"{what} {n!r} is not a four-byte integer")
    return n.to_bytes(4, "big")

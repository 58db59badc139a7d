"""A mesh link's frames read ahead (`routing.links.FramedStream`): however the bytes
arrive (one at a time, frames split anywhere, many frames in one receive), the same
frames come out in order; a frame too long is refused, a stream cut short ends in
EOFError."""

from __future__ import annotations

import os

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip import wire
from routing import links
from routing.links import FramedStream

SCALE = float(os.environ.get("MQTT_HYPOTHESIS_SCALE", "1"))  # as tests/mqtt/test_hypothesis.py


class _Chunks(trio.abc.Stream):
    """A stream whose receives hand out the given chunks (each at most what was asked)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.receives = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        self.receives += 1
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if max_bytes is not None and len(chunk) > max_bytes:
            self.chunks.insert(0, chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        return chunk

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        raise AssertionError("not sent to")

    async def wait_send_all_might_not_block(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class _Plain:
    """No cluster key: frames are length prefixes around their bodies."""

    def seal_frame(self, body: bytes) -> bytes:
        return wire.frame(body)

    def open_frame(self, body: bytes) -> bytes | None:
        return body

    async def open_member_stream(self, member_id: str) -> trio.abc.Stream | None:
        return None


def _read_all(chunks: list[bytes], count: int) -> tuple[list[bytes], BaseException | None, int]:
    """`count` frames read off a stream of `chunks`, what ended the reading if it ended
    early, and how many receives it took."""
    stream = _Chunks(chunks)
    framed = FramedStream(stream, _Plain(), "B")
    out: list[bytes] = []
    error: list[BaseException] = []

    async def main() -> None:
        try:
            for _ in range(count):
                out.append(await framed.receive_body())
        except (EOFError, wire.WireError) as exc:
            error.append(exc)

    trio.run(main)
    return out, (error[0] if error else None), stream.receives


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:]) if b > a]


@settings(max_examples=int(200 * SCALE), deadline=None)
@given(bodies=st.lists(st.binary(max_size=300), max_size=8), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_frames_come_out_the_same_however_their_bytes_arrive(bodies: list[bytes], cuts: list[int]) -> None:
    data = b"".join(wire.frame(b) for b in bodies)
    out, error, _ = _read_all(_cut(data, cuts), len(bodies))
    assert error is None and out == bodies


@settings(max_examples=int(100 * SCALE), deadline=None)
@given(bodies=st.lists(st.binary(max_size=100), min_size=1, max_size=5), cut=st.integers(min_value=1))
def test_a_stream_cut_short_ends_in_eof_after_the_whole_frames(bodies: list[bytes], cut: int) -> None:
    data = b"".join(wire.frame(b) for b in bodies)
    short = data[:len(data) - 1 - cut % len(data)]
    out, error, _ = _read_all(_cut(short, [7, 50]), len(bodies))
    assert isinstance(error, EOFError)
    assert out == bodies[:len(out)] and len(out) < len(bodies)


def test_frames_that_arrive_together_take_one_receive() -> None:
    bodies = [bytes([i]) * 1000 for i in range(20)]
    out, error, receives = _read_all([b"".join(wire.frame(b) for b in bodies)], len(bodies))
    assert error is None and out == bodies and receives == 1


def test_a_frame_longer_than_a_read_comes_whole() -> None:
    body = os.urandom(3 * links.READ_AHEAD + 5)
    out, error, receives = _read_all([wire.frame(body) + wire.frame(b"next")], 2)
    assert error is None and out == [body, b"next"] and receives == 4


def test_a_frame_over_the_limit_is_refused_before_it_is_read() -> None:
    header = (wire.MAX_FRAME + 1).to_bytes(4, "big")
    out, error, receives = _read_all([header + b"x" * 10], 1)
    assert isinstance(error, wire.WireError) and out == [] and receives == 1


@pytest.mark.parametrize("chunks", [[], [b"\x00\x00"]])
def test_a_closed_stream_ends_in_eof(chunks: list[bytes]) -> None:
    out, error, _ = _read_all(chunks, 1)
    assert isinstance(error, EOFError) and out == []

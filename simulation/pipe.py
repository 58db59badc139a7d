"""An in-memory byte connection between a simulated MQTT client and a node: two ends
of one duplex pipe, each a `mesh.streams.ByteStream`.

Unlike `trio.testing.memory_stream_pair` it can be severed from outside (`sever`): the
node's process died (kill -9) or the network dropped the connection, so neither end
delivers another byte and both see the connection broken, whatever either was about
to send (a killed node must not get a last DISCONNECT or will out through it).

Bytes take `latency` seconds to arrive (in order), as over a LAN: a client's reconnect
to another node takes time, as it does for a real device.
"""

from __future__ import annotations

from collections import deque

import trio

from clock import Clock


class _Direction:
    """The bytes going one way, and the task waiting for them."""

    __slots__ = ("buffer", "in_flight", "eof", "eof_at", "waiting")

    def __init__(self) -> None:
        self.buffer = bytearray()  # arrived, not yet read
        self.in_flight: deque[tuple[float, bytes]] = deque()  # (arrival time, bytes), in order
        self.eof = False  # the sender closed its end: the reader gets b"" once all has arrived and been read
        self.eof_at = 0.0
        self.waiting = trio.lowlevel.ParkingLot()

    def arrived(self, now: float) -> None:
        """Move what has arrived by `now` into the buffer."""
        in_flight = self.in_flight
        while in_flight and in_flight[0][0] <= now:
            self.buffer += in_flight.popleft()[1]

    def next_arrival(self) -> float | None:
        if self.in_flight:
            return self.in_flight[0][0]
        if self.eof and not self.buffer:
            return self.eof_at
        return None

    def wake(self) -> None:
        self.waiting.unpark_all()


class PipeEnd:
    """One end: `send_all` puts bytes on the way to the other end at once (no buffer
    limit: a simulated client reads what it gets), `receive_some` waits for bytes."""

    __slots__ = ("_pipe", "_inbound", "_outbound", "closed")

    def __init__(self, pipe: "Pipe", inbound: _Direction, outbound: _Direction) -> None:
        self._pipe = pipe
        self._inbound = inbound
        self._outbound = outbound
        self.closed = False

    def send_nowait(self, data: bytes) -> None:
        """Send without a checkpoint (the simulated client acknowledges from its reader)."""
        if self.closed:
            raise trio.ClosedResourceError("this end was closed")
        if self._pipe.severed or self._outbound.eof:
            raise trio.BrokenResourceError("connection lost")
        pipe = self._pipe
        if pipe.latency:
            self._outbound.in_flight.append((pipe.clock.now() + pipe.latency, data))
        else:
            self._outbound.buffer += data
        self._outbound.wake()

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.send_nowait(data)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        inbound = self._inbound
        pipe = self._pipe
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            if self.closed:
                raise trio.ClosedResourceError("this end was closed")
            if pipe.severed:
                raise trio.BrokenResourceError("connection lost")
            now = pipe.clock.now()
            inbound.arrived(now)
            if inbound.buffer:
                size = len(inbound.buffer) if max_bytes is None else min(max_bytes, len(inbound.buffer))
                data = bytes(inbound.buffer[:size])
                del inbound.buffer[:size]
                await trio.lowlevel.cancel_shielded_checkpoint()
                return data
            if inbound.eof and not inbound.in_flight and now >= inbound.eof_at:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return b""
            arrival = inbound.next_arrival()
            if arrival is None:
                await inbound.waiting.park()
            else:
                # Woken early by a sever or a close; else when the next bytes arrive.
                with trio.move_on_at(arrival):
                    await inbound.waiting.park()

    async def aclose(self) -> None:
        """Close this end (FIN): the other end reads what was sent, then EOF."""
        if not self.closed:
            self.closed = True
            self._outbound.eof = True
            self._outbound.eof_at = self._pipe.clock.now() + self._pipe.latency  # the FIN travels too
            self._outbound.wake()
            self._inbound.wake()  # our own reader, if any, sees the end closed
        await trio.lowlevel.checkpoint()


class Pipe:
    """A duplex connection: `client` and `server` ends, `latency` seconds apart."""

    def __init__(self, clock: Clock, latency: float = 0.0) -> None:
        self.clock = clock
        self.latency = latency
        self.severed = False
        to_server, to_client = _Direction(), _Direction()
        self.client = PipeEnd(self, inbound=to_client, outbound=to_server)
        self.server = PipeEnd(self, inbound=to_server, outbound=to_client)
        self._directions = (to_server, to_client)

    def sever(self) -> None:
        """The connection is gone at once (reset): buffered bytes are dropped, both
        ends' reads and writes fail."""
        self.severed = True
        for direction in self._directions:
            direction.buffer.clear()
            direction.in_flight.clear()
            direction.wake()

    @property
    def open(self) -> bool:
        return not self.severed and not (self.client.closed and self.server.closed)

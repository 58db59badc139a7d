"""An in-memory byte connection between a simulated MQTT client and a node: two ends
of one duplex pipe, each a `mesh.streams.ByteStream`.

Unlike `trio.testing.memory_stream_pair` it can be severed from outside (`sever`): the
node's process died (kill -9) or the network dropped the connection, so neither end
delivers another byte and both see the connection broken, whatever either was about
to send (a killed node must not get a last DISCONNECT or will out through it).
"""

from __future__ import annotations

import trio


class _Direction:
    """The bytes going one way, and the task waiting for them."""

    __slots__ = ("buffer", "eof", "waiting")

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.eof = False  # the sender closed its end: the reader gets b"" once the buffer is empty
        self.waiting = trio.lowlevel.ParkingLot()

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
        self._outbound.buffer += data
        self._outbound.wake()

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.send_nowait(data)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        inbound = self._inbound
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            if self.closed:
                raise trio.ClosedResourceError("this end was closed")
            if self._pipe.severed:
                raise trio.BrokenResourceError("connection lost")
            if inbound.buffer:
                size = len(inbound.buffer) if max_bytes is None else min(max_bytes, len(inbound.buffer))
                data = bytes(inbound.buffer[:size])
                del inbound.buffer[:size]
                await trio.lowlevel.cancel_shielded_checkpoint()
                return data
            if inbound.eof:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return b""
            await inbound.waiting.park()

    async def aclose(self) -> None:
        """Close this end (FIN): the other end reads what was sent, then EOF."""
        if not self.closed:
            self.closed = True
            self._outbound.eof = True
            self._outbound.wake()
            self._inbound.wake()  # our own reader, if any, sees the end closed
        await trio.lowlevel.checkpoint()


class Pipe:
    """A duplex connection: `client` and `server` ends."""

    def __init__(self) -> None:
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
            direction.wake()

    @property
    def open(self) -> bool:
        return not self.severed and not (self.client.closed and self.server.closed)

"""Mesh links: TCP connections between nodes on the gossip port, carrying forwarded
publishes (and route/retained sync) as length-prefixed CBOR frames sealed with the
cluster key (the gossip service does the sealing and owns the listening socket).

One outbound link per peer, opened lazily and reused.  Each forwarded batch gets a
sequence number; the peer answers `fwd_ack` once the batch is delivered and durable
there.  Unacknowledged batches are resent in order after a reconnect (at-least-once
across the hop; the receiver drops batches it has already taken, so a reconnect alone
does not duplicate).  The send queue is bounded: past `MAX_QUEUED` items, new QoS 0
items are dropped and counted, and QoS >= 1 items fail (their publishers are
acknowledged as if the peer were down, and the drop is counted and logged).
"""

from __future__ import annotations

import inspect
import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import trio

from gossip import wire
from gossip.service import read_frame

if TYPE_CHECKING:
    from gossip.service import GossipService

log = logging.getLogger("meshd.links")

MAX_QUEUED = 50_000
MAX_BATCH = 256
CONNECT_TIMEOUT = 3.0
BACKOFF_START = 0.1
BACKOFF_MAX = 5.0


class AckGate:
    """Counts the remote nodes a publisher's PUBACK/PUBREC still waits for (each one
    acknowledges a forwarded message, or is given up on as down)."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting = 0


class LinkItem:
    __slots__ = ("data", "qos", "gate")

    def __init__(self, data: list, qos: int, gate: AckGate | None) -> None:
        self.data = data
        self.qos = qos
        self.gate = gate


class FramedStream:
    """Envelopes over one TCP stream, sealed with the cluster key."""

    def __init__(self, stream: trio.abc.Stream, gossip: "GossipService", node_id: str) -> None:
        self.stream = stream
        self.gossip = gossip
        self.node_id = node_id
        self._send_lock = trio.Lock()

    async def send(self, msg_type: str, **fields: Any) -> None:
        body = wire.encode_frame_body(msg_type, self.node_id, fields)
        async with self._send_lock:
            await self.stream.send_all(self.gossip.seal_frame(body))

    async def receive(self) -> dict[str, Any]:
        opened = self.gossip.open_frame(await read_frame(self.stream))
        if opened is None:
            raise wire.WireError("frame failed authentication")
        return wire.decode_frame_body(opened)


class OutboundLink:
    """This node's link to one peer: a queue, a connection task, resends."""

    def __init__(self, peer: str, gossip: "GossipService", node_id: str, epoch: str, cluster_name: str,
                 on_acked: Callable[[list[LinkItem]], None]) -> None:
        self.peer = peer
        self.gossip = gossip
        self.node_id = node_id
        self.epoch = epoch
        self.cluster_name = cluster_name
        self.on_acked = on_acked
        self.queue: deque[LinkItem] = deque()
        self.unacked: dict[int, list[LinkItem]] = {}
        self._seq = itertools.count(1)
        self._wake = trio.Event()
        self.cancel_scope = trio.CancelScope()
        self.dropped = 0
        self.sent_batches = 0
        self.connected = False
        # Items ever queued, and items acknowledged or given up: a fence waits until
        # `settled` reaches what `enqueued` was when it started.
        self.enqueued = 0
        self.settled = 0
        self.requests: deque[tuple[str, dict[str, Any], Callable[[dict[str, Any]], None]]] = deque()
        self._pending_replies: deque[Callable[[dict[str, Any]], None]] = deque()

    def enqueue(self, item: LinkItem) -> bool:
        if len(self.queue) >= MAX_QUEUED:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.warning("link to %s: send queue full (%d); dropped %d messages", self.peer, MAX_QUEUED, self.dropped)
            return False
        self.queue.append(item)
        self.enqueued += 1
        self._wake.set()
        return True

    def request(self, msg_type: str, fields: dict[str, Any], on_reply: Callable[[dict[str, Any]], None]) -> None:
        """A request whose single reply frame goes to `on_reply` (route/retained sync)."""
        self.requests.append((msg_type, fields, on_reply))
        self._wake.set()

    async def drained(self, mark: int) -> None:
        """Until every item queued before `mark` was acknowledged (or given up)."""
        while self.settled < mark:
            await trio.sleep(0.002)

    def fail_all(self) -> list[LinkItem]:
        """The peer is down: hand back everything not acknowledged."""
        items = [i for batch in self.unacked.values() for i in batch] + list(self.queue)
        self.settled += len(items)
        self.unacked.clear()
        self.queue.clear()
        self.requests.clear()
        self._pending_replies.clear()
        return items

    async def run(self) -> None:
        backoff = BACKOFF_START
        with self.cancel_scope:
            while True:
                addr = self.gossip.member_address(self.peer)
                if addr is None:
                    await trio.sleep(backoff)
                    backoff = min(BACKOFF_MAX, backoff * 2)
                    continue
                try:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        stream = await trio.open_tcp_stream(addr[0], addr[1])
                except (OSError, trio.TooSlowError) as exc:
                    log.debug("link to %s (%s:%d): %s", self.peer, addr[0], addr[1], exc)
                    await trio.sleep(backoff)
                    backoff = min(BACKOFF_MAX, backoff * 2)
                    continue
                backoff = BACKOFF_START
                try:
                    async with stream:
                        await self._serve(FramedStream(stream, self.gossip, self.node_id))
                except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError, EOFError, wire.WireError) as group:
                    log.info("link to %s lost: %s", self.peer, group.exceptions[0])
                self.connected = False
                # Replies that will never come: their requests go again on the next link.
                self._pending_replies.clear()
                await trio.sleep(backoff)

    async def _serve(self, link: FramedStream) -> None:
        await link.send("link_hello", c=self.cluster_name, e=self.epoch)
        self.connected = True
        log.debug("link to %s up", self.peer)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_acks, link, nursery.cancel_scope)
            # Resend what the previous connection left unacknowledged, in order.
            for seq in sorted(self.unacked):
                await link.send("fwd", e=self.epoch, s=seq, m=[i.data for i in self.unacked[seq]])
            while True:
                while self.requests:
                    msg_type, fields, on_reply = self.requests.popleft()
                    self._pending_replies.append(on_reply)
                    await link.send(msg_type, **fields)
                while self.queue:
                    batch = [self.queue.popleft() for _ in range(min(MAX_BATCH, len(self.queue)))]
                    seq = next(self._seq)
                    self.unacked[seq] = batch
                    await link.send("fwd", e=self.epoch, s=seq, m=[i.data for i in batch])
                    self.sent_batches += 1
                self._wake = trio.Event()
                if not self.queue and not self.requests:
                    await self._wake.wait()

    async def _read_acks(self, link: FramedStream, scope: trio.CancelScope) -> None:
        while True:
            frame = await link.receive()
            if frame["t"] == "fwd_ack":
                batch = self.unacked.pop(frame.get("s"), None)
                if batch:
                    self.settled += len(batch)
                    self.on_acked(batch)
            elif self._pending_replies:
                self._pending_replies.popleft()(frame)


class InboundLinks:
    """Accepts links from peers and hands their frames to `handle_batch`."""

    def __init__(self, cluster_name: str, gossip: "GossipService", node_id: str,
                 handle_batch: Callable[[str, list[list]], Any],
                 wait_durable: Callable[[], Any],
                 handle_request: Callable[[str, dict[str, Any]], Any]) -> None:
        self.cluster_name = cluster_name
        self.gossip = gossip
        self.node_id = node_id
        self.handle_batch = handle_batch
        self.wait_durable = wait_durable
        self.handle_request = handle_request
        # Highest batch taken per (peer, peer epoch): resends after a reconnect are
        # acknowledged without being delivered again.
        self.taken: dict[tuple[str, str], int] = {}
        self.malformed = 0

    async def serve(self, stream: trio.abc.Stream, hello: dict[str, Any]) -> None:
        peer = hello["from"]
        if hello.get("c") != self.cluster_name:
            log.warning("refused a mesh link from %s of cluster %r", peer, hello.get("c"))
            return
        link = FramedStream(stream, self.gossip, self.node_id)
        try:
            while True:
                frame = await link.receive()
                kind = frame["t"]
                if kind == "fwd":
                    await self._take_batch(link, peer, frame)
                else:
                    reply = self.handle_request(peer, frame)
                    if inspect.isawaitable(reply):
                        reply = await reply
                    if reply is not None:
                        msg_type, fields = reply
                        await link.send(msg_type, **fields)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, EOFError) as exc:
            log.debug("link from %s closed: %s", peer, exc)
        except (wire.WireError, KeyError, TypeError, ValueError) as exc:
            self.malformed += 1
            log.warning("link from %s: dropping a malformed frame and the link: %s", peer, exc)

    async def _take_batch(self, link: FramedStream, peer: str, frame: dict[str, Any]) -> None:
        epoch, seq, items = frame["e"], frame["s"], frame["m"]
        if not isinstance(epoch, str) or not isinstance(seq, int) or not isinstance(items, list):
            raise ValueError("bad fwd frame")
        key = (peer, epoch)
        if seq > self.taken.get(key, 0):
            self.handle_batch(peer, items)
            self.taken[key] = seq
            # Acknowledge only what is durable here (principle 6 across the hop).
            await self.wait_durable()
        await link.send("fwd_ack", s=seq)


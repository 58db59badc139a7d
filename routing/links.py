"""Mesh links: TCP connections between nodes on the gossip port, carrying forwarded
publishes (and route/retained sync) as length-prefixed CBOR frames sealed with the
cluster key (the gossip service does the sealing and owns the listening socket).

One outbound link per peer, opened lazily and reused.  Each forwarded batch gets a
sequence number; the peer answers `fwd_ack` once the batch is delivered and durable
there.  Unacknowledged batches are resent in order after a reconnect (at-least-once
across the hop; the receiver drops batches it has already taken, so a reconnect alone
does not duplicate; a batch sent again carries a resend mark, so a receiver that took
it although it came again, having restarted meanwhile, knows its messages may have
been delivered before).  A batch goes as a `fwd` frame, or as the batched `fwdb` frame
(`routing.batch`) once the peer has said it reads those: a link's hello names the
capabilities of its sender (`caps`, ignored by older versions), and a receiver that
sees them answers with its own (`link_caps`, which only a sender that announced
capabilities is sent).  Between two such nodes the receiver also acknowledges
cumulatively (one `fwd_ack` for every batch up to its `s`); the sender takes every
`fwd_ack` so, which is what an older receiver's one ack per batch, in order, amounts
to.  The send queue is bounded: past `MAX_QUEUED` items, new QoS 0
items are dropped and counted, and QoS >= 1 items fail (their publishers are
acknowledged as if the peer were down, and the drop is counted and logged).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
from collections import deque
from typing import Any, Awaitable, Callable, Mapping, Protocol

import trio

from gossip import wire
from routing.batch import (CAPABILITIES, FWDB, RESENT, AckGate, LinkItem, Queued, Unpacked, fwdb_body, link_item,
                           read_fwdb, sent_before, unpack, unpack_fwd, unpack_read)

__all__ = ["AckGate", "FramedStream", "InboundLinks", "LinkItem", "OutboundLink", "Queued"]


class LinkGossip(Protocol):
    """What a mesh link needs of gossip: where a member listens, and the cluster key's
    sealing (gossip owns the key and the listening socket)."""

    async def open_member_stream(self, member_id: str) -> trio.abc.Stream | None:
        """A new stream to the member (None while its address is unknown); OSError
        when it cannot be reached. Links never open sockets themselves: the transport
        behind this is TCP in a node and the in-memory network in simulation."""

    def seal_frame(self, body: bytes) -> bytes: ...

    def open_frame(self, body: bytes) -> bytes | None: ...


log = logging.getLogger("meshd.links")

MAX_QUEUED = 50_000
MAX_BATCH = 256
CONNECT_TIMEOUT = 3.0
BACKOFF_START = 0.1
BACKOFF_MAX = 5.0


# A decoded frame from a peer (a CBOR map): its fields are checked where they are read.
Frame = dict[str, Any]
# The fields of a frame this node sends (anything the CBOR encoder takes).
Fields = Mapping[str, object]
# A request's answer: (frame type, fields), or None for no answer.
Reply = tuple[str, Fields] | None


class _Marker:
    """A request that travels in the forward queue, behind everything queued before it:
    its reply proves the peer has taken those batches (a handoff fence)."""

    __slots__ = ("on_reply",)

    def __init__(self, on_reply: Callable[[Frame], None]) -> None:
        self.on_reply = on_reply


# Bytes asked of the socket per read (a frame longer than this takes several).
READ_AHEAD = 65536


class FramedStream:
    """Envelopes over one TCP stream, sealed with the cluster key.

    Reads ahead: the frames that arrived together come out of one receive (one system
    call and one wake-up), where reading each frame's header and then its body cost
    two or more per frame (a forwarding link's batches and acknowledgements come in
    runs).  So nothing else may read the stream once it is framed here."""

    def __init__(self, stream: trio.abc.Stream, gossip: LinkGossip, node_id: str) -> None:
        self.stream = stream
        self.gossip = gossip
        self.node_id = node_id
        self._send_lock = trio.Lock()
        self._data = b""  # read, not yet taken: the frames from `_at` on
        self._at = 0

    async def send(self, msg_type: str, **fields: object) -> None:
        await self.send_body(wire.encode_frame_body(msg_type, self.node_id, fields))

    async def send_body(self, body: bytes) -> None:
        """One envelope encoded by the caller (`routing.batch.fwdb_body`)."""
        async with self._send_lock:
            await self.stream.send_all(self.gossip.seal_frame(body))

    async def receive(self) -> Frame:
        return wire.decode_frame_body(await self.receive_body())

    async def receive_body(self) -> bytes:
        """One envelope, opened, not decoded yet."""
        opened = self.gossip.open_frame(await self._read_frame())
        if opened is None:
            raise wire.WireError("frame failed authentication")
        return opened

    async def _read_frame(self) -> bytes:
        """One length-prefixed frame body (still sealed), as `gossip.service.read_frame`
        reads it, from what was read ahead when it is all there."""
        data, at = self._data, self._at
        while len(data) - at < 4:
            data, at = data[at:] + await self._receive(bool(len(data) - at)), 0
        end = at + 4 + wire.frame_length(data[at:at + 4])
        if len(data) < end:
            # The rest of a longer frame: its pieces joined once.
            parts = [data[at:]]
            have = len(data) - at
            end -= at
            while have < end:
                chunk = await self._receive(True)
                parts.append(chunk)
                have += len(chunk)
            data, at = b"".join(parts), 0
        self._data, self._at = data, end
        return data[at + 4:end]

    async def _receive(self, mid_frame: bool) -> bytes:
        chunk = await self.stream.receive_some(READ_AHEAD)
        if not chunk:
            raise EOFError("stream closed mid-frame" if mid_frame else "stream closed")
        return chunk if isinstance(chunk, bytes) else bytes(chunk)


class OutboundLink:
    """This node's link to one peer: a queue, a connection task, resends."""

    def __init__(self, peer: str, gossip: LinkGossip, node_id: str, epoch: str, cluster_name: str,
                 on_acked: Callable[[list[Queued]], None]) -> None:
        self.peer = peer
        self.gossip = gossip
        self.node_id = node_id
        self.epoch = epoch
        self.cluster_name = cluster_name
        self.on_acked = on_acked
        # What waits to be sent, in order; a handoff fence's marker goes out once the
        # items queued before it have (`_markers`: (items queued before it, marker)).
        # A list, not a deque: a batch of the whole queue is taken in one swap.
        self.queue: list[Queued] = []
        self._markers: deque[tuple[int, _Marker]] = deque()
        self._queued_total = 0  # items ever queued (the markers' positions count these)
        self._taken_total = 0  # items ever taken off the queue into a batch (or failed)
        self.unacked: dict[int, list[Queued]] = {}
        self.sent_queued = 0  # queued items that were sent before (`LinkItem.sent`)
        self._seq = itertools.count(1)
        self._wake = trio.Event()
        self._retry = trio.Event()  # set: reconnect now, without waiting out the backoff
        self.cancel_scope = trio.CancelScope()
        self.dropped = 0
        self.sent_batches = 0
        self.connected = False
        self.batched = False  # the peer on this connection reads `fwdb` frames
        self.requests: deque[tuple[str, Fields, Callable[[Frame], None]]] = deque()
        self._pending_replies: deque[Callable[[Frame], None]] = deque()

    def enqueue(self, item: Queued) -> bool:
        if len(self.queue) >= MAX_QUEUED:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.warning("link to %s: send queue full (%d); dropped %d messages", self.peer, MAX_QUEUED, self.dropped)
            return False
        queue = self.queue
        queue.append(item)
        self._queued_total += 1
        if type(item) is LinkItem and item.sent:
            self.sent_queued += 1
        if len(queue) == 1:
            # The sender waits only on an empty queue: an item behind others needs no
            # wake-up (one Event.set per burst, not per message).
            self._wake.set()
        return True

    def request(self, msg_type: str, fields: Fields, on_reply: Callable[[Frame], None]) -> None:
        """A request whose single reply frame goes to `on_reply` (route/retained sync)."""
        self.requests.append((msg_type, fields, on_reply))
        self._wake.set()

    async def taken(self) -> None:
        """Until the peer has taken everything queued so far (delivered it to its
        sessions; not necessarily synced): a marker rides the queue behind it."""
        answered = trio.Event()
        self._markers.append((self._queued_total, _Marker(lambda frame: answered.set())))
        self._wake.set()
        # Someone waits on this link (a handoff fence): a link in its reconnect backoff
        # tries again at once, so what it holds unacknowledged (resent first on the new
        # connection) reaches a restarted peer before the fence is answered.
        self.retry_now()
        await answered.wait()

    def retry_now(self) -> None:
        """Cut a reconnect backoff short (the peer is wanted, or known to be back)."""
        self._retry.set()

    async def _back_off(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            await self._retry.wait()
        self._retry = trio.Event()

    def pending(self) -> list[Queued]:
        """Everything not acknowledged yet, in the order it was queued."""
        return [i for seq in sorted(self.unacked) for i in self.unacked[seq]] + self.queue

    def fail_all(self) -> list[Queued]:
        """The peer is down: hand back everything not acknowledged (what went in a
        batch marked `sent`)."""
        for batch in self.unacked.values():
            for item in batch:
                if type(item) is LinkItem:
                    item.sent = True
        self.sent_queued = 0
        items = self.pending()
        self.unacked.clear()
        self.queue.clear()
        self._markers.clear()
        self._taken_total = self._queued_total
        self.requests.clear()
        self._pending_replies.clear()
        return items

    async def run(self) -> None:
        backoff = BACKOFF_START
        with self.cancel_scope:
            while True:
                try:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        stream = await self.gossip.open_member_stream(self.peer)
                except (OSError, trio.TooSlowError) as exc:
                    log.debug("link to %s: %s", self.peer, exc)
                    stream = None
                if stream is None:
                    await self._back_off(backoff)
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
                await self._back_off(backoff)

    async def _serve(self, link: FramedStream) -> None:
        self.batched = False  # until this connection's peer says otherwise
        await link.send("link_hello", c=self.cluster_name, e=self.epoch, caps=list(CAPABILITIES))
        self.connected = True
        log.debug("link to %s up", self.peer)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_acks, link, nursery.cancel_scope)
            # Resend what the previous connection left unacknowledged, in order.
            for seq in sorted(self.unacked):
                await self._send_batch(link, seq, self.unacked[seq], resent=True)
            while True:
                while self.requests:
                    msg_type, fields, on_reply = self.requests.popleft()
                    self._pending_replies.append(on_reply)
                    await link.send(msg_type, **fields)
                while self.queue or self._markers:
                    batch = self._take_batch()
                    marker = None
                    markers = self._markers
                    if markers and markers[0][0] <= self._taken_total:
                        marker = markers.popleft()[1]
                    if batch:
                        seq = next(self._seq)
                        self.unacked[seq] = batch
                        resent = False
                        if self.sent_queued:
                            again = sent_before(batch)
                            self.sent_queued -= again
                            resent = again > 0
                        await self._send_batch(link, seq, batch, resent)
                        self.sent_batches += 1
                    if marker is not None:
                        self._pending_replies.append(marker.on_reply)
                        await link.send("ho_mark")
                self._wake = trio.Event()
                if not self.queue and not self._markers and not self.requests:
                    await self._wake.wait()

    def _take_batch(self) -> list[Queued]:
        """The next batch off the queue: at most MAX_BATCH items, none queued after the
        first waiting marker; the whole queue in one swap when that is all of it."""
        queue = self.queue
        limit = MAX_BATCH
        markers = self._markers
        if markers:
            limit = min(limit, markers[0][0] - self._taken_total)
        if len(queue) <= limit:
            batch, self.queue = queue, []
        else:
            batch = queue[:limit]
            del queue[:limit]
        self._taken_total += len(batch)
        return batch

    async def _send_batch(self, link: FramedStream, seq: int, batch: list[Queued], resent: bool = False) -> None:
        if self.batched:
            await link.send_body(fwdb_body(self.node_id, self.epoch, seq, batch, resent))
        elif resent:
            await link.send("fwd", e=self.epoch, s=seq, m=[link_item(i).fwd_item() for i in batch], **{RESENT: True})
        else:
            await link.send("fwd", e=self.epoch, s=seq, m=[link_item(i).fwd_item() for i in batch])

    async def _read_acks(self, link: FramedStream, scope: trio.CancelScope) -> None:
        unacked = self.unacked
        while True:
            frame = await link.receive()
            kind = frame["t"]
            if kind == "fwd_ack":
                seq = frame.get("s")
                if not isinstance(seq, int):
                    continue
                # Every batch up to `seq` (batches are numbered in the order they are
                # queued, and `unacked` keeps that order across resends).
                while unacked:
                    first = next(iter(unacked))
                    if first > seq:
                        break
                    self.on_acked(unacked.pop(first))
            elif kind == "link_caps":
                caps = frame.get("caps")
                self.batched = isinstance(caps, list) and FWDB in caps
            elif self._pending_replies:
                self._pending_replies.popleft()(frame)


class InboundLinks:
    """Accepts links from peers and hands their frames to `handle_batch`."""

    def __init__(self, cluster_name: str, gossip: LinkGossip, node_id: str,
                 handle_batch: Callable[[str, list[object], Callable[[object], Unpacked], bool], None],
                 batch_taken: Callable[[], Awaitable[None]],
                 handle_request: Callable[[str, Frame], Reply | Awaitable[Reply]]) -> None:
        self.cluster_name = cluster_name
        self.gossip = gossip
        self.node_id = node_id
        # (peer, items, how to read each one, resent: the batch's resend mark)
        self.handle_batch = handle_batch
        self.batch_taken = batch_taken  # waits until a taken batch may be acknowledged
        self.handle_request = handle_request
        # Highest batch taken per (peer, peer epoch): resends after a reconnect are
        # acknowledged without being delivered again.
        self.taken: dict[tuple[str, str], int] = {}
        self.malformed = 0

    async def serve(self, stream: trio.abc.Stream, hello: Frame) -> None:
        peer = hello["from"]
        if hello.get("c") != self.cluster_name:
            log.warning("refused a mesh link from %s of cluster %r", peer, hello.get("c"))
            return
        link = FramedStream(stream, self.gossip, self.node_id)
        caps = hello.get("caps")
        # A peer that names its capabilities is told ours, and acknowledged cumulatively.
        cumulative = isinstance(caps, list)
        try:
            if cumulative:
                await link.send("link_caps", caps=list(CAPABILITIES))
            async with trio.open_nursery() as nursery:
                # Batches are taken as they come; each is acknowledged, in order, once
                # `batch_taken` allows (in sync durability: what it wrote is synced here),
                # so reading never waits for a sync.
                acks_in, acks_out = trio.open_memory_channel[int](math.inf)
                nursery.start_soon(self._acknowledge, link, acks_out, cumulative)
                try:
                    await self._read_frames(link, peer, acks_in)
                finally:
                    nursery.cancel_scope.cancel()
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError, EOFError) as group:
            log.debug("link from %s closed: %s", peer, group.exceptions[0])
        except* (wire.WireError, KeyError, TypeError, ValueError) as group:
            self.malformed += 1
            log.warning("link from %s: dropping a malformed frame and the link: %s", peer, group.exceptions[0])

    async def _acknowledge(self, link: FramedStream, acks: trio.MemoryReceiveChannel[int], cumulative: bool) -> None:
        async for seq in acks:
            if cumulative:
                # Every batch taken so far (each was taken before its number was put
                # here): one wait and one ack for all of them.
                while True:
                    try:
                        seq = acks.receive_nowait()
                    except trio.WouldBlock:
                        break
            await self.batch_taken()
            await link.send("fwd_ack", s=seq)

    async def _read_frames(self, link: FramedStream, peer: str, acks: trio.MemorySendChannel[int]) -> None:
        while True:
            body = await link.receive_body()
            read = read_fwdb(body)
            if read is not None:
                # A `fwdb` frame read by hand (`routing.batch.read_fwdb`): no envelope map.
                epoch, seq, resent, items = read
                self._take_items(peer, epoch, seq, items, unpack_read, resent)
                acks.send_nowait(seq)
                continue
            frame = wire.decode_frame_body(body)
            kind = frame["t"]
            if kind == "fwd" or kind == FWDB:
                self._take_batch(peer, frame, unpack if kind == FWDB else unpack_fwd)
                acks.send_nowait(frame["s"])
            elif kind == "ho_mark":
                await link.send("ho_marked")
            else:
                reply = self.handle_request(peer, frame)
                if inspect.isawaitable(reply):
                    reply = await reply
                if reply is not None:
                    msg_type, fields = reply
                    await link.send(msg_type, **fields)

    def _take_batch(self, peer: str, frame: Frame, read: Callable[[object], Unpacked]) -> None:
        epoch, seq, items = frame["e"], frame["s"], frame["m"]
        if not isinstance(epoch, str) or not isinstance(seq, int) or not isinstance(items, list):
            raise ValueError("bad fwd frame")
        self._take_items(peer, epoch, seq, items, read, frame.get(RESENT) is True)

    def _take_items(self, peer: str, epoch: str, seq: int, items: list[object], read: Callable[[object], Unpacked],
                    resent: bool) -> None:
        key = (peer, epoch)
        if seq > self.taken.get(key, 0):
            self.handle_batch(peer, items, read, resent)
            self.taken[key] = seq


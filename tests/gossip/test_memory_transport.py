"""Real GossipService instances on the in-memory network, in virtual time
(trio.testing.MockClock): the Trio driver itself, deterministic enough for
exact timing bounds, and fast."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import trio
import trio.testing

from gossip.config import LAN
from gossip.formulas import suspicion_bounds
from gossip.service import GossipService
from gossip.trace import NullTraceWriter
from gossip.memory_network import MemoryNetwork


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def view(svc: GossipService) -> dict[str, str]:
    return {m["id"]: m["state"] for m in svc.members()}


async def until(cond: Callable[[], bool], timeout: float) -> float:
    start = trio.current_time()
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.05)
    return trio.current_time() - start


async def test_lan_cluster_in_virtual_time(mock_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.002, loss=0.05, seed=1)
    ids = [f"v{i}" for i in range(6)]
    scopes: dict[str, trio.CancelScope] = {}
    services: dict[str, GossipService] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(net.run)

        async def start(node: str, seeds: list[tuple[str, int]]) -> None:
            svc = GossipService(
                node_id=node, bind_host=node, bind_port=7946, seeds=seeds, mdns=False, trace=NullTraceWriter(),
                preset="lan", transport=net.transport(node), seed=int(node[1:]),
            )
            services[node] = svc
            scope = trio.CancelScope()
            scopes[node] = scope

            async def runner(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                with scope:
                    await svc.run(task_status=task_status)

            await nursery.start(runner)

        for node in ids:
            await start(node, [] if node == "v0" else [("v0", 7946)])
        took = await until(lambda: all(view(s) == {i: "alive" for i in ids} for s in services.values()), 30)
        assert took < 5.0  # joins are push-pulls: one view within a few virtual seconds

        got: list[object] = []
        services["v2"].on_broadcast("cfg", lambda origin, p: got.append((origin, p)))
        services["v5"].broadcast("cfg", "k", 42)
        assert await until(lambda: got == [("v5", 42)], 10) < 2.0

        # v4 crashes; every other member marks it dead within the formula's bound
        scopes["v4"].cancel()
        net.transports[("v4", 7946)].close()
        lo, hi = suspicion_bounds(LAN.suspicion_mult, LAN.suspicion_max_timeout_mult, 6, LAN.probe_interval)
        others = [s for n, s in services.items() if n != "v4"]
        took = await until(lambda: all(view(s)["v4"] == "dead" for s in others), 120)
        assert lo <= took <= hi + 2 * LAN.probe_interval + 1.0

        # a partition: v0..v2 | v3, v5; each side gives up on the other, then heals
        net.cut(["v0", "v1", "v2"], ["v3", "v5"])
        await until(lambda: view(services["v0"])["v5"] == "dead" and view(services["v5"])["v0"] == "dead", 120)
        net.heal()
        await until(lambda: all(view(services[n])[m] == "alive" for n in ("v0", "v5") for m in ("v0", "v3", "v5")), 120)
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------- streams
#
# Two hosts, "a" and "b", and a stream a -> b opened through the transport interface.
# Numbers are powers of two so virtual times are exact floats.


class Pair:
    def __init__(self, net: MemoryNetwork, nursery: trio.Nursery) -> None:
        self.net = net
        self.nursery = nursery
        self.a = net.transport("a")
        self.b = net.transport("b")
        self._send, self._accepted = trio.open_memory_channel[trio.abc.Stream](16)

    async def start(self) -> "Pair":
        await self.nursery.start(self.net.run)

        async def owns(stream: trio.abc.Stream) -> None:
            await self._send.send(stream)
            await trio.sleep_forever()

        self.nursery.start_soon(self.b.serve_streams, owns)
        return self

    async def connect(self) -> tuple[trio.abc.Stream, trio.abc.Stream]:
        ours = await self.a.open_stream(self.b.address)
        return ours, await self._accepted.receive()


async def read_exactly(stream: trio.abc.Stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some()
        assert chunk, "EOF before all bytes came"
        buf += chunk
    return bytes(buf)


async def test_stream_keeps_order_under_jitter(mock_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.05, jitter=0.9, seed=3)
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        writes = [f"<{i}>".encode() for i in range(300)]
        for w in writes:
            await ours.send_all(w)
        assert await read_exactly(theirs, sum(map(len, writes))) == b"".join(writes)
        nursery.cancel_scope.cancel()


async def test_latency_and_bandwidth_give_exact_arrival_times(mock_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.25, jitter=0.0, bandwidth=1024.0)
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        assert trio.current_time() == 0.5  # SYN + SYN-ACK: one round trip
        await ours.send_all(b"x" * 2048)
        assert trio.current_time() == 2.5  # the writer spent 2048 / 1024 s sending
        assert await read_exactly(theirs, 2048) == b"x" * 2048
        assert trio.current_time() == 2.75  # and the last byte landed one latency later

        # a second stream on the same link shares its bandwidth: its write waits for ours
        ours2, theirs2 = await pair.connect()
        t0 = trio.current_time()
        arrivals: dict[str, float] = {}

        async def write(stream: trio.abc.Stream, n: int) -> None:
            await stream.send_all(b"y" * n)

        async def read(name: str, stream: trio.abc.Stream, n: int) -> None:
            await read_exactly(stream, n)
            arrivals[name] = trio.current_time() - t0

        async with trio.open_nursery() as inner:
            inner.start_soon(read, "first", theirs, 1024)
            inner.start_soon(read, "second", theirs2, 512)
            await write(ours, 1024)
            await write(ours2, 512)
        assert arrivals == {"first": 1.25, "second": 1.75}

        # the other direction has its own capacity, and a per-link override wins
        net.set_link("b", "a", latency=0.125, bandwidth=4096.0)
        t0 = trio.current_time()
        await theirs.send_all(b"z" * 4096)
        assert await read_exactly(ours, 4096) == b"z" * 4096
        assert trio.current_time() - t0 == 1.125
        nursery.cancel_scope.cancel()


async def test_one_way_cut_stalls_one_direction_and_heal_releases_in_order(
    mock_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork(latency=0.25, jitter=0.0)
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        net.cut("a", "b", one_way=True)

        for i in range(3):
            await ours.send_all(b"held%d;" % i)  # the writes go: TCP holds them
        with trio.move_on_after(30):
            await theirs.receive_some()
            raise AssertionError("bytes crossed a cut")

        # b -> a is open: one latency, as ever
        t0 = trio.current_time()
        await theirs.send_all(b"back")
        assert await read_exactly(ours, 4) == b"back"
        assert trio.current_time() - t0 == 0.25

        # a new connect a -> b hangs (the SYN goes unanswered) until the caller gives up
        with trio.move_on_after(3) as scope:
            await pair.a.open_stream(pair.b.address)
        assert scope.cancelled_caught
        # datagrams obey the same cut
        await pair.a.send_packet(b"ping", pair.b.address)
        await pair.b.send_packet(b"pong", pair.a.address)
        assert await pair.a.receive_packet() == (b"pong", pair.b.address)
        assert net.dropped == 1

        healed_at = trio.current_time()
        net.heal()
        assert await read_exactly(theirs, 18) == b"held0;held1;held2;"
        assert trio.current_time() - healed_at == 0.25  # resent one latency after the heal
        await ours.send_all(b"after")
        assert await read_exactly(theirs, 5) == b"after"
        nursery.cancel_scope.cancel()


async def test_two_way_cut_and_down_stall_both_directions(mock_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.25, jitter=0.0, syn_timeout=60.0)
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        net.cut(["a"], ["b", "c"])
        await ours.send_all(b"1")
        await theirs.send_all(b"2")
        with trio.move_on_after(10):
            await ours.receive_some()
            raise AssertionError("bytes crossed a cut")
        with trio.move_on_after(10):
            await theirs.receive_some()
            raise AssertionError("bytes crossed a cut")
        # without a timeout of its own, a connect fails when the SYNs run out
        t0 = trio.current_time()
        with pytest.raises(TimeoutError):
            await pair.a.open_stream(pair.b.address)
        assert trio.current_time() - t0 == 60.0
        net.heal(["a"], ["b", "c"])
        assert await read_exactly(ours, 1) == b"2"
        assert await read_exactly(theirs, 1) == b"1"

        net.down("b")
        await ours.send_all(b"3")
        with trio.move_on_after(10):
            await theirs.receive_some()
            raise AssertionError("bytes reached a host that is down")
        # a connect that starts across a partition completes once it heals
        async with trio.open_nursery() as inner:
            inner.start_soon(pair.connect)
            await trio.sleep(5)
            net.up("b")
        assert await read_exactly(theirs, 1) == b"3"
        nursery.cancel_scope.cancel()


async def test_reset_breaks_both_ends(mock_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.25, jitter=0.0)
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        other_ours, other_theirs = await pair.connect()
        await ours.send_all(b"lost in the reset")
        broken: list[str] = []

        async def reader(name: str, stream: trio.abc.Stream) -> None:
            with pytest.raises(trio.BrokenResourceError):
                while True:
                    await stream.receive_some()
            broken.append(name)

        async with trio.open_nursery() as inner:
            inner.start_soon(reader, "a", ours)
            inner.start_soon(reader, "b", theirs)
            await trio.sleep(0.125)  # the bytes are still on the wire
            assert net.reset("b", "a") == 2
        assert sorted(broken) == ["a", "b"]
        for stream in (ours, theirs, other_ours, other_theirs):
            with pytest.raises(trio.BrokenResourceError):
                await stream.send_all(b"x")

        # a link whose writes reset its connection (loss as a dropped connection)
        net.set_link("a", "b", reset=1.0)
        ours, theirs = await pair.connect()
        with pytest.raises(trio.BrokenResourceError):
            await ours.send_all(b"x")
        with pytest.raises(trio.BrokenResourceError):
            await theirs.receive_some()
        assert net.resets == 3

        # a crashed node's transport: as a kernel closes a dead process's sockets, a
        # connection whose every byte it had read ends with a FIN after what it sent;
        # one with bytes it had not read is reset
        net.set_link("a", "b", reset=0.0)
        ours, theirs = await pair.connect()
        unread_ours, unread_theirs = await pair.connect()
        await theirs.send_all(b"last reply")
        await unread_ours.send_all(b"never read")
        pair.b.close()  # both still on the wire (latency 0.25 s)
        assert await read_exactly(ours, 10) == b"last reply"
        assert await ours.receive_some() == b""
        with pytest.raises(trio.BrokenResourceError):
            await unread_ours.receive_some()
        with pytest.raises(OSError):
            await pair.a.open_stream(pair.b.address)  # nobody listens there now: refused
        nursery.cancel_scope.cancel()


async def test_without_kernel_close_a_crash_resets_every_connection(mock_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.25, jitter=0.0, kernel_close=False)
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        pair.b.close()
        with pytest.raises(trio.BrokenResourceError):
            await ours.receive_some()
        nursery.cancel_scope.cancel()


async def test_close_is_a_fin_behind_the_data(mock_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.25, jitter=0.5, seed=9)
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        await ours.send_all(b"last words")
        await ours.aclose()
        assert await read_exactly(theirs, 10) == b"last words"
        assert await theirs.receive_some() == b""
        with pytest.raises(trio.BrokenResourceError):
            await theirs.send_all(b"to nobody")
        with pytest.raises(trio.ClosedResourceError):
            await ours.send_all(b"x")
        nursery.cancel_scope.cancel()


async def test_window_pushes_back_on_a_writer_whose_reader_does_not_read(
    mock_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork(latency=0.25, jitter=0.0, stream_window=4096)
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        await ours.send_all(b"a" * 4096)
        with trio.move_on_after(10) as scope:
            await ours.send_all(b"b")
        assert scope.cancelled_caught  # blocked: 4096 bytes unread
        t0 = trio.current_time()
        async with trio.open_nursery() as inner:
            inner.start_soon(ours.send_all, b"c")
            assert await read_exactly(theirs, 4096) == b"a" * 4096
        assert await read_exactly(theirs, 1) == b"c"
        assert trio.current_time() - t0 == 0.25
        nursery.cancel_scope.cancel()


async def arrival_times(seed: int) -> tuple[list[float], list[float]]:
    """When the bytes of 50 writes over a jittery, capped link arrive, and when
    datagrams (some lost) do, from the start of the run."""
    net = MemoryNetwork(latency=0.1, jitter=0.8, loss=0.2, bandwidth=10_000.0, seed=seed)
    start = trio.current_time()
    streams: list[float] = []
    packets: list[float] = []
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        streams.append(round(trio.current_time() - start, 9))

        async def reader() -> None:
            got = 0
            while got < 50 * 100:
                got += len(await theirs.receive_some())
                streams.append(round(trio.current_time() - start, 9))

        async def receive_packets() -> None:
            while True:
                await pair.b.receive_packet()
                packets.append(round(trio.current_time() - start, 9))

        nursery.start_soon(receive_packets)
        async with trio.open_nursery() as inner:
            inner.start_soon(reader)
            for i in range(50):
                await ours.send_all(bytes(100))
                await pair.a.send_packet(b"p", pair.b.address)
                await trio.sleep(0.003 * (i % 7))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    return streams, packets


async def test_same_seed_same_arrivals(mock_clock: trio.testing.MockClock) -> None:
    first = await arrival_times(11)
    assert len(first[0]) > 10 and 20 < len(first[1]) < 50
    assert await arrival_times(11) == first
    assert await arrival_times(12) != first


async def test_mesh_link_between_two_gossip_services(mock_clock: trio.testing.MockClock) -> None:
    """A real mesh link (routing.links) between two real GossipServices on the
    in-memory network: forwarded batches arrive in order and are acknowledged, stall
    behind a one-way cut and flow at the heal, and survive a reset (resent, not
    delivered twice)."""
    from mqtt import EMPTY_PROPERTIES
    from routing.batch import Unpacked, unpack_fwd
    from routing.links import InboundLinks, LinkItem, OutboundLink
    from session_store.model import Message

    net = MemoryNetwork(latency=0.01, jitter=0.2, seed=5)
    got: list[object] = []
    acked: list[Any] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(net.run)
        services = {
            node: GossipService(node_id=node, bind_host=node, bind_port=7946, seeds=seeds, mdns=False,
                                trace=NullTraceWriter(), preset="lan", transport=net.transport(node), seed=i)
            for i, (node, seeds) in enumerate([("n1", []), ("n2", [("n1", 7946)])])
        }
        formats: list[bool] = []

        def take(peer: str, items: list[object], read: Callable[[object], Unpacked], resent: bool) -> None:
            # Batched frames once the receiver's link_caps came back, `fwd` ones before.
            formats.append(read is not unpack_fwd)
            got.extend(int(read(item)[0].payload) for item in items)

        inbound = InboundLinks("meshd", services["n1"], "n1", handle_batch=take,
                               batch_taken=trio.lowlevel.checkpoint, handle_request=lambda peer, frame: None)
        services["n1"].register_stream_handler("link_hello", inbound.serve)
        for svc in services.values():
            await nursery.start(svc.run)
        await until(lambda: view(services["n2"]) == {"n1": "alive", "n2": "alive"}, 10)

        link = OutboundLink("n1", services["n2"], "n2", epoch="e1", cluster_name="meshd",
                            on_acked=lambda batch: acked.extend(int(i.message.payload) for i in batch))
        nursery.start_soon(link.run)

        def send(numbers: range) -> None:
            for n in numbers:
                msg = Message("t", str(n).encode(), 1, False, EMPTY_PROPERTIES, msg_id=n + 1, origin="n2")
                assert link.enqueue(LinkItem(msg))

        send(range(10))
        await until(lambda: len(acked) == 10, 5)
        assert got == list(range(10))

        net.cut("n2", "n1", one_way=True)
        send(range(10, 20))
        await trio.sleep(2)
        assert len(got) == 10 and len(acked) == 10  # held on the wire, not lost
        net.heal()
        await until(lambda: len(acked) == 20, 5)
        assert got == list(range(20))

        # a reset with batches unacknowledged: the link reconnects and resends them;
        # the receiver takes each batch once
        send(range(20, 30))
        await trio.sleep(0.011)  # the batch is on the wire, its ack is not back
        assert net.reset("n1", "n2") >= 1
        send(range(30, 40))
        await until(lambda: len(acked) == 40, 10)
        assert got == list(range(40))
        assert sorted(acked) == list(range(40))
        assert True in formats and False in formats  # both, see `take`
        nursery.cancel_scope.cancel()


def test_routing_opens_no_socket_of_its_own() -> None:
    """Links, route sync, forwarding, handoff and held replay reach the network only
    through the gossip transport's StreamTransport (so the in-memory network carries
    all of them): nothing in routing/ opens a connection or a socket."""
    import pathlib

    import routing

    forbidden = ("open_tcp_stream", "open_tcp_listeners", "open_ssl_over_tcp", "trio.socket", "import socket",
                 "socket.socket", "SocketStream")
    root = pathlib.Path(routing.__file__).parent
    sources = sorted(root.glob("*.py"))
    assert len(sources) > 5
    offenders = [(p.name, word) for p in sources for word in forbidden if word in p.read_text()]
    assert offenders == []


@pytest.mark.parametrize("seed", range(12))
async def test_random_cuts_heals_and_downs_never_lose_or_reorder_bytes(
    mock_clock: trio.testing.MockClock, seed: int,
) -> None:
    """Whatever the partitions do to an open stream, once healed each direction
    delivers exactly what was written, in order, then the FIN."""
    import random

    plan = random.Random(seed)
    net = MemoryNetwork(latency=0.02, jitter=0.9, bandwidth=50_000.0, stream_window=8192, seed=seed)
    async with trio.open_nursery() as nursery:
        pair = await Pair(net, nursery).start()
        ours, theirs = await pair.connect()
        writes = {name: [bytes([i % 251]) * random.Random(f"{seed}-{name}-{i}").randrange(1, 3000) for i in range(60)]
                  for name in ("ab", "ba")}
        got: dict[str, bytearray] = {"ab": bytearray(), "ba": bytearray()}

        async def writer(name: str, stream: trio.abc.Stream) -> None:
            pause = random.Random(f"{seed}-{name}")
            for chunk in writes[name]:
                await stream.send_all(chunk)
                await trio.sleep(pause.random() * 0.05)

        async def reader(name: str, stream: trio.abc.Stream) -> None:
            while len(got[name]) < sum(map(len, writes[name])):
                got[name] += await stream.receive_some()

        async def chaos() -> None:
            for _ in range(25):
                what = plan.randrange(4)
                if what == 0:
                    net.cut("a", "b", one_way=True)
                elif what == 1:
                    net.cut("b", "a", one_way=True)
                elif what == 2:
                    net.down(plan.choice("ab"))
                else:
                    net.heal()
                await trio.sleep(plan.random() * 0.3)
            net.heal()

        async with trio.open_nursery() as inner:
            inner.start_soon(chaos)
            inner.start_soon(writer, "ab", ours)
            inner.start_soon(writer, "ba", theirs)
            inner.start_soon(reader, "ab", theirs)
            inner.start_soon(reader, "ba", ours)
        assert {name: bytes(b) for name, b in got.items()} == {name: b"".join(w) for name, w in writes.items()}
        assert len(got["ab"]) > 30_000 and net.resets == 0
        net.cut("a", "b")
        await ours.aclose()  # the FIN waits behind the cut like data
        with trio.move_on_after(5):
            await theirs.receive_some()
            raise AssertionError("the FIN crossed a cut")
        net.heal()
        assert await theirs.receive_some() == b""
        nursery.cancel_scope.cancel()


class _ReceivedPerStep(trio.abc.Instrument):
    """How many datagrams a service's machine took in each uninterrupted task step."""

    def __init__(self, svc: GossipService) -> None:
        self.svc = svc
        self.before = 0
        self.steps: list[int] = []

    def _count(self) -> int:
        return self.svc.swim.stats.packets_received if self.svc.swim is not None else 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.before = self._count()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        taken = self._count() - self.before
        if taken:
            self.steps.append(taken)


async def test_datagrams_queued_while_the_loop_was_busy_are_taken_in_one_step(
        mock_clock: trio.testing.MockClock) -> None:
    """The UDP reader takes what has arrived (up to UDP_BURST) before it yields: each
    socket operation is a scheduling point, and a starved node's loop, one datagram per
    pass of every task, fell behind the route broadcasts and answered probes late."""
    from gossip.service import UDP_BURST

    net = MemoryNetwork(latency=0.001, jitter=0.0, seed=1)  # all due at once: they queue up
    async with trio.open_nursery() as nursery:
        await nursery.start(net.run)
        svc = GossipService(node_id="v1", bind_host="v1", bind_port=7946, seeds=[], mdns=False,
                            trace=NullTraceWriter(), preset="lan", transport=net.transport("v1"), seed=1)
        await nursery.start(svc.run)
        sender = net.transport("x")
        watch = _ReceivedPerStep(svc)
        trio.lowlevel.add_instrument(watch)
        try:
            for i in range(UDP_BURST + 10):
                await sender.send_packet(b"not a gossip packet %d" % i, ("v1", 7946))
            await until(lambda: sum(watch.steps) == UDP_BURST + 10, 5)
        finally:
            trio.lowlevel.remove_instrument(watch)
        assert watch.steps == [UDP_BURST, 10]  # one datagram per step before
        nursery.cancel_scope.cancel()

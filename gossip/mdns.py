"""mDNS discovery: announce ``_meshd._udp.local.`` and feed what we find into join.

zeroconf runs its own threads; every blocking zeroconf call here goes through
``trio.to_thread``, and browser callbacks come back into Trio only through
``TrioToken.run_sync_soon`` onto a bounded channel (dropped when full: another
announcement will come).  mDNS only finds seeds; membership is still SWIM's job.
Nodes of another cluster name, and ourselves, are ignored.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import socket
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import trio

from clock import Clock

from .config import GossipConfig

if TYPE_CHECKING:  # zeroconf itself is imported only when mDNS runs
    from zeroconf import ServiceInfo, ServiceStateChange, Zeroconf

    BrowserHandler = Callable[[Zeroconf, str, str, ServiceStateChange], None]

log = logging.getLogger("meshd.gossip.mdns")

SERVICE_TYPE = "_meshd._udp.local."
MDNS_PORT = 5353  # RFC 6762; `mdns_port` moves it (two clusters, or a test, on one host)
REJOIN_AFTER = 30.0  # seconds before the same address is joined again (at most one re-announce interval)


def instance_name(node_id: str) -> str:
    # DNS-SD instance labels may hold almost anything but dots split labels
    return f"{node_id.replace('.', '-')}.{SERVICE_TYPE}"


def txt_properties(node_id: str, port: int, cluster: str) -> dict[str, str]:
    return {"node_id": node_id, "port": str(port), "cluster": cluster}


def parse_txt(props: dict[bytes, bytes | None] | dict[str, str | None]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in props.items():
        key = k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
        val = v.decode("utf-8", "replace") if isinstance(v, bytes) else ("" if v is None else str(v))
        out[key] = val
    return out


class MdnsHost(Protocol):
    """What discovery needs of the gossip service it feeds."""

    node_id: str
    cluster_name: str
    config: GossipConfig
    address: tuple[str, int] | None

    def alive_members(self) -> list[str]: ...

    def join(self, addrs: Sequence[tuple[str, int]]) -> None: ...


class MdnsDiscovery:
    def __init__(self, service: MdnsHost, *, clock: Clock, rng: random.Random, port: int = MDNS_PORT) -> None:
        self.service = service
        self.port = port  # the mDNS port (not the gossip port it announces)
        self.clock = clock
        self.rng = rng
        self.discovered: dict[str, tuple[str, int]] = {}  # node id -> gossip address
        self._joined_at: dict[tuple[str, int], float] = {}
        self.ignored_other_cluster = 0

    async def run(self) -> None:
        svc = self.service
        assert svc.address is not None
        host, port = svc.address
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            log.info("mDNS off: gossip address %s is not an IP address", host)
            return
        if loopback:
            log.info("mDNS off: gossip advertises loopback address %s", host)
            return
        token = trio.lowlevel.current_trio_token()
        send, recv = trio.open_memory_channel[tuple[str, int, dict[str, str]]](64)

        def deliver(item: tuple[str, int, dict[str, str]]) -> None:
            try:
                send.send_nowait(item)
            except (trio.WouldBlock, trio.ClosedResourceError):
                pass  # a full queue or a stopped browser: the next announcement brings it again

        def on_change(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
            # runs on zeroconf's browser thread, where blocking lookups are allowed
            from zeroconf import ServiceStateChange

            if state_change not in (ServiceStateChange.Added, ServiceStateChange.Updated):
                return
            info = zeroconf.get_service_info(service_type, name, timeout=2000)
            if info is None:
                return
            props = parse_txt(info.properties or {})
            for addr in info.parsed_addresses():
                try:
                    token.run_sync_soon(deliver, (addr, int(info.port or 0), props))
                except trio.RunFinishedError:
                    return

        zc = await trio.to_thread.run_sync(self._start, host, port, on_change)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reannounce, zc)
                async with recv:
                    async for addr, gport, props in recv:
                        self._found(addr, gport, props)
        finally:
            send.close()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._stop, zc)

    def _start(self, host: str, port: int, on_change: BrowserHandler) -> Zeroconf:
        from zeroconf import ServiceBrowser, ServiceInfo

        svc = self.service
        # only the interface that carries our gossip address: mDNS stays on that LAN
        zc = open_zeroconf(host, self.port)
        info = ServiceInfo(
            SERVICE_TYPE,
            instance_name(svc.node_id),
            addresses=[socket.inet_aton(host)],
            port=port,
            properties=txt_properties(svc.node_id, port, svc.cluster_name),
            server=f"{svc.node_id.replace('.', '-')}.local.",
        )
        try:
            zc.register_service(info, allow_name_change=True)
            self._browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[on_change], port=self.port)
        except BaseException:
            zc.close()
            raise
        self._info = info
        self._port = port
        return zc

    async def _reannounce(self, zc: Zeroconf) -> None:
        """Announce again now and then with a new ``seq`` in the TXT record: browsers
        see an update and look at us again, so once a split heals the other side
        finds us by mDNS alone (no seed, no operator), even if it forgot us."""
        interval = self.service.config.mdns_reannounce_interval
        if interval <= 0:
            return
        seq = 0
        while True:
            await trio.sleep(interval * (0.75 + 0.5 * self.rng.random()))
            seq += 1
            await trio.to_thread.run_sync(self._update, zc, seq)

    def _update(self, zc: Zeroconf, seq: int) -> None:
        from zeroconf import ServiceInfo

        svc = self.service
        old = self._info
        props = dict(txt_properties(svc.node_id, self._port, svc.cluster_name), seq=str(seq))
        info = ServiceInfo(old.type, old.name, addresses=old.addresses, port=self._port, properties=props, server=old.server)
        try:
            zc.update_service(info)
            self._info = info
        except Exception as exc:  # zeroconf closing, an interface gone: try again later
            log.debug("mDNS re-announce failed: %s", exc)

    def _stop(self, zc: Zeroconf) -> None:
        try:
            zc.unregister_service(self._info)
        except Exception:  # closing anyway
            pass
        zc.close()

    def _found(self, addr: str, port: int, props: dict[str, str]) -> None:
        svc = self.service
        node_id = props.get("node_id", "")
        if props.get("cluster") != svc.cluster_name:
            self.ignored_other_cluster += 1
            return
        if not node_id or node_id == svc.node_id or port <= 0:
            return
        self.discovered[node_id] = (addr, port)
        if node_id in svc.alive_members():
            return  # re-announcements of members we reach anyway cost nothing
        now = self.clock.now()
        last = self._joined_at.get((addr, port))
        rejoin_after = min(REJOIN_AFTER, svc.config.mdns_reannounce_interval or REJOIN_AFTER)
        if last is not None and now - last < rejoin_after:
            return
        self._joined_at[(addr, port)] = now
        log.info("mDNS found %s at %s:%s", node_id, addr, port)
        svc.join([(addr, port)])


# zeroconf has no setting for the port: its sockets bind 5353 and its sends go to 5353.
# On another port, `open_zeroconf` builds the same sockets as zeroconf does for one
# interface, bound to that port, and `_MovedZeroconf` sends to that port whatever
# zeroconf would send to 5353. Nodes on different mDNS ports never hear each other.
_SOCKETS_LOCK = threading.Lock()  # zeroconf's socket factory is swapped while one is built


def open_zeroconf(host: str, port: int) -> Zeroconf:
    """Zeroconf on the interface of `host` (IPv4), mDNS on `port`."""
    from zeroconf import IPVersion, Zeroconf

    if port == MDNS_PORT:
        return Zeroconf(interfaces=[host], ip_version=IPVersion.V4Only)
    from zeroconf import _core
    from zeroconf._utils import net

    def sockets_on_port(*_args: Any, **_kwargs: Any) -> tuple[socket.socket, list[socket.socket]]:
        listen = net.new_socket(bind_addr=("",), port=port)
        respond = net.new_socket(bind_addr=(host,), port=port)
        if listen is None or respond is None:
            raise OSError(f"cannot bind mDNS port {port}")
        net.add_multicast_member(listen, host)
        respond.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(host))
        net.set_respond_socket_multicast_options(respond, IPVersion.V4Only)
        return listen, [respond]

    moved = port

    class _MovedZeroconf(Zeroconf):
        def async_send(self, out: Any, addr: str | None = None, port: int = MDNS_PORT, *args: Any, **kwargs: Any) -> None:
            super().async_send(out, addr, moved if port == MDNS_PORT else port, *args, **kwargs)

    with _SOCKETS_LOCK:
        original = _core.create_sockets
        _core.create_sockets = sockets_on_port
        try:
            return _MovedZeroconf(interfaces=[host], ip_version=IPVersion.V4Only)
        finally:
            _core.create_sockets = original

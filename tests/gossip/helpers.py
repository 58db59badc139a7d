"""A zero-latency in-memory link between Swim machines (h11's ConnectionPair idea)."""

from __future__ import annotations

import random
from typing import Any, Callable

from gossip import wire
from gossip.config import GossipConfig
from gossip.swim import Swim, frame_body

Addr = tuple[str, int]


def addr_of(name: str) -> Addr:
    return (name, 7946)


def packet(sender: str, *msgs: list[Any]) -> bytes:
    return wire.PacketEncoder(sender).packet([wire.encode_part(m) for m in msgs])


class Cluster:
    """Machines that deliver to each other instantly; ``drop(src, dst, msg_types)`` filters."""

    def __init__(self, names: list[str], config: GossipConfig, *, seed: int = 0, converged: bool = True) -> None:
        self.config = config
        self.now = 0.0
        self.nodes: dict[str, Swim] = {}
        self.down: set[str] = set()
        self.drop: Callable[[str, str, list[str]], bool] = lambda src, dst, types: False
        self.delivered: list[tuple[str, str, list[str]]] = []
        self.events: dict[str, list[Any]] = {n: [] for n in names}
        for i, name in enumerate(names):
            self.add(name, seed=seed * 1000 + i)
        if converged:
            everyone = [(n, addr_of(n)) for n in names]
            for sw in self.nodes.values():
                sw.bootstrap(everyone, 0.0)

    def add(self, name: str, *, seed: int = 0, incarnation: int = 0) -> Swim:
        sw = Swim(name, addr_of(name), now=self.now, rng=random.Random(seed), config=self.config, incarnation=incarnation)
        self.nodes[name] = sw
        self.events.setdefault(name, [])
        self.down.discard(name)
        return sw

    def pump(self) -> None:
        busy = True
        while busy:
            busy = False
            for name, sw in list(self.nodes.items()):
                if name in self.down:
                    sw.datagrams_to_send(self.now)
                    sw.streams_to_open()
                    continue
                self.events[name].extend(sw.events())
                for addr, data in sw.datagrams_to_send(self.now):
                    busy = True
                    dst = addr[0]
                    _, msgs = wire.decode_packet(data)
                    types = [m[0] for m in msgs]
                    if dst in self.down or dst not in self.nodes or self.drop(name, dst, types):
                        continue
                    self.delivered.append((name, dst, types))
                    self.nodes[dst].receive(data, addr_of(name), self.now)
                for addr, body in sw.streams_to_open():
                    busy = True
                    dst = addr[0]
                    if dst in self.down or dst not in self.nodes or self.drop(name, dst, ["stream"]) or self.drop(dst, name, ["stream"]):
                        continue
                    reply = self.nodes[dst].handle_stream(frame_body(body), self.now)
                    if reply is not None:
                        sw.receive_stream_reply(reply, self.now)
                self.events[name].extend(sw.events())

    def run_until(self, t: float) -> None:
        self.pump()
        while True:
            due = [s.next_timer() for n, s in self.nodes.items() if n not in self.down]
            due = [d for d in due if d is not None and d <= t]
            if not due:
                break
            self.now = max(self.now, min(due))
            for name, sw in self.nodes.items():
                if name not in self.down:
                    sw.handle_timer(self.now)
            self.pump()
        self.now = t

    def state(self, observer: str, member: str) -> str | None:
        m = self.nodes[observer].members.get(member)
        return None if m is None else m.state

#!/usr/bin/env python3
"""Network lab: Linux network namespaces on a private bridge, for cluster tests.

Topology: one switch namespace ``<prefix>-sw`` holding the bridge(s), and one
namespace per host ``<prefix>-h<i>`` with a veth ``eth0`` whose peer is plugged
into a bridge of the switch namespace.  Nothing is created in the caller's own
namespace, so test traffic (mDNS multicast included) never leaves the lab.
``split`` moves a host's cable to another bridge and ``heal`` moves it back:
that is how netsplit tests cut a cluster in two.

    with NetLab(hosts=3) as lab:
        proc = lab.popen(0, ["python", "-m", "gossip", ...])

Needs CAP_NET_ADMIN (root); ``has_net_admin()`` tells tests whether to skip.
Run ``scripts/netlab.py cleanup PREFIX`` to remove a lab left behind by a crash.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Sequence

# a private test range (RFC 1918), used only inside the lab's namespaces
DEFAULT_SUBNET = "10.213.0.0/24"


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def has_net_admin() -> bool:
    """True when this process may create network namespaces (CAP_NET_ADMIN)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    if not int(line.split()[1], 16) & (1 << 12):  # CAP_NET_ADMIN
                        return False
                    break
    except OSError:
        return False
    probe = f"nlprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    if r.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True


@dataclass
class Host:
    index: int
    ns: str
    address: str  # inside the lab subnet
    peer: str  # veth end in the switch namespace
    bridge: str  # which bridge the cable is plugged into now


class NetLab:
    def __init__(self, hosts: int = 3, *, prefix: str | None = None, subnet: str = DEFAULT_SUBNET) -> None:
        if hosts < 1:
            raise ValueError("a lab needs at least one host")
        self.prefix = prefix or f"ml{os.getpid() % 100000}"
        self.subnet = ipaddress.ip_network(subnet)
        if not self.subnet.is_private:
            raise ValueError("the lab subnet must be a private range")
        self.switch = f"{self.prefix}-sw"
        self.bridges: list[str] = []
        self.n_hosts = hosts
        self.hosts: list[Host] = []

    # ---------------------------------------------------------------- lifecycle

    def create(self) -> "NetLab":
        try:
            subprocess.run(["ip", "netns", "add", self.switch], check=True, capture_output=True)
            _ip("link", "set", "lo", "up", ns=self.switch)
            self._add_bridge("br0")
            addrs = list(self.subnet.hosts())
            for i in range(self.n_hosts):
                ns = f"{self.prefix}-h{i}"
                peer = f"h{i}p"
                subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
                _ip("link", "set", "lo", "up", ns=ns)
                # create the pair inside the switch namespace, then move one end out
                _ip("link", "add", "eth0tmp", "type", "veth", "peer", "name", peer, ns=self.switch)
                _ip("link", "set", "eth0tmp", "netns", ns, ns=self.switch)
                _ip("link", "set", "eth0tmp", "name", "eth0", ns=ns)
                addr = str(addrs[i])
                _ip("addr", "add", f"{addr}/{self.subnet.prefixlen}", "dev", "eth0", ns=ns)
                _ip("link", "set", "eth0", "up", ns=ns)
                _ip("route", "add", "224.0.0.0/4", "dev", "eth0", ns=ns)
                _ip("link", "set", peer, "master", "br0", ns=self.switch)
                _ip("link", "set", peer, "up", ns=self.switch)
                self.hosts.append(Host(i, ns, addr, peer, "br0"))
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_bridge(self, name: str) -> None:
        _ip("link", "add", name, "type", "bridge", ns=self.switch)
        # forward multicast without waiting for IGMP snooping to learn anything
        subprocess.run(
            ["ip", "netns", "exec", self.switch, "sh", "-c", f"echo 0 > /sys/class/net/{name}/bridge/multicast_snooping"],
            capture_output=True,
        )
        _ip("link", "set", name, "up", ns=self.switch)
        if name not in self.bridges:
            self.bridges.append(name)

    def destroy(self) -> None:
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", h.ns], capture_output=True)
        for i in range(self.n_hosts):
            subprocess.run(["ip", "netns", "del", f"{self.prefix}-h{i}"], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)
        self.hosts = []

    def __enter__(self) -> "NetLab":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # ---------------------------------------------------------------- use

    def popen(self, host: int, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start a process inside host ``host``'s namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.hosts[host].ns, *argv], **kw)

    def run(self, host: int, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(["ip", "netns", "exec", self.hosts[host].ns, *argv], **kw)

    def split(self, hosts: Sequence[int], bridge: str = "br1") -> None:
        """Move the given hosts' cables to another bridge: a partition."""
        if bridge not in self.bridges:
            self._add_bridge(bridge)
        for i in hosts:
            h = self.hosts[i]
            _ip("link", "set", h.peer, "master", bridge, ns=self.switch)
            h.bridge = bridge

    def heal(self) -> None:
        """Plug every cable back into the first bridge."""
        for h in self.hosts:
            if h.bridge != "br0":
                _ip("link", "set", h.peer, "master", "br0", ns=self.switch)
                h.bridge = "br0"


def cleanup(prefix: str) -> None:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in names:
        if name.startswith(prefix + "-"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "cleanup":
        cleanup(sys.argv[2])
    else:
        print(__doc__)

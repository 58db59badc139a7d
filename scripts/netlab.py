#!/usr/bin/env python3
"""Network lab: Linux network namespaces on a private bridge, for cluster tests.

Topology: one switch namespace ``<prefix>-sw`` holding the bridge(s), and one
namespace per host ``<prefix>-h<i>`` with a veth ``eth0`` whose peer is plugged
into a bridge of the switch namespace.  Nothing is created in the caller's own
namespace, so test traffic (mDNS multicast included) never leaves the lab.
``split`` moves hosts' cables to another bridge and ``heal`` moves them back:
that is how netsplit tests cut a cluster in two (hosts on different bridges share
no link at all; a heal plugs everyone back into ``br0``).

    with NetLab(hosts=3) as lab:
        proc = lab.popen(0, ["python", "-m", "gossip", ...])
        lab.split([2])                          # 0,1 | 2
        lab.in_host(0, some_function, args)     # runs in a thread inside h0's namespace
        lab.heal()

From the command line (the lab outlives the command; ``attach`` finds it again):

    scripts/netlab.py create 5 --prefix lab1    # lab1-sw, lab1-h0 .. lab1-h4
    ip netns exec lab1-h0 meshd ...             # start whatever you like
    scripts/netlab.py split lab1 3 4            # h3, h4 onto br1: 0,1,2 | 3,4
    scripts/netlab.py status lab1
    scripts/netlab.py heal lab1
    scripts/netlab.py cleanup lab1

Needs CAP_NET_ADMIN (root); ``has_net_admin()`` tells tests whether to skip.
Run ``scripts/netlab.py cleanup PREFIX`` to remove a lab left behind by a crash.
"""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000

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

    def in_host(self, host: int, fn: Callable[..., T], *args: Any, timeout: float = 30.0) -> T:
        """Run ``fn(*args)`` in a thread that has entered host ``host``'s network
        namespace (sockets it opens live there): talk to a lab host's loopback-only
        HTTP API from the test process without spawning anything."""
        return in_netns(self.hosts[host].ns, fn, *args, timeout=timeout)

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

    def sides(self) -> dict[str, list[int]]:
        """Which hosts are plugged into which bridge now."""
        out: dict[str, list[int]] = {}
        for h in self.hosts:
            out.setdefault(h.bridge, []).append(h.index)
        return out

    @classmethod
    def attach(cls, prefix: str) -> "NetLab":
        """Rebuild the handle of a lab created earlier (e.g. by ``netlab.py create``)
        from what the kernel holds: its namespaces, addresses and bridges."""
        names = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        hosts = sorted(
            (int(n[len(prefix) + 2:]) for n in names if n.startswith(prefix + "-h") and n[len(prefix) + 2:].isdigit())
        )
        if f"{prefix}-sw" not in names or not hosts:
            raise LookupError(f"no lab named {prefix!r}")
        lab = cls(len(hosts), prefix=prefix)
        links = _ip("-o", "link", "show", ns=lab.switch).stdout
        lab.bridges = sorted({w.split(":")[0] for w in links.split() if w.startswith("br") and w.endswith(":")})
        masters: dict[str, str] = {}
        for line in links.splitlines():
            parts = line.split()
            name = parts[1].rstrip(":").split("@")[0]
            if "master" in parts:
                masters[name] = parts[parts.index("master") + 1]
        for i in hosts:
            ns = f"{prefix}-h{i}"
            addr = _ip("-o", "-4", "addr", "show", "dev", "eth0", ns=ns).stdout.split()[3].split("/")[0]
            peer = f"h{i}p"
            lab.hosts.append(Host(i, ns, addr, peer, masters.get(peer, "br0")))
        return lab


def in_netns(ns: str, fn: Callable[..., T], *args: Any, timeout: float = 30.0) -> T:
    """Run ``fn(*args)`` on a helper thread inside network namespace ``ns``
    (setns(2) moves only the calling thread; the rest of the process stays put)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns} failed")
            finally:
                os.close(fd)
            result["value"] = fn(*args)
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    t = threading.Thread(target=target, name=f"netns-{ns}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"call in {ns} did not finish in {timeout} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def cleanup(prefix: str) -> None:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in names:
        if name.startswith(prefix + "-"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="netlab.py", description="Network lab: namespaces on a bridge; split and heal.")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create", help="create a lab of N hosts (it stays until cleanup)")
    c.add_argument("hosts", type=int)
    c.add_argument("--prefix", default=None)
    c.add_argument("--subnet", default=DEFAULT_SUBNET)
    s = sub.add_parser("split", help="move the given hosts onto another bridge")
    s.add_argument("prefix")
    s.add_argument("host", type=int, nargs="+")
    s.add_argument("--bridge", default="br1")
    h = sub.add_parser("heal", help="plug every host back into br0")
    h.add_argument("prefix")
    st = sub.add_parser("status", help="hosts, addresses and bridges")
    st.add_argument("prefix")
    cl = sub.add_parser("cleanup", help="remove every namespace of the lab")
    cl.add_argument("prefix")
    args = p.parse_args(argv)
    if args.cmd == "create":
        lab = NetLab(args.hosts, prefix=args.prefix, subnet=args.subnet).create()
        print(lab.prefix)
        return 0
    if args.cmd == "cleanup":
        cleanup(args.prefix)
        return 0
    try:
        lab = NetLab.attach(args.prefix)
    except LookupError as exc:
        print(f"netlab.py: {exc}", file=sys.stderr)
        return 1
    if args.cmd == "split":
        lab.split(args.host, args.bridge)
    elif args.cmd == "heal":
        lab.heal()
    for h in lab.hosts:
        print(f"h{h.index}  {h.ns:<16} {h.address:<15} {h.bridge}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A gossip-only node for labs and debugging: ``python -m gossip --node-id n1 ...``.

Runs one GossipService (no broker) and keeps its member list in a JSON file, so
namespace tests can watch membership without the full node.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

import trio

from clock import TrioClock

from .config import preset
from .service import GossipService
from .trace import NullTraceWriter, TraceWriter


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError("expected HOST:PORT")
    return host.strip("[]"), int(port)


async def _main(args: argparse.Namespace) -> None:
    trace = TraceWriter(args.trace_dir, args.node_id) if args.trace_dir else NullTraceWriter()
    config = preset(args.preset)
    if args.reconnect_dead_for is not None:
        # 0: never retry lost members' addresses (a heal then needs mDNS or a seed)
        config = config.with_(reconnect_dead_for=args.reconnect_dead_for)
    svc = GossipService(
        node_id=args.node_id,
        bind_host=args.bind[0],
        bind_port=args.bind[1],
        seeds=args.seed,
        cluster_name=args.cluster,
        cluster_key=args.cluster_key,
        mdns=not args.no_mdns,
        trace=trace,
        config=config,
        advertise_host=args.advertise,
        clock=TrioClock(),
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(svc.run)
        assert svc.address is not None  # bound once run() reported its port
        print(f"gossip {args.node_id} on {svc.address[0]}:{port}", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            nursery.start_soon(_dump, svc, args.members_file)
            async for _ in signals:
                await svc.leave()
                nursery.cancel_scope.cancel()
                break
    trace.close()


async def _dump(svc: GossipService, path: str | None) -> None:
    while True:
        if path:
            tmp = f"{path}.tmp"
            Path(tmp).write_text(json.dumps({"members": svc.members(), "stats": svc.stats}))
            os.replace(tmp, path)
        await trio.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.reconnect_dead_for is not None and args.reconnect_dead_for < 0:
        p.error("--reconnect-dead-for must be 0 or more")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    trio.run(_main, args)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gossip", description=__doc__)
    p.add_argument("--node-id", required=True)
    p.add_argument("--bind", type=_hostport, default=("0.0.0.0", 7946))
    p.add_argument("--advertise", default=None)
    p.add_argument("--seed", type=_hostport, action="append", default=[])
    p.add_argument("--cluster", default="meshd")
    # the environment variable the node reads too (mesh.config), resolved here: the
    # service itself reads no environment
    p.add_argument("--cluster-key", default=os.environ.get("MESHD_CLUSTER_KEY") or None,
                   help="shared secret (default: $MESHD_CLUSTER_KEY)")
    p.add_argument("--no-mdns", action="store_true")
    p.add_argument("--preset", default="lan")
    p.add_argument("--members-file", default=None)
    p.add_argument("--trace-dir", default=None)
    p.add_argument("--reconnect-dead-for", type=float, default=None,
                   help="seconds to keep retrying the addresses of lost members (0: never)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return p


if __name__ == "__main__":
    sys.exit(main())

"""`meshd run`: one node in this process until SIGINT/SIGTERM (SIGHUP re-reads the
password file and the ACL)."""

from __future__ import annotations

import gc
import logging
import signal

import trio

from mesh.compose import build_node
from mesh.config import ConfigError, Settings

log = logging.getLogger("meshd.node")

# The cyclic collector's young-generation threshold in a node's process (CPython's
# default: 700).  A forwarded message and its link item live until the peer
# acknowledges the batch that carried them (a round trip on the mesh link), so at tens
# of thousands of forwards a second nearly every young collection found a few thousand
# of them alive and moved them on, and the older collections walked them again: 8 to
# 24 % of the forwarding node's CPU (scripts/bench/RESULTS.md, "cross-node forward
# path").  The count is allocations minus frees, so steady traffic does not reach it;
# objects are still freed by their reference counts at once, only cycles wait longer.
YOUNG_GC_THRESHOLD = 50_000


async def _run_until_signal(settings: Settings) -> None:
    node = build_node(settings)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)

            async def watch_signals() -> None:
                async for signum in signals:
                    log.info("received %s", signal.Signals(signum).name)
                    if signum == signal.SIGHUP:
                        # Re-read the password file and the ACL; keep running.
                        await trio.to_thread.run_sync(node.security.reload)
                        continue
                    node.request_shutdown()
                    return

            nursery.start_soon(watch_signals)
            await node.shutdown_requested()


def run_node(settings: Settings) -> int:
    """Run a node until SIGINT/SIGTERM; 0 on a clean stop. Raises ConfigError for
    settings that cannot work (e.g. a port in use)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)
    try:
        trio.run(_run_until_signal, settings)
    except BaseExceptionGroup as group:
        config_errors = [e for e in _flatten(group) if isinstance(e, ConfigError)]
        if config_errors:
            raise config_errors[0] from None
        raise
    return 0


def _flatten(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for inner in exc.exceptions:
            out.extend(_flatten(inner))
        return out
    return [exc]

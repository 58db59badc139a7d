"""The Trio driver of an HTTP target (an `http` bridge, or a rule's webhook action): the
cache queue's durable records POSTed one at a time, in order, each record's payload
being the JSON body.

2xx: sent. 4xx other than 408 and 429: the target will never take it: dropped,
counted, its answer kept as the last error (a poisoned message must not block the
queue). Anything else (5xx, no answer within `timeout_s`, a refused or broken
connection): the record stays at the head and is tried again after the backoff.
"""

from __future__ import annotations

import logging
import random
import ssl

import trio

from bridges.backoff import Backoff
from bridges.committer import Committer
from bridges.config import BridgeConfig
from bridges.connect import describe
from bridges.http_client import HttpConnection, HttpError
from bridges.queue import CacheQueue
from bridges.status import BridgeStatus
from clock import Clock

log = logging.getLogger("meshd.bridges")


def _permanent(status: int) -> bool:
    return 400 <= status < 500 and status not in (408, 429)


class HttpBridge:
    def __init__(self, config: BridgeConfig, *, queue: CacheQueue, committer: Committer, clock: Clock,
                 rng: random.Random, tls: ssl.SSLContext | None) -> None:
        self.config = config
        self.queue = queue
        self.committer = committer
        self.clock = clock
        self.status = BridgeStatus()
        self.backoff = Backoff(config.backoff_min_s, config.backoff_max_s, rng)
        self._http = HttpConnection(config, tls)
        self._wakeup = trio.Event()

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            with trio.CancelScope(shield=True):
                await self._http.close()

    async def _run(self) -> None:
        cfg = self.config
        queue = self.queue
        self.status.state = "idle"
        while True:
            wakeup = self._wakeup = trio.Event()
            records = queue.unsent(0, 1, self.committer.durable_epoch)
            if not records:
                await wakeup.wait()
                continue
            record = records[0]
            if queue.cold_keys(records):
                values = await trio.to_thread.run_sync(self.committer.store.read, queue.cold_keys(records))
                queue.warm(records, values)
            if record.payload is None:
                continue  # dropped by the bound meanwhile
            error: str | None = None
            status = 0
            try:
                with trio.fail_after(cfg.timeout_s):
                    status, answer = await self._http.post(record.payload, cfg.headers)
            except trio.TooSlowError:
                await self._http.close()
                error = f"no answer within {cfg.timeout_s:g} s"
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, HttpError, ssl.SSLError) as exc:
                error = describe(exc)
            if error is None and 200 <= status < 300:
                queue.ack(record.seq)
                self.backoff.reset()
                if self.status.state != "connected":
                    self.status.state = "connected"
                    self.status.connected_since = self.clock.wall()
                    self.status.connects_total += 1
                self.status.retry_in_s = None
                continue
            if error is None:
                text = answer.decode("utf-8", "replace").strip()[:200]
                error = f"HTTP {status}" + (f": {text}" if text else "")
                if _permanent(status):
                    queue.refuse(record.seq)
                    self.status.last_error = f"{error} (message dropped)"
                    self.status.last_error_at = self.clock.wall()
                    self.status.errors_total += 1
                    continue
            self.status.failed(error, self.clock.wall())
            delay = self.backoff.next_delay()
            self.status.retry_in_s = round(delay, 3)
            log.debug("bridge %s: %s; retrying in %.2f s", cfg.id, error, delay)
            await trio.sleep(delay)

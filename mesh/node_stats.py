"""What one node carries and how fast it moves, for `GET /api/v1/node` (the
dashboard's Node page): totals read from the broker's and the store's plain counters,
and `RateHistory`, a sample of those counters every `SAMPLE_INTERVAL` seconds over the
last `HISTORY_SECONDS`, so the page draws the last ten minutes as soon as it opens.

Nothing here is on the hot path: the totals are summed when the API is asked, the
samples are taken by one task of the node."""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol

import trio

from clock import Clock
from mesh.broker import BrokerStats
from session_store.store import StoreStats

SAMPLE_INTERVAL = 5.0  # seconds between two samples: 120 points for the chart
HISTORY_SECONDS = 600.0  # the chart's width: the last ten minutes


class SessionCounts(Protocol):
    @property
    def inflight_count(self) -> int: ...
    @property
    def queued(self) -> int: ...


class StatsBroker(Protocol):
    @property
    def stats(self) -> BrokerStats: ...
    @property
    def sessions(self) -> Mapping[str, SessionCounts]: ...
    def client_count(self) -> int: ...
    def subscription_count(self) -> int: ...


class StatsStore(Protocol):
    @property
    def stats(self) -> StoreStats: ...


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # wall clock, epoch seconds (the page labels its axis with it)
    messages_in: int
    messages_out: int
    store_records: int  # records the committer wrote, every kind
    store_commits: int


def take_sample(broker: StatsBroker, store: StatsStore, wall: float) -> Sample:
    b, s = broker.stats, store.stats
    return Sample(wall, sum(b.messages_in), sum(b.messages_out),
                  s.delivery_puts + s.delivery_deletes + s.other_records, s.commits)


def rates(samples: Iterable[Sample]) -> list[dict[str, float]]:
    """Per-second rates between consecutive samples, stamped with the later one's time."""
    out: list[dict[str, float]] = []
    previous: Sample | None = None
    for sample in samples:
        if previous is not None and sample.t > previous.t:
            span = sample.t - previous.t
            out.append({
                "t": round(sample.t, 3),
                "messages_in_per_s": round((sample.messages_in - previous.messages_in) / span, 3),
                "messages_out_per_s": round((sample.messages_out - previous.messages_out) / span, 3),
                "store_records_per_s": round((sample.store_records - previous.store_records) / span, 3),
                "store_commits_per_s": round((sample.store_commits - previous.store_commits) / span, 3),
            })
        previous = sample
    return out


class RateHistory:
    """The node's counters sampled every `interval` seconds, the last `span` seconds kept."""

    def __init__(self, *, broker: StatsBroker, store: StatsStore, clock: Clock,
                 interval: float = SAMPLE_INTERVAL, span: float = HISTORY_SECONDS) -> None:
        self.broker = broker
        self.store = store
        self.clock = clock
        self.interval = interval
        # one more sample than intervals: 120 rates need 121 samples
        self.samples: deque[Sample] = deque(maxlen=int(span / interval) + 1)

    def sample(self) -> None:
        self.samples.append(take_sample(self.broker, self.store, self.clock.wall()))

    def rates(self, *, live: bool = False) -> list[dict[str, float]]:
        """The rates between samples; `live` adds one from the last sample to now, so a
        page sees traffic at once, not at the next sample."""
        if not live:
            return rates(self.samples)
        now = take_sample(self.broker, self.store, self.clock.wall())
        return rates([*self.samples, now])

    async def run(self) -> None:
        while True:
            self.sample()
            await trio.sleep(self.interval)


def node_totals(broker: StatsBroker, store: StatsStore) -> dict[str, int]:
    """Clients, sessions, subscriptions, inflight and queued messages, and the counters
    since start (summing inflight and queued walks every session: the API's job, at
    the page's pace, never the broker's)."""
    sessions = broker.sessions.values()
    b, s = broker.stats, store.stats
    return {
        "connected_clients": broker.client_count(),
        "sessions": len(broker.sessions),
        "subscriptions": broker.subscription_count(),
        "inflight": sum(session.inflight_count for session in sessions),
        "queued": sum(session.queued for session in sessions),
        "messages_in_total": sum(b.messages_in),
        "messages_out_total": sum(b.messages_out),
        "bytes_in_total": b.bytes_in,
        "bytes_out_total": b.bytes_out,
        "store_commits_total": s.commits,
        "store_records_written_total": s.delivery_puts + s.delivery_deletes + s.other_records,
    }


def directory_size(path: str) -> int | None:
    """Bytes of the files under `path` (the RocksDB directory), None if there is none
    (a node on the in-memory store). Blocking: run it in a worker thread."""
    if not os.path.isdir(path):
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass  # a file RocksDB removed while we walked (compaction)
    return total


class NodeStats:
    """`GET /api/v1/node`: the totals, the store's size on disk and the rate history."""

    def __init__(self, *, broker: StatsBroker, store: StatsStore, history: RateHistory, store_dir: str) -> None:
        self.broker = broker
        self.store = store
        self.history = history
        self.store_dir = store_dir

    async def snapshot(self) -> dict[str, object]:
        size = await trio.to_thread.run_sync(directory_size, self.store_dir)
        return {
            **node_totals(self.broker, self.store),
            "store_size_bytes": size,
            "sample_interval_s": self.history.interval,
            "rates": self.history.rates(live=True),
        }

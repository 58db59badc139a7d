"""One task that sends what plain-TCP connections wrote, once per scheduler tick.

A connection's writes collect in its outbox (`mesh.connection`). Before this, the first
write into an empty outbox started a writer task for that connection: one Trio task
spawned and torn down per burst, per connection (a subscriber in a fan-in, every
publisher for its acks), which cost more than the send itself. Now such a connection
asks the flusher instead (`request`): the flusher task, woken once for all of them,
hands each its turn (`Flushable.flush_queued`), which sends the whole outbox with one
non-blocking write. Only a socket that does not take everything (the client reads
slower than it is sent to) gets a writer task of its own, which waits for it.

Requests are served in order, each connection at most once per round: it asks again
only after its turn.

A reader handling what it read (`hold` ... `release`, with no await between) sends what
that wrote as soon as it is done, itself, without waking the flusher task: its
publisher's acks and the deliveries to other clients leave at the end of the read, as
Mosquitto sends at the end of handling a read, not one scheduler tick later.
"""

from __future__ import annotations

from typing import Protocol

import trio


class Flushable(Protocol):
    def flush_queued(self) -> None: ...


class Flusher:
    def __init__(self) -> None:
        self._queued: list[Flushable] = []
        self._task: trio.lowlevel.Task | None = None  # the run() task while it waits
        self._held = 0  # readers handling input now (nested: one reader's input may wake none)
        self.stopped = False

    def request(self, conn: Flushable) -> bool:
        """Give `conn` its turn in the next round; False once stopped (the caller
        then sends by itself)."""
        if self.stopped:
            return False
        self._queued.append(conn)
        task = self._task
        if task is not None and not self._held:
            self._task = None
            trio.lowlevel.reschedule(task)
        return True

    def hold(self) -> None:
        """A reader starts handling its input: what it writes waits for `release`."""
        self._held += 1

    def release(self) -> None:
        """The reader is done: send what was asked meanwhile, now."""
        self._held -= 1
        if not self._held and self._queued:
            self._round()

    def _round(self) -> None:
        queued, self._queued = self._queued, []
        for conn in queued:
            conn.flush_queued()
        if self._queued and self._task is not None:
            # Turns taken asked for more (a failed send closes its connection, which
            # writes): the task takes them, after others ran.
            task, self._task = self._task, None
            trio.lowlevel.reschedule(task)

    async def run(self) -> None:
        try:
            while True:
                if not self._queued:
                    self._task = trio.lowlevel.current_task()
                    await trio.lowlevel.wait_task_rescheduled(self._abort)
                else:
                    # Turns taken may have queued more (a failed send closes its
                    # connection, which writes): let others run before the next round.
                    await trio.lowlevel.checkpoint()
                self._round()
        finally:
            self.stopped = True
            self._task = None
            queued, self._queued = self._queued, []
            for conn in queued:
                conn.flush_queued()  # the last round: they fall back to writer tasks for the rest

    def _abort(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED

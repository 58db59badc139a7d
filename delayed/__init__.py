"""Delayed publish: `$delayed/<seconds>/<topic>`, kept in RocksDB until its time.

- `topic.py`: the `$delayed/...` topic form, parsed and checked (pure).
- `records.py`: one pending message (`DelayedEntry`), its key (due time + id, so a
  range scan of the store gives the next due) and its stored value.
- `schedule.py`: the sans-I/O scheduler core: a window of the index loaded in memory,
  `now` in, due entries out; it says when to load the next window.
- `service.py`: the node's delayed messages (intake, inspect, list, cancel) over the
  session store's `delayed` column family, and the Trio driver that fires them
  through the broker's normal publish path.

Sits between `mesh` (which receives the PUBLISH and owns the broker) and `netsplit`;
it imports only `session_store`, `mqtt`, `clock` and `oplog` of ours.
"""

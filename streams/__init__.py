"""Durable streams: messages on configured topic filters kept in RocksDB and replayed
from a position, merged from every node (README "Streams").

Pure cores: `position` (the cluster-wide order as a string), `spec` (which streams
exist and what they keep), `request` (what a SUBSCRIBE asks to replay), `merge` (the
per-node pages merged in position order, then the switch to live), `retention` (what
compaction cuts). `store` keeps one node's part in the session store's `streams`
family; `service` and `cursor` are the Trio drivers (appends, the cluster query that
serves a node's part, one cursor per replay subscription).
"""

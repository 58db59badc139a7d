"""Partition episodes: each ``partition_detected`` paired with the next ``partition_healed``
written by the same node.

``detection_s`` counts from the onset: the node's own first ``member_suspect`` (one it
originated) after its previous partition record, up to the detection; when the
detection's ``subject`` lists members (comma or space separated) only suspicions of
those count. Null when the node suspected nobody first. ``heal_s`` runs from detection to heal; null while unhealed.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

US = 1_000_000.0


def partition_episodes(traces: DataFrame) -> DataFrame:
    """Per detection: ``node``, ``subject``, ``detected_ts_us``, ``healed_ts_us``,
    ``detection_s``, ``heal_s``."""
    marks = traces.filter(F.col("kind").isin("partition_detected", "partition_healed"))
    w = Window.partitionBy("node").orderBy("ts_us", "kind")
    seq = marks.select(
        "node",
        "subject",
        "kind",
        "ts_us",
        F.lead("kind").over(w).alias("next_kind"),
        F.lead("ts_us").over(w).alias("next_ts"),
        F.lag("ts_us").over(w).alias("prev_ts"),
    )
    detected = seq.filter(F.col("kind") == "partition_detected").select(
        "node",
        "subject",
        F.col("ts_us").alias("detected_ts_us"),
        F.when(F.col("next_kind") == "partition_healed", F.col("next_ts")).alias("healed_ts_us"),
        F.coalesce("prev_ts", F.lit(-(2**62))).alias("_since"),
    )
    suspects = traces.filter(
        (F.col("kind") == "member_suspect") & (F.col("origin") == F.col("node"))
    ).select(F.col("node").alias("_s_node"), F.col("ts_us").alias("_s_ts"), F.col("subject").alias("_s_subject"))
    members = F.filter(F.split(F.coalesce("subject", F.lit("")), r"[,\s]+"), lambda m: m != "")
    onset = (
        detected.withColumn("_members", members)
        .join(
            suspects,
            (F.col("node") == F.col("_s_node"))
            & (F.col("_s_ts") > F.col("_since"))
            & (F.col("_s_ts") <= F.col("detected_ts_us"))
            & ((F.size("_members") == 0) | F.array_contains("_members", F.col("_s_subject"))),
        )
        .groupBy("node", "detected_ts_us")
        .agg(F.min("_s_ts").alias("onset_ts_us"))
    )
    return detected.join(onset, ["node", "detected_ts_us"], "left").select(
        "node",
        "subject",
        "detected_ts_us",
        "healed_ts_us",
        ((F.col("detected_ts_us") - F.col("onset_ts_us")) / US).alias("detection_s"),
        ((F.col("healed_ts_us") - F.col("detected_ts_us")) / US).alias("heal_s"),
    )

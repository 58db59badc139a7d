"""Partition episodes: each ``partition_detected`` paired with the ``partition_healed``
of the same partition (same ``node`` and ``subject``, the partition id).  A partition
the detector revised (members that joined it late: a second record with the same id
and ``revision`` 1, 2, ...) is one episode, described by its last record.

Records from ``netsplit`` carry the measurements themselves: ``took_us`` on a
detection is onset to detection (onset: the first member of the group stopped
answering), on a heal first contact to one view; ``peers`` names the other side,
``majority`` says which side the observer is on, ``suspicion_us`` the minimum
suspicion timeout for the view's size.  The issue's target, each side holds the
other dead within the suspicion timeout + 3 s, is checked per peer: from the node's
first ``member_suspect`` of it to its ``member_dead`` (how long it takes a side to
first suspect every member of the other, the probing coverage, is in
``detection_s``, which runs from the onset).

Records without ``took_us`` (older writers) fall back to what the traces show:
detection from the node's own first ``member_suspect`` (one it originated) after
its previous partition record, of a member in ``peers`` (or in ``subject`` read as
a member list), up to the detection; heal from detection to heal.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

US = 1_000_000.0
BOUND_SLACK_S = 3.0  # the target: each side holds the other dead within suspicion timeout + 3 s


def partition_episodes(traces: DataFrame) -> DataFrame:
    """Per detection: ``node``, ``subject``, ``peers``, ``majority``,
    ``detected_ts_us``, ``healed_ts_us``, ``detection_s``, ``suspect_to_dead_s``
    (the slowest peer: from the node's first ``member_suspect`` of it to its
    ``member_dead``, i.e. the suspicion timeout as this node lived it), ``heal_s``
    (first contact to one view, or detection to heal), ``split_s`` (detection to
    heal), ``within_bound`` (``suspect_to_dead_s`` within suspicion timeout + 3 s;
    null if the timeout is unknown)."""
    marks = traces.filter(F.col("kind").isin("partition_detected", "partition_healed"))
    w = Window.partitionBy("node").orderBy("ts_us", "kind")
    prev = marks.select("node", "ts_us", F.lag("ts_us").over(w).alias("prev_ts"))
    # A detector revises a partition (same id) when members join it late: the last
    # record of each (node, partition id) is the whole picture.
    last = (
        marks.filter(F.col("kind") == "partition_detected")
        .join(prev, ["node", "ts_us"])
        .groupBy("node", "subject")
        .agg(
            F.max(F.struct(
                F.col("ts_us").alias("detected_ts_us"),
                F.coalesce("peers", "subject").alias("peers"),
                "majority",
                F.col("took_us").alias("_took"),
                F.col("suspicion_us").alias("_susp"),
                F.coalesce("prev_ts", F.lit(-(2**62))).alias("_since"),
            )).alias("_d"),
            (F.countDistinct("ts_us") - 1).alias("revisions"),
        )
    )
    detected = last.select("node", "subject", "_d.*", "revisions")
    healed = (
        marks.filter(F.col("kind") == "partition_healed")
        .groupBy("node", "subject")
        .agg(F.min(F.struct("ts_us", "took_us")).alias("_h"))
        .select("node", "subject", F.col("_h.ts_us").alias("healed_ts_us"), F.col("_h.took_us").alias("_heal_took"))
    )
    suspects = traces.filter(
        (F.col("kind") == "member_suspect") & (F.col("origin") == F.col("node"))
    ).select(F.col("node").alias("_s_node"), F.col("ts_us").alias("_s_ts"), F.col("subject").alias("_s_subject"))
    members = F.filter(F.split(F.coalesce("peers", F.lit("")), r"[,\s]+"), lambda m: m != "")
    onset = (
        detected.filter(F.col("_took").isNull())
        .withColumn("_members", members)
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
    # per peer: first suspicion and the death this node recorded before concluding
    per_peer = (
        detected.select("node", "detected_ts_us", "_since", F.explode(members).alias("_peer"))
        .join(
            traces.filter(F.col("kind").isin("member_suspect", "member_dead")).select(
                F.col("node").alias("_m_node"), F.col("subject").alias("_peer"), F.col("kind").alias("_m_kind"),
                F.col("ts_us").alias("_m_ts"),
            ),
            "_peer",
        )
        .filter(
            (F.col("_m_node") == F.col("node")) & (F.col("_m_ts") > F.col("_since"))
            & (F.col("_m_ts") <= F.col("detected_ts_us"))
        )
        .groupBy("node", "detected_ts_us", "_peer")
        .agg(
            F.min(F.when(F.col("_m_kind") == "member_suspect", F.col("_m_ts"))).alias("_sus"),
            F.max(F.when(F.col("_m_kind") == "member_dead", F.col("_m_ts"))).alias("_dead"),
        )
        .groupBy("node", "detected_ts_us")
        # a death recorded before any suspicion (a dead rumour arriving first) says nothing
        .agg(F.max(F.when(F.col("_dead") >= F.col("_sus"), (F.col("_dead") - F.col("_sus")) / US)).alias("suspect_to_dead_s"))
    )
    detection = F.coalesce(F.col("_took") / US, (F.col("detected_ts_us") - F.col("onset_ts_us")) / US)
    split = (F.col("healed_ts_us") - F.col("detected_ts_us")) / US
    return (
        detected.join(onset, ["node", "detected_ts_us"], "left")
        .join(per_peer, ["node", "detected_ts_us"], "left")
        .join(healed, ["node", "subject"], "left")
        # a heal belongs to this detection only if it came after it
        .withColumn("healed_ts_us", F.when(F.col("healed_ts_us") >= F.col("detected_ts_us"), F.col("healed_ts_us")))
        .select(
            "node",
            "subject",
            "peers",
            "majority",
            "detected_ts_us",
            "healed_ts_us",
            detection.alias("detection_s"),
            "suspect_to_dead_s",
            F.when(F.col("healed_ts_us").isNotNull(), F.coalesce(F.col("_heal_took") / US, split)).alias("heal_s"),
            split.alias("split_s"),
            F.when(
                F.col("_susp").isNotNull() & F.col("suspect_to_dead_s").isNotNull(),
                F.col("suspect_to_dead_s") <= F.col("_susp") / US + BOUND_SLACK_S,
            ).alias("within_bound"),
            "revisions",
        )
    )

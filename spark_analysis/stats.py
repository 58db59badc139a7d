"""Percentiles: exact where the data is small, approximate (and said so) where not.

Exact percentiles use Spark's ``percentile`` (linear interpolation between the two
nearest ranks, like numpy's default). Groups above ``EXACT_LIMIT`` rows use
``percentile_approx`` with ``APPROX_ACCURACY`` (relative rank error 1/accuracy).
The coverage times t50..t100 of one event are nearest-rank and always exact: see
``dissemination.coverage_times``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

EXACT_LIMIT = 1_000_000
APPROX_ACCURACY = 10_000


def one_row(df: DataFrame) -> Row:
    """The row of an aggregate over a whole frame (Spark gives one even for no rows)."""
    row = df.first()
    if row is None:
        raise ValueError("an aggregate without grouping returned no row")
    return row


@dataclass(frozen=True)
class Method:
    """How one family of percentiles was computed; goes into summary.json."""

    exact: bool
    largest_group: int

    def describe(self) -> str:
        if self.exact:
            return "exact (linear interpolation)"
        return f"percentile_approx (accuracy {APPROX_ACCURACY})"

    def as_json(self) -> dict[str, object]:
        return {
            "method": "exact" if self.exact else "approx",
            "interpolation": "linear" if self.exact else None,
            "accuracy": None if self.exact else APPROX_ACCURACY,
            "largest_group_rows": self.largest_group,
        }


def choose_method(
    df: DataFrame, group_cols: list[str] | None = None, *, limit: int = EXACT_LIMIT
) -> Method:
    """Exact if every group (or the whole frame) has at most ``limit`` rows."""
    if group_cols:
        row = one_row(df.groupBy(*group_cols).count().agg(F.max("count")))
        largest = int(row[0] or 0)
    else:
        largest = df.count()
    return Method(exact=largest <= limit, largest_group=largest)


def pct(col: str | Column, p: float, method: Method) -> Column:
    """The p-quantile (0..1) of ``col`` in an aggregation, by ``method``; nulls ignored."""
    c = F.col(col) if isinstance(col, str) else col
    if method.exact:
        return F.percentile(c, F.lit(p))
    return F.percentile_approx(c, F.lit(p), APPROX_ACCURACY).cast("double")


def sorted_array_pct(arr: str | Column, p: float) -> Column:
    """Exact p-quantile with linear interpolation from a sorted array column.

    The same numbers as Spark's ``percentile``, from one ``sort_array(collect_list)``
    per group; far cheaper than ``percentile``'s per-group value-count maps.
    """
    a = F.col(arr) if isinstance(arr, str) else arr
    n = F.size(a)
    pos = F.lit(p) * (n - 1)
    lo = F.floor(pos).cast("int")
    frac = pos - lo
    a_lo = F.element_at(a, lo + 1)
    a_hi = F.element_at(a, F.least(lo + 2, n))
    return F.when(n > 0, a_lo + frac * (a_hi - a_lo))

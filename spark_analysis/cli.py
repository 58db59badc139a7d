"""`meshd report TRACE_PATH... --out DIR`: the command line of the analysis package.

``mesh/cli.py`` hands ``meshd report``'s arguments (without the word ``report``) to
``main``. pyspark is imported only once the arguments are parsed, so a machine
without the ``spark`` extra gets an install hint rather than a traceback.
"""

from __future__ import annotations

import argparse
import sys

from typing import TYPE_CHECKING

from .errors import ReportError, SparkMissingError

if TYPE_CHECKING:
    from .job import ReportResult

TRUTH_MISMATCH = 3  # exit status: the report's figures differ from the simulator's truth
INSTALL_HINT = "meshd report needs the spark extra: pip install 'meshd[spark]' (and Java 17+)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="meshd report",
        description="Convergence report (summary.json, report.html, CSV tables) over gossip traces.",
    )
    p.add_argument("paths", nargs="+", metavar="TRACE_PATH",
                   help="trace files or directories (JSON Lines, .gz, Parquet); any path Spark reads")
    p.add_argument("--out", required=True, metavar="DIR", help="local output directory")
    p.add_argument("--master", default="local[*]",
                   help="Spark master: local[*] (default), spark://host:7077, yarn, k8s://...")
    p.add_argument("--format", default="html,json,csv",
                   help="comma list of html, json, csv, parquet (default html,json,csv)")
    p.add_argument("--crash-grace", type=float, default=5.0, metavar="SECONDS",
                   help="real traces: a node silent this long before the end without "
                        "node_stop counts as crashed (default 5)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark configuration, repeatable (e.g. spark.driver.memory=8g)")
    return p


SMALL_INPUT_BYTES = 64 * 1024 * 1024
# Below this, whole-stage code generation compiles more than the rows repay. Above it
# the interpreted joins of a few hundred thousand rows cost more: a 200-node simulated
# run (21 MB) takes 24 CPU-seconds with it, 34 without.
CODEGEN_INPUT_BYTES = 4 * 1024 * 1024
BYTES_PER_SHUFFLE_PARTITION = 32 * 1024 * 1024
LOCAL_MAX_SHUFFLE_PARTITIONS = 8  # 10 M rows (1.7 GB) ran best with 8 on 2 cores
CLUSTER_MAX_SHUFFLE_PARTITIONS = 400


def shuffle_partitions(input_bytes: int, local: bool) -> int:
    """One shuffle partition per 32 MB of trace input: a small report is one task
    per stage, not 8 or 200 nearly empty ones."""
    wanted = -(-input_bytes // BYTES_PER_SHUFFLE_PARTITION)
    return max(1, min(wanted, LOCAL_MAX_SHUFFLE_PARTITIONS if local else CLUSTER_MAX_SHUFFLE_PARTITIONS))


def _spark_conf(pairs: list[str], master: str, input_bytes: int | None = None) -> dict[str, str]:
    conf: dict[str, str] = {}
    local = master.startswith("local")
    if local:
        # The embedded default caches the traces in the driver JVM; 1g (Spark's default)
        # is far too small for millions of rows (10 M rows need about 4 GB of heap).
        conf["spark.driver.memory"] = "6g"
        # Smaller input splits: enough tasks to keep every local core busy.
        conf["spark.sql.files.maxPartitionBytes"] = str(16 * 1024 * 1024)
    if input_bytes is not None:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions(input_bytes, local))
    if input_bytes is not None and input_bytes < SMALL_INPUT_BYTES:
        # A few MB of traces: the time goes into the JVMs compiling, not into the data.
        # The JIT's top tier costs more than it saves (the 200-node run: 45 CPU-seconds
        # with it, 24 without), and adaptive execution only adds planning passes.
        lean_jvm = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
        if input_bytes < CODEGEN_INPUT_BYTES:
            conf["spark.sql.codegen.wholeStage"] = "false"
        conf["spark.sql.adaptive.enabled"] = "false"
        conf["spark.default.parallelism"] = "1" if local else "2"
        conf["spark.driver.extraJavaOptions"] = lean_jvm
        if not local:
            conf["spark.executor.extraJavaOptions"] = lean_jvm
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ReportError(f"--conf expects KEY=VALUE, got {pair!r}")
        conf[key.strip()] = value.strip()
    return conf


def main(argv: list[str] | None = None) -> int:
    """Run the report; 0 on success, 2 on bad input (message on stderr)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: usage error or --help
        return int(exc.code or 0)
    try:
        try:
            from .job import parse_formats, run_report
            from .load import resolve_inputs
            from .session import build_session, finish_session
        except ImportError as exc:
            raise SparkMissingError(f"{INSTALL_HINT} ({exc})") from exc
        formats = parse_formats(args.format)
        inputs = resolve_inputs(args.paths)  # a wrong path fails here, before a JVM starts
        conf = _spark_conf(args.conf, args.master, inputs.local_bytes())
        spark = build_session(args.master, conf=conf, use_class_archive=True)
        try:
            result = run_report(
                spark,
                args.paths,
                args.out,
                formats=formats,
                crash_grace_us=int(args.crash_grace * 1e6),
            )
        finally:
            finish_session(spark)
    except ReportError as exc:
        print(f"meshd report: error: {exc}", file=sys.stderr)
        return 2
    return report_outcome(result)


def report_outcome(result: "ReportResult") -> int:
    """Say where the outputs are and how the report compares with the simulator's
    truth; 0, or ``TRUTH_MISMATCH`` when they differ."""
    print(f"meshd report: wrote {len(result.files)} file(s) to {result.out}", file=sys.stderr)
    html = result.out / "report.html"
    if html.exists():
        print(f"meshd report: open {html.resolve()}", file=sys.stderr)
    checked = result.summary.get("truth_check")
    if checked is not None:
        print_truth_check(checked)
        if not checked["ok"]:
            from .truth_check import disagreements

            print(f"meshd report: error: the report disagrees with the simulator's truth ({checked['file']}): "
                  + "; ".join(disagreements(checked)), file=sys.stderr)
            return TRUTH_MISMATCH
    return 0


def print_truth_check(checked: dict) -> None:
    """The report's figures next to the simulator's, one line each, on stderr."""
    print(f"meshd report: against the simulator's truth ({checked['file']}):", file=sys.stderr)
    width = max(len(r["figure"]) for r in checked["rows"])
    for r in checked["rows"]:
        mark = "ok" if r["ok"] else "DIFFERS"
        print(f"  {r['figure']:<{width}}  report {r['report']!s:>10}  truth {r['truth']!s:>10}  {mark}",
              file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

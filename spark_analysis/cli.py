"""`meshd report TRACE_PATH... --out DIR`: the command line of the analysis package.

``mesh/cli.py`` hands ``meshd report``'s arguments (without the word ``report``) to
``main``. pyspark is imported only once the arguments are parsed, so a machine
without the ``spark`` extra gets an install hint rather than a traceback.
"""

from __future__ import annotations

import argparse
import sys

from .errors import ReportError, SparkMissingError

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


def _spark_conf(pairs: list[str], master: str) -> dict[str, str]:
    conf: dict[str, str] = {}
    if master.startswith("local"):
        # The embedded default caches the traces in the driver JVM; 1g (Spark's default)
        # is far too small for millions of rows (10 M rows need about 4 GB of heap).
        conf["spark.driver.memory"] = "6g"
        # Smaller input splits: enough tasks to keep every local core busy.
        conf["spark.sql.files.maxPartitionBytes"] = str(16 * 1024 * 1024)
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
            from .session import build_session
        except ImportError as exc:
            raise SparkMissingError(f"{INSTALL_HINT} ({exc})") from exc
        formats = parse_formats(args.format)
        resolve_inputs(args.paths)  # a wrong path fails here, before a JVM starts
        conf = _spark_conf(args.conf, args.master)
        spark = build_session(args.master, conf=conf)
        result = run_report(
            spark,
            args.paths,
            args.out,
            formats=formats,
            crash_grace_us=int(args.crash_grace * 1e6),
        )
    except ReportError as exc:
        print(f"meshd report: error: {exc}", file=sys.stderr)
        return 2
    print(f"meshd report: wrote {len(result.files)} file(s) to {result.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Input edge cases: missing paths, empty folders, bad lines, schema mismatch, formats."""

from __future__ import annotations

import gzip
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gossip.trace import OPTIONAL_FIELDS, TRACE_FIELDS, trace_record
from spark_analysis import cli
from spark_analysis.errors import NoTracesError, SchemaMismatchError
from spark_analysis.load import load_traces, resolve_inputs

pytestmark = pytest.mark.spark


def _line(i: int) -> str:
    rec = trace_record(ts_us=1000 + i, node="n1", kind="broadcast", event_id=f"e{i}")
    return json.dumps(rec)


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(NoTracesError, match="no such file or directory"):
        resolve_inputs([str(tmp_path / "nope")])


def test_folder_without_trace_files_is_a_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(NoTracesError, match=r"no trace files \(\*\.jsonl"):
        resolve_inputs([str(tmp_path)])


def test_directories_find_live_rotated_gzip_and_parquet_files(tmp_path):
    for name in ("a.jsonl", "a.jsonl.1", "a.jsonl.12", "b.jsonl.gz", "c.parquet", "README", "summary.json"):
        (tmp_path / name).write_text("")
    inputs = resolve_inputs([str(tmp_path)])
    assert sorted(p.rsplit("/", 1)[1] for p in inputs.json_paths) == [
        "a.jsonl", "a.jsonl.1", "a.jsonl.12", "b.jsonl.gz",
    ]
    assert [p.rsplit("/", 1)[1] for p in inputs.parquet_paths] == ["c.parquet"]


def test_bad_lines_are_counted_and_skipped_gzip_included(spark, tmp_path):
    good = [_line(i) for i in range(3)]
    bad = [
        "{not json",
        "[1, 2]",
        json.dumps({**json.loads(_line(9)), "ts_us": "yesterday"}),  # wrong type
        json.dumps({**json.loads(_line(10)), "node": None}),  # required field null
    ]
    with gzip.open(tmp_path / "n1.jsonl.gz", "wt") as f:
        f.write("\n".join(good[:2] + bad[:2]) + "\n")
    (tmp_path / "n1.jsonl").write_text("\n".join(bad[2:] + good[2:]) + "\n")
    (tmp_path / "clean.jsonl").write_text(_line(3) + "\n")
    # decode_dir: clean.jsonl goes through pyarrow, the files with bad lines through Spark.
    loaded = load_traces(spark, [str(tmp_path)], decode_dir=tmp_path / "scratch")
    assert (loaded.rows, loaded.bad_lines) == (4, 4)
    assert sorted(r["event_id"] for r in loaded.traces.collect()) == ["e0", "e1", "e2", "e3"]


def test_json_that_is_not_traces_is_a_schema_mismatch(spark, tmp_path):
    (tmp_path / "x.jsonl").write_text('{"time": 1, "who": "a"}\n{"time": 2, "who": "b"}\n')
    with pytest.raises(SchemaMismatchError, match="ts_us missing"):
        load_traces(spark, [str(tmp_path / "x.jsonl")])


def test_only_garbage_lines_is_no_traces(spark, tmp_path):
    (tmp_path / "x.jsonl").write_text("garbage\nmore garbage\n")
    with pytest.raises(NoTracesError, match="no valid trace lines .2 bad"):
        load_traces(spark, [str(tmp_path)])


def test_parquet_input_and_parquet_schema_mismatch(spark, tmp_path):
    recs = [json.loads(_line(i)) for i in range(4)]
    table = pa.Table.from_pylist(recs)
    pq.write_table(table, tmp_path / "t.parquet")
    loaded = load_traces(spark, [str(tmp_path / "t.parquet")])
    assert loaded.rows == 4 and loaded.bad_lines == 0
    assert loaded.traces.columns == list(TRACE_FIELDS + OPTIONAL_FIELDS)

    pq.write_table(table.drop_columns(["ts_us"]), tmp_path / "u.parquet")
    with pytest.raises(SchemaMismatchError, match="lacks trace field.*ts_us"):
        load_traces(spark, [str(tmp_path / "u.parquet")])


def test_cli_reports_bad_path_with_exit_2(spark, tmp_path, capsys):
    assert cli.main([str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "meshd report: error:" in err and "no such file or directory" in err


def test_cli_rejects_unknown_format(spark, tmp_path, capsys):
    (tmp_path / "n.jsonl").write_text(_line(0) + "\n")
    assert cli.main([str(tmp_path), "--out", str(tmp_path / "o"), "--format", "html,pdf"]) == 2
    assert "unknown format(s) pdf" in capsys.readouterr().err


def test_cli_without_spark_says_how_to_install(monkeypatch, tmp_path, capsys):
    # A None entry in sys.modules makes the import fail as if pyspark were absent.
    monkeypatch.setitem(sys.modules, "spark_analysis.job", None)
    assert cli.main([str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "pip install 'meshd[spark]'" in capsys.readouterr().err

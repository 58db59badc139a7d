"""`meshd members` table formatting and its error paths."""

from __future__ import annotations

import pytest

from mesh.members import format_members, members_main


def test_format_members_table() -> None:
    out = format_members(
        [
            {"id": "n1", "address": "10.0.0.1:7946", "state": "alive", "incarnation": 0, "last_change_ts_us": 1_700_000_000_000_000},
            {"id": "node-two", "address": "10.0.0.2:7946", "state": "dead", "incarnation": 3, "last_change_ts_us": 0},
        ]
    )
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "ADDRESS", "STATE", "INCARNATION", "LAST", "CHANGE", "(UTC)"]
    assert lines[1].split()[:4] == ["n1", "10.0.0.1:7946", "alive", "0"] and "2023-11-14 22:13:20" in lines[1]
    assert lines[2].split() == ["node-two", "10.0.0.2:7946", "dead", "3", "-"]
    # columns line up
    assert lines[1].index("10.0.0.1") == lines[2].index("10.0.0.2") == lines[0].index("ADDRESS")
    assert lines[-1] == "2 members: 1 alive, 1 dead"


def test_members_unreachable_node_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support import free_port

    assert members_main(["--http", f"127.0.0.1:{free_port()}"]) == 1
    assert "cannot reach" in capsys.readouterr().err

"""Record tests/spark_analysis/data/real5: the traces of a real 5-node run.

Five `meshd` processes on 127.0.0.1 (gossip preset `local`, joined through n0),
converged; n3 is killed (SIGKILL: no node_stop), declared dead everywhere, started
again (it writes its own member_alive just before its node_start, the case the
report once counted as a false positive), seen alive everywhere; then all stop
gracefully.  Run from the repository root: ``python -m tests.spark_analysis.record_real5``.
The files are committed; the Spark tests read them (a report on real traces without
starting five processes in every test run)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from mesh.http_client import request_json
from tests.support import MeshdProcess, free_port, wait_for

OUT = Path(__file__).resolve().parent / "data" / "real5"
FLAGS = ("--gossip-preset", "local", "--trace")


def view(node: MeshdProcess) -> dict[str, str]:
    status, body = request_json(node.http_addr, "GET", "/api/v1/members")
    assert status == 200
    return {m["id"]: m["state"] for m in body["members"]}


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="real5-"))
    ports = [free_port() for _ in range(5)]

    def node(i: int) -> MeshdProcess:
        return MeshdProcess(str(base / f"n{i}"), *FLAGS, "--seed", f"127.0.0.1:{ports[0]}", http=True,
                            gossip_port=ports[i], node_id=f"n{i}")

    nodes = [node(i) for i in range(5)]
    ids = {f"n{i}" for i in range(5)}
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            wait_for(lambda n=n: {k for k, v in view(n).items() if v == "alive"} == ids, what="one view")
        # the trace writer flushes about once a second: let n3's first life reach the disk
        n3_traces = base / "n3" / "traces" / "n3.jsonl"
        wait_for(lambda: n3_traces.exists() and n3_traces.stat().st_size > 500, what="n3's traces on disk")
        nodes[3].kill()
        for n in nodes[:3] + nodes[4:]:
            wait_for(lambda n=n: view(n).get("n3") == "dead", what=f"{n.node_id} marks n3 dead")
        nodes[3] = node(3).start()
        for n in nodes:
            wait_for(lambda n=n: {k for k, v in view(n).items() if v == "alive"} == ids, what="n3 back")
        for n in nodes:
            assert n.stop() == 0  # graceful: node_stop
    finally:
        for n in nodes:
            n.__exit__()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for i in range(5):
        for f in (base / f"n{i}" / "traces").glob("*.jsonl*"):
            shutil.copy(f, OUT / f.name)
    shutil.rmtree(base)
    print(f"wrote {sorted(p.name for p in OUT.iterdir())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

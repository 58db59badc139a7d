"""Every `meshd simulate` example of the READMEs (the gossip simulator's) is run with
the `meshd report` example that reads its traces, as written there (paths moved under
a temporary folder), and the report must have every section filled and agree with the
simulator's truth.  The examples are parsed from the READMEs, so they stay in sync.

The session-handoff section needs MQTT clients, which only real nodes and
`meshd simulate --cluster` have: for the gossip simulator's runs that section must
say so instead.  Report examples on remote storage or placeholders (`hdfs://`,
`DATA_DIR`) document flags and are not run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from simulation.cli import simulate_main
from spark_analysis import cli
from spark_analysis.render import WHY_EMPTY

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
READMES = [ROOT / "README.md", ROOT / "spark_analysis" / "README.md"]
SECTIONS = ("dissemination", "detection", "declarations", "partitions", "lag")


def _commands(text: str) -> list[list[str]]:
    """`meshd ...` lines of the fenced shell blocks, comments dropped."""
    out: list[list[str]] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("meshd "):
                out.append(shlex.split(line, comments=True))
    return out


def examples() -> list[tuple[str, list[str], list[str]]]:
    """(README, simulate argv, report argv) for each gossip-simulator example."""
    pairs = []
    for readme in READMES:
        cmds = _commands(readme.read_text())
        reports = [c[2:] for c in cmds if c[1] == "report"]
        for c in cmds:
            if c[1] != "simulate" or "--cluster" in c:
                continue
            argv = c[2:]
            out = argv[argv.index("--out") + 1]
            readers = [r for r in reports if r and r[0].rstrip("/") == out.rstrip("/")]
            assert readers, f"{readme.name}: no `meshd report {out}` example after `{shlex.join(c)}`"
            pairs.append((readme.name, argv, readers[0]))
    return pairs


EXAMPLES = examples()


def test_the_readmes_have_examples_to_run():
    assert len(EXAMPLES) >= 2 and all("--crash" in argv and "--partition" in argv for _, argv, _ in EXAMPLES)


def _moved(argv: list[str], base: Path) -> list[str]:
    # /tmp/sim, sim/ ... -> under base, the same name
    return [str(base / a.strip("/").replace("/", "_")) if a.startswith("/tmp/") or a.endswith("/") else a
            for a in argv]


@pytest.mark.parametrize("readme, sim_argv, report_argv", EXAMPLES,
                         ids=[f"{r}:{' '.join(s[:4])}" for r, s, _ in EXAMPLES])
def test_readme_example_fills_every_section(spark, tmp_path, capsys, readme, sim_argv, report_argv):
    assert simulate_main(_moved(sim_argv, tmp_path) + ["--no-progress"]) == 0
    report = _moved(report_argv, tmp_path)
    assert cli.main(report) == 0, capsys.readouterr().err  # 3 would be: disagrees with the truth
    out = Path(report[report.index("--out") + 1])
    page = (out / "report.html").read_text()
    empty = re.findall(r"class=empty data-section=([\w-]+)", page)
    assert [s for s in empty if s in SECTIONS] == [], f"{readme}: empty sections {empty}"
    assert "agrees with the simulator" in page
    # the gossip simulator has no MQTT clients: the page says where handoffs come from
    assert empty == ["handoffs"] and WHY_EMPTY["handoffs"].split(":")[0] in page

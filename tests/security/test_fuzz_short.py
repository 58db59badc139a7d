"""A short run of scripts/fuzz_decoders.py in the suite (the 1M-input run is by hand)."""

from __future__ import annotations

import importlib.util
import random
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_decoders.py"
spec = importlib.util.spec_from_file_location("fuzz_decoders", SCRIPT)
fuzz = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fuzz)


@pytest.mark.parametrize("target", ["mqtt", "gossip", "links"])
def test_decoders_raise_only_their_own_errors(target):
    run = {"mqtt": fuzz.fuzz_mqtt, "gossip": fuzz.fuzz_gossip, "links": fuzz.fuzz_links}[target]
    done, bad = run(random.Random(7), 5000, time.monotonic() + 60)
    assert done == 5000
    assert bad == []

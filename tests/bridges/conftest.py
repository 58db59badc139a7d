from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.bridges.mosquitto import Mosquitto


@pytest.fixture
def mosquitto(tmp_path: Any) -> Iterator[Mosquitto]:
    broker = Mosquitto(str(tmp_path / "mosquitto")).start()
    yield broker
    broker.stop()

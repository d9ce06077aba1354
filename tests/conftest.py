from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture
def influxdb(tmp_path):
    from tests.servers import InfluxDB1

    with InfluxDB1(tmp_path / "influx") as server:
        yield server


@pytest.fixture
def victoria(tmp_path):
    from tests.servers import VictoriaMetrics

    with VictoriaMetrics(tmp_path / "vm") as server:
        yield server
